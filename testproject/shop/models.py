"""The shop's one model: an order that the payments service charges."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order to charge.

    ``status`` moves ``pending`` -> ``paid`` when the payments service accepts the charge,
    or ``pending``/``queued`` -> ``queued`` when the breaker's fallback parks it for a
    later attempt (the upstream failed, or the breaker refused to call it).
    """

    PENDING = "pending"
    PAID = "paid"
    QUEUED = "queued"
    STATUS_CHOICES = [
        (PENDING, "Pending"),
        (PAID, "Paid"),
        (QUEUED, "Queued for a later attempt"),
    ]

    amount_cents = models.PositiveIntegerField(help_text="Amount to charge, in cents.")
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PENDING, db_index=True)
    charge_id = models.CharField(max_length=64, blank=True, help_text="Id the payments service gave the charge.")
    attempts = models.PositiveIntegerField(default=0, help_text="Charge attempts made through the shop.")
    last_error = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.amount_cents / 100:.2f}, {self.status})"

    def as_dict(self) -> dict:
        """JSON-ready view of the order."""
        return {
            "id": self.pk,
            "amount_cents": self.amount_cents,
            "status": self.status,
            "charge_id": self.charge_id,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }
