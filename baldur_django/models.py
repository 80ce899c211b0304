"""Django models of the operator surface.

* :class:`Breaker` has no table (``managed = False``). It gives the breaker list a place
  in the admin (``/admin/baldur_django/breaker/``) and carries the permission
  ``baldur_django.force_circuit`` that gates every force and release from the admin.
* :class:`BreakerAudit` is the audit trail: one row per breaker per operator action
  (force open, force closed, release, forget), and one per Emergency Mode level change,
  whatever surface it came from. Rows are written by the bus listener of
  :func:`baldur_django.services.install_audit_listener` (a forget's by
  :func:`baldur_django.services.forget` itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .backends.models import BreakerLock, BreakerRecord, GateEnd  # tables of the database backend

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["Breaker", "BreakerAudit", "BreakerRecord", "BreakerLock", "GateEnd", "FORCE_PERMISSION"]

#: The permission an admin user needs to force or release a breaker.
FORCE_PERMISSION = "baldur_django.force_circuit"


class Breaker(models.Model):
    """A circuit breaker as the admin lists it. No table: rows come from
    :func:`baldur_django.services.status_rows`, never from the database.

    Carries the permission ``force_circuit`` ("Can force circuit breakers open or
    closed") and only a ``view`` default permission.
    """

    service: models.CharField[str, str] = models.CharField(_("service"), max_length=255, primary_key=True)

    class Meta:
        managed = False
        verbose_name = _("circuit breaker")
        verbose_name_plural = _("circuit breakers")
        default_permissions = ("view",)
        permissions = [("force_circuit", "Can force circuit breakers open or closed")]

    def __str__(self) -> str:
        return self.service


class BreakerAudit(models.Model):
    """One operator action on one breaker.

    Fields:
        at: when the action took effect (aware datetime).
        actor: who did it: the admin user name, ``command:<OS user>``, or what an API
            caller passed as ``actor`` (empty when none was given).
        action: ``open`` (force open), ``close`` (force closed), ``release``, ``forget``
            (removed from the shared record and registry), or for Emergency Mode
            ``level_set`` / ``level_step_down``.
        service: the breaker's name (empty for an emergency level change: it concerns all).
        ttl_minutes: lifetime of a force or level in minutes (None for a release).
        expires_at: when the force or level lapses on its own (None for a release).
        reason: free text given with the action.
        source: ``admin``, ``command``, ``api``, or ``task`` (the meta-watchdog and the
            auto-activation).
        from_state / to_state: the breaker's state before and after (``"level N"`` for
            Emergency Mode).
        dry_run: the action happened while ``BALDUR_DRY_RUN`` was on.
    """

    class Action(models.TextChoices):
        OPEN = "open", _("force open")
        CLOSE = "close", _("force closed")
        RELEASE = "release", _("release")
        FORGET = "forget", _("forget")
        LEVEL_SET = "level_set", _("set emergency level")
        LEVEL_STEP_DOWN = "level_step_down", _("step down emergency level")

    class Source(models.TextChoices):
        ADMIN = "admin", _("admin")
        COMMAND = "command", _("management command")
        API = "api", _("API")
        TASK = "task", _("background task")

    at: models.DateTimeField[datetime, datetime] = models.DateTimeField(_("when"), default=timezone.now, db_index=True)
    actor: models.CharField[str, str] = models.CharField(_("who"), max_length=150, blank=True, default="")
    action: models.CharField[str, str] = models.CharField(_("action"), max_length=16, choices=Action.choices)
    service: models.TextField[str, str] = models.TextField(_("service"))
    ttl_minutes: models.FloatField[float | None, float | None] = models.FloatField(
        _("lifetime (minutes)"), null=True, blank=True
    )
    expires_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        _("expires at"), null=True, blank=True
    )
    reason: models.TextField[str, str] = models.TextField(_("reason"), blank=True, default="")
    source: models.CharField[str, str] = models.CharField(
        _("source"), max_length=16, choices=Source.choices, default=Source.API
    )
    from_state: models.CharField[str, str] = models.CharField(_("state before"), max_length=16, blank=True, default="")
    to_state: models.CharField[str, str] = models.CharField(_("state after"), max_length=16, blank=True, default="")
    dry_run: models.BooleanField[bool, bool] = models.BooleanField(_("dry-run"), default=False)

    class Meta:
        verbose_name = _("breaker audit entry")
        verbose_name_plural = _("breaker audit entries")
        ordering = ("-at", "-id")
        default_permissions = ("view",)

    if TYPE_CHECKING:  # Django adds it for a field with choices

        def get_action_display(self) -> str: ...

    def __str__(self) -> str:
        who = self.actor or "?"
        return f"{self.get_action_display()} {self.service} by {who}"
