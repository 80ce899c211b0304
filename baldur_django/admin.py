"""Django admin for breakers: a live list, permission-gated force/release actions with a
confirmation page, and the read-only audit.

The list lives at ``admin/baldur_django/breaker/``. It is the changelist of the
table-less :class:`~baldur_django.models.Breaker` model, replaced by a view that reads one
page of :func:`baldur_django.services.status_page` (100 breakers a page, ``?p=N`` as in
Django's changelists; only the page's records are read from the store and no breaker is
created). Selecting breakers and an action leads to a
confirmation page (as Django's "delete selected") asking for the lifetime in minutes and a
reason; confirming calls :func:`baldur_django.services.force`,
:func:`~baldur_django.services.release` or :func:`~baldur_django.services.forget` (removes
the breaker from the shared record and registry; refused while forced) with
``source="admin"`` and the user name as actor.
Acting needs ``baldur_django.force_circuit``; seeing the list needs ``view_breaker`` or
that permission. On the memory backend the page says it acts on its own process only.

While an Emergency Mode level is in force the page shows it with its expiry; holders of
``baldur_django.force_circuit`` can set the level or step it down on a confirmation page
(``admin/baldur_django/breaker/emergency/``), audited like a force.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from . import services
from .core.errors import BaldurError, ConfigError
from .core.registry import registry
from .forms import EmergencyLevelForm, ForceForm, ReleaseForm, StepDownForm
from .models import FORCE_PERMISSION, Breaker, BreakerAudit

if TYPE_CHECKING:  # django-stubs makes ModelAdmin generic; at run time it takes no subscript
    _BreakerModelAdmin = admin.ModelAdmin[Breaker]
    _AuditModelAdmin = admin.ModelAdmin[BreakerAudit]
else:
    _BreakerModelAdmin = _AuditModelAdmin = admin.ModelAdmin

__all__ = ["BreakerAdmin", "BreakerAuditAdmin", "BREAKER_ACTIONS"]

#: action name -> (force mode, None for release or ``"forget"``, label, button text)
BREAKER_ACTIONS: dict[str, tuple[str | None, Any, Any]] = {
    "force_open": ("open", gettext_lazy("Force open selected breakers"), gettext_lazy("Yes, force open")),
    "force_close": ("close", gettext_lazy("Force closed selected breakers"), gettext_lazy("Yes, force closed")),
    "release": (None, gettext_lazy("Release selected breakers (back to automatic)"), gettext_lazy("Yes, release")),
    "forget": (
        "forget",
        gettext_lazy("Forget selected breakers (remove from the shared record and registry)"),
        gettext_lazy("Yes, forget"),
    ),
}


def _when(timestamp: float | None) -> dt.datetime | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def _display_row(row: dict[str, Any]) -> dict[str, Any]:
    shown = dict(row)
    shown["opened_at_dt"] = _when(row.get("opened_at"))
    shown["force_expires_dt"] = _when(row.get("force_expires_at"))
    expires = row.get("force_expires_at")
    # measured on the breakers' own clock, so the countdown agrees with when the force lapses
    shown["force_left"] = _duration(expires - registry.clock.wall()) if expires is not None else None
    shown["state_label"] = str(row.get("state", "")).replace("_", "-")
    # how long the current open lasts (backed off on repeated opens)
    duration = row.get("open_duration")
    shown["open_for"] = _duration(duration) if row.get("state") == "open" and duration is not None else None
    # the outbound stages' knobs and this process's figures (breakers with stages only)
    shown["stage_lines"] = services.stage_lines(row["stages"]) if row.get("stages") else None
    return shown


class ReadOnlyAdminMixin:
    """Nothing is added, changed or deleted through these admin pages (breakers change only
    through the force actions; the audit is append-only)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Breaker)
class BreakerAdmin(ReadOnlyAdminMixin, _BreakerModelAdmin):
    """The breaker list and its force/release actions. See the module docstring."""

    actions = None  # the three actions are handled by this admin's own views
    list_per_page = services.PAGE_SIZE  # rows per page, read from the store a page at a time
    list_template = "admin/baldur_django/breaker/change_list.html"
    confirm_template = "admin/baldur_django/breaker/confirm_action.html"

    # ------------------------------------------------------------------ permissions
    def has_force_circuit_permission(self, request: HttpRequest) -> bool:
        """True when the user may force and release breakers (``baldur_django.force_circuit``)."""
        user: Any = request.user  # AUTH_USER_MODEL, whatever it is (the admin needs has_perm)
        allowed: bool = user.is_active and user.has_perm(FORCE_PERMISSION)
        return allowed

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_force_circuit_permission(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or self.has_force_circuit_permission(request)

    # ------------------------------------------------------------------------- urls
    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [
            path(
                "emergency/",
                self.admin_site.admin_view(self.emergency_view),
                name=f"{self.opts.app_label}_{self.opts.model_name}_emergency",
            ),
            path("", self.admin_site.admin_view(self.changelist_view), name=name),
        ]

    def _emergency_url(self) -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_emergency")

    @staticmethod
    def _emergency_context() -> dict[str, Any]:
        status = services.emergency_status()
        expires = status.get("expires_at")
        return {
            "emergency": status,
            "emergency_meaning": services.LEVEL_MEANINGS.get(status["level"], ""),
            "emergency_expires_dt": _when(expires) if status["level"] else None,
            "emergency_left": _duration(expires - registry.clock.wall()) if status["level"] and expires else None,
        }

    def _list_url(self) -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist")

    # ------------------------------------------------------------------------ views
    def _page_number(self, request: HttpRequest) -> int:
        """The 1-based page of ``?p=`` (as Django's changelists); a value that is not a
        page number shows page 1 with a warning naming it."""
        raw = request.GET.get(PAGE_VAR)
        if raw is None:
            return 1
        try:
            number = int(raw)
        except ValueError:
            number = 0
        if number < 1:
            self.message_user(
                request, _("%(page)r is not a page number: showing page 1.") % {"page": raw}, messages.WARNING
            )
            return 1
        return number

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """GET: the breaker list. POST: an action (confirmation page, then the change)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._action_view(request)
        number = self._page_number(request)
        try:
            page_rows, total = services.status_page((number - 1) * self.list_per_page, self.list_per_page)
            if not page_rows and number > 1:  # past the last page: show the last one
                last = max(1, (total - 1) // self.list_per_page + 1)
                self.message_user(
                    request,
                    _("Page %(page)d does not exist: showing the last page, %(last)d.")
                    % {"page": number, "last": last},
                    messages.WARNING,
                )
                number = last
                page_rows, total = services.status_page((number - 1) * self.list_per_page, self.list_per_page)
            rows = [_display_row(row) for row in page_rows]
            backend, shared, problem = services.backend_name(), services.is_shared_backend(), None
        except ConfigError as exc:
            rows, total, backend, shared, problem = [], 0, "?", False, str(exc)
        paginator = Paginator(range(total), self.list_per_page)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Circuit breakers"),
            "subtitle": None,
            "opts": self.opts,
            "rows": rows,
            "total": total,
            "page_number": number,
            "first_row": (number - 1) * self.list_per_page + 1 if rows else 0,
            "last_row": (number - 1) * self.list_per_page + len(rows),
            "pagination_required": paginator.num_pages > 1,
            "page_range": list(paginator.get_elided_page_range(number, on_each_side=3, on_ends=2))
            if paginator.num_pages > 1
            else [],
            "page_var": PAGE_VAR,
            "ellipsis": Paginator.ELLIPSIS,
            "backend": backend,
            "shared_backend": shared,
            "config_problem": problem,
            "TIME_ZONE_NAME": timezone.get_current_timezone_name(),
            "can_force": self.has_force_circuit_permission(request),
            "action_choices": [(key, label) for key, (_mode, label, _button) in BREAKER_ACTIONS.items()],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "audit_url": reverse(f"{self.admin_site.name}:baldur_django_breakeraudit_changelist"),
            "emergency_url": self._emergency_url(),
            **self._emergency_context(),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.list_template, context)

    def _action_view(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        if action not in BREAKER_ACTIONS:
            self.message_user(request, _("No action selected."), messages.WARNING)
            return HttpResponseRedirect(self._list_url())
        if not self.has_force_circuit_permission(request):
            raise PermissionDenied
        selected = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
        if not selected:
            self.message_user(
                request,
                _("Items must be selected in order to perform actions on them. No items have been changed."),
                messages.WARNING,
            )
            return HttpResponseRedirect(self._list_url())
        registered = set(services.status_names())  # the names only: no record, no breaker
        unknown = [name for name in selected if name not in registered]
        if unknown:
            self.message_user(
                request,
                _("Unknown breaker(s): %(names)s. Nothing was changed.") % {"names": ", ".join(unknown)},
                messages.ERROR,
            )
            return HttpResponseRedirect(self._list_url())
        mode, label, button = BREAKER_ACTIONS[action]
        known = {row["service"]: row for row in services.status_rows_for(selected)}  # the selected records only
        form_class = ReleaseForm if mode in (None, "forget") else ForceForm
        if request.POST.get("post") == "yes":
            form = form_class(request.POST)
            if form.is_valid():
                self._perform(request, selected, mode, form.cleaned_data)
                return HttpResponseRedirect(self._list_url())
        else:
            form = form_class()
        context = {
            **self.admin_site.each_context(request),
            "title": label,
            "subtitle": None,
            "opts": self.opts,
            "action": action,
            "mode": mode,
            "button": button,
            "form": form,
            "rows": [_display_row(known[name]) for name in selected],
            "backend": services.backend_name(),
            "shared_backend": services.is_shared_backend(),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.confirm_template, context)

    def emergency_view(self, request: HttpRequest) -> HttpResponse:
        """Set or step down the Emergency Mode level on a confirmation page.

        ``?action=set`` (default) asks for the level, a lifetime in minutes and a reason;
        ``?action=step_down`` asks for a confirmation. Needs ``baldur_django.force_circuit``;
        the change is audited with source ``admin`` and the user name as actor.
        """
        if not self.has_force_circuit_permission(request):
            raise PermissionDenied
        action = request.POST.get("action") or request.GET.get("action") or "set"
        if action not in ("set", "step_down"):
            action = "set"
        form_class = StepDownForm if action == "step_down" else EmergencyLevelForm
        if request.method == "POST" and request.POST.get("post") == "yes":
            form = form_class(request.POST)
            if form.is_valid():
                self._perform_emergency(request, action, form.cleaned_data)
                return HttpResponseRedirect(self._list_url())
        else:
            form = form_class()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Step down the emergency level") if action == "step_down" else _("Set the emergency level"),
            "subtitle": None,
            "opts": self.opts,
            "action": action,
            "form": form,
            "button": _("Yes, step down") if action == "step_down" else _("Yes, set the level"),
            "backend": services.backend_name(),
            "shared_backend": services.is_shared_backend(),
            **self._emergency_context(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/baldur_django/breaker/confirm_emergency.html", context)

    def _perform_emergency(self, request: HttpRequest, action: str, data: dict[str, Any]) -> None:
        actor = request.user.get_username()
        try:
            if action == "step_down":
                status = services.step_down_emergency(actor=actor, source="admin")
                if not status["changed"]:
                    self.message_user(request, _("The emergency level is 0: nothing to step down."), messages.INFO)
                    return
                self.message_user(
                    request,
                    _("Emergency level stepped down from %(previous)d to %(level)d.")
                    % {"previous": status["previous"], "level": status["level"]},
                    messages.SUCCESS,
                )
                return
            status = services.set_emergency_level(
                data["level"], data.get("minutes"), reason=data.get("reason", ""), actor=actor, source="admin"
            )
        except BaldurError as exc:
            self.message_user(
                request, _("The emergency level was not changed: %(error)s") % {"error": exc}, messages.ERROR
            )
            return
        if status["level"]:
            self.message_user(
                request,
                _("Emergency level %(level)d is in force until %(until)s.")
                % {
                    "level": status["level"],
                    "until": timezone.localtime(_when(status["expires_at"])).strftime("%Y-%m-%d %H:%M:%S %Z"),
                },
                messages.SUCCESS,
            )
        else:
            self.message_user(request, _("The emergency level is cleared (0)."), messages.SUCCESS)

    def _perform(self, request: HttpRequest, selected: list[str], mode: str | None, data: dict[str, Any]) -> None:
        actor = request.user.get_username()
        reason = data.get("reason", "")
        if mode == "forget":
            self._forget(request, selected, actor, reason)
            return
        done: list[str] = []
        unchanged: list[str] = []
        for name in selected:
            try:
                if mode is None:
                    (done if services.release(name, actor=actor, source="admin", reason=reason) else unchanged).append(
                        name
                    )
                else:
                    services.force(name, mode, data["ttl_minutes"], reason=reason, actor=actor, source="admin")
                    done.append(name)
            except BaldurError as exc:
                self.message_user(
                    request, _("%(name)s: not changed: %(error)s") % {"name": name, "error": exc}, messages.ERROR
                )
        if mode is None:
            if done:
                self.message_user(
                    request,
                    ngettext(
                        "Released %(count)d breaker: %(names)s.", "Released %(count)d breakers: %(names)s.", len(done)
                    )
                    % {"count": len(done), "names": ", ".join(done)},
                    messages.SUCCESS,
                )
            if unchanged:
                self.message_user(
                    request,
                    ngettext(
                        "%(count)d breaker was not forced, nothing changed: %(names)s.",
                        "%(count)d breakers were not forced, nothing changed: %(names)s.",
                        len(unchanged),
                    )
                    % {"count": len(unchanged), "names": ", ".join(unchanged)},
                    messages.INFO,
                )
        elif done:
            what = _("open") if mode == "open" else _("closed")
            self.message_user(
                request,
                ngettext(
                    "Forced %(count)d breaker %(what)s for %(ttl)g minutes: %(names)s.",
                    "Forced %(count)d breakers %(what)s for %(ttl)g minutes: %(names)s.",
                    len(done),
                )
                % {"count": len(done), "what": what, "ttl": data["ttl_minutes"], "names": ", ".join(done)},
                messages.SUCCESS,
            )

    def _forget(self, request: HttpRequest, selected: list[str], actor: str, reason: str) -> None:
        """Forget each selected breaker through :func:`services.forget`; a forced one is refused."""
        done: list[str] = []
        for name in selected:
            try:
                services.forget(name, actor=actor, source="admin", reason=reason)
                done.append(name)
            except BaldurError as exc:
                self.message_user(
                    request, _("%(name)s: not forgotten: %(error)s") % {"name": name, "error": exc}, messages.ERROR
                )
        if done:
            self.message_user(
                request,
                ngettext("Forgot %(count)d breaker: %(names)s.", "Forgot %(count)d breakers: %(names)s.", len(done))
                % {"count": len(done), "names": ", ".join(done)},
                messages.SUCCESS,
            )


@admin.register(BreakerAudit)
class BreakerAuditAdmin(ReadOnlyAdminMixin, _AuditModelAdmin):
    """Read-only audit of every force and release."""

    actions = None
    list_display = ("at", "actor", "action", "service", "ttl_minutes", "expires_at", "source", "short_reason")
    list_filter = ("action", "source", "dry_run")
    search_fields = ("service", "actor", "reason")
    date_hierarchy = "at"
    readonly_fields = (
        "at",
        "actor",
        "action",
        "service",
        "ttl_minutes",
        "expires_at",
        "reason",
        "source",
        "from_state",
        "to_state",
        "dry_run",
    )
    fields = readonly_fields

    @admin.display(description=gettext_lazy("reason"))
    def short_reason(self, obj: BreakerAudit) -> str:
        return obj.reason if len(obj.reason) <= 80 else obj.reason[:79] + "…"
