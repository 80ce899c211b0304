"""URLs of the inbound-side tests (ROOT_URLCONF while they run)."""

from django.urls import path

from . import views

urlpatterns = [
    path("status/<int:code>/", views.status),
    path("astatus/<int:code>/", views.astatus),
    path("payments/status/<int:code>/", views.status),
    path("payments/refunds/status/<int:code>/", views.status),
    path("relay/", views.relay),
    path("arelay/", views.arelay),
    path("boom/", views.boom),
    path("aboom/", views.aboom),
    path("stream/<int:code>/", views.stream),
    path("api/items/", views.ThrottledApi.as_view()),
    path("api/mine/", views.UserThrottledApi.as_view()),
    path("api/scoped/", views.ScopedApi.as_view()),
    path("api/unknown-wait/", views.UnknownWaitApi.as_view()),
    path("limited/status/<int:code>/", views.status),
    path("limited/astatus/<int:code>/", views.astatus),
    path("limited/relay/", views.relay),
    path("open/status/<int:code>/", views.status),
]
