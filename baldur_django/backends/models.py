"""Tables of the ``database`` state backend. Imported by ``models.py``."""

from __future__ import annotations

from django.db import models

__all__ = ["BreakerRecord", "BreakerLock", "GateEnd"]


class BreakerRecord(models.Model):
    """The shared record of one breaker, as JSON text (never pickle), plus its registry entry.

    ``key`` is :func:`baldur_django.core.stores.base.safe_key` of the name, so long or odd
    names never collide; ``last_seen`` is the database clock's Unix time.
    """

    key: models.CharField[str, str] = models.CharField(max_length=80, unique=True)
    name: models.TextField[str, str] = models.TextField()
    record: models.TextField[str, str] = models.TextField(default="")
    last_seen: models.FloatField[float, float] = models.FloatField(default=0.0, db_index=True)

    class Meta:
        verbose_name = "shared breaker record"
        default_permissions = ()

    def __str__(self) -> str:
        return self.name


class BreakerLock(models.Model):
    """An expiring fleet-wide lock (Celery tasks)."""

    name: models.CharField[str, str] = models.CharField(max_length=120, unique=True)
    token: models.CharField[str, str] = models.CharField(max_length=64)
    expires_at: models.FloatField[float, float] = models.FloatField()

    class Meta:
        verbose_name = "fleet lock"
        default_permissions = ()


class GateEnd(models.Model):
    """Where a service's Retry-After gate ends for the whole fleet: ``until`` is the
    database clock's Unix time (a past one: the gate is open). ``key`` is
    :func:`baldur_django.core.stores.base.safe_key` of the breaker's name."""

    key: models.CharField[str, str] = models.CharField(max_length=80, unique=True)
    name: models.TextField[str, str] = models.TextField()
    until: models.FloatField[float, float] = models.FloatField()

    class Meta:
        verbose_name = "Retry-After gate"
        default_permissions = ()

    def __str__(self) -> str:
        return self.name
