"""Admin for orders (read the statuses the demo leaves behind)."""

from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "amount_cents", "status", "attempts", "charge_id", "last_error", "updated_at")
    list_filter = ("status",)
    search_fields = ("charge_id", "last_error")
