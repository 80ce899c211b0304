from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The inbound-side demo API (``/api/``): throttled, rate-limited and relaying views."""

    name = "testproject.api"
    label = "testproject_api"
    verbose_name = "Inbound API demo"
