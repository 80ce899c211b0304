"""A readiness endpoint and a django-health-check backend built on the breakers.

Add ``"baldur_django.contrib.health"`` to ``INSTALLED_APPS`` and route the view::

    from baldur_django.contrib import health

    urlpatterns = [path("health/ready/", health.health_view)]

The judgement, shared by :func:`health_view` and :class:`BreakerHealthCheck`:

* ``"down"`` (HTTP 503): a breaker named in ``BALDUR_HEALTH_CRITICAL_SERVICES`` is OPEN
  (forced open included);
* ``"degraded"`` (HTTP 200): a critical breaker is HALF_OPEN (probing its way back), any
  other breaker this process knows is OPEN, or an Emergency level (1, 2 or 3) is in force:
  the instance still serves, with something impaired. A level is an operator's decision
  for the whole fleet, never a reason to take every instance out of rotation;
* ``"ok"`` (HTTP 200): none of these.

A breaker outside the critical list never takes the instance out of rotation: its callers
get a refusal or a fallback, which the instance survives. Anonymous callers see only
``status`` and ``emergency_level``; staff users (``request.user.is_staff``), or everyone
when ``BALDUR_HEALTH_DETAILS`` is on, also see ``breakers`` (every breaker this process
knows plus the critical ones, name -> state), ``critical`` (the list), ``store`` (what
became of the store read, see :class:`Judgement`) and, when a breaker of this process has
outbound stages, ``stages`` (name -> their knobs, this process's figures and refusals by
reason, read without store I/O).

The view answers within a probe's timeout whatever the store does (:mod:`.reading`): the
level and the critical breakers' shared records are read once, in a worker thread, with a
deadline (half a second by default); every other breaker is judged from this process's
own view without store I/O; a read that does not come back leaves the process's own view
of everything, and ``store`` says so. A level set or cleared on the same host or Redis
shows within half a second. Reading the states never takes a trial slot.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils.cache import add_never_cache_headers
from django.utils.log import log_response
from django.views.decorators.http import require_safe

from ...core import emergency as emergency_core
from ...core.breaker import CircuitBreaker
from ...core.config import settings
from ...core.registry import registry
from ...core.stages.figures import stage_section
from ...core.states import CircuitState
from .reading import NO_ANSWER, NO_STORE, Reading, read

__all__ = ["Judgement", "judge", "health_view", "stage_details", "BreakerHealthCheck", "CHECK_PATH"]

#: The dotted path of :class:`BreakerHealthCheck`, for django-health-check's ``checks`` lists.
CHECK_PATH = "baldur_django.contrib.health.BreakerHealthCheck"

OK, DEGRADED, DOWN = "ok", "degraded", "down"


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What the breakers say about this instance.

    Attributes:
        status (str): ``"ok"``, ``"degraded"`` or ``"down"``.
        emergency_level (int): the Emergency level in force, 0-3.
        breakers (dict[str, str]): name -> state value (``"closed"``, ``"open"``,
            ``"half_open"``) of every known breaker and every critical one.
        critical (tuple[str, ...]): the critical services.
        reasons (tuple[str, ...]): why the status is not ``"ok"``, one line each.
        store (str): what became of the store read: ``"none"`` (no shared store or no
            critical breaker), ``"answered"``, ``"failed"`` or ``"no answer"`` (not back
            within the timeout). Unless ``"answered"`` or ``"none"``, the states are this
            process's own view.
    """

    status: str
    emergency_level: int
    breakers: dict[str, str]
    critical: tuple[str, ...]
    reasons: tuple[str, ...]
    store: str = NO_STORE

    @property
    def http_status(self) -> int:
        """503 when ``"down"``, else 200."""
        return 503 if self.status == DOWN else 200


def judge(critical: list[str] | tuple[str, ...] | None = None, *, timeout: float | None = None) -> Judgement:
    """Judge this instance from its breakers and the Emergency level.

    Reads the level and the critical breakers' shared records once, in a worker thread, and
    waits for that read at most *timeout* seconds (see :mod:`.reading`); every other breaker
    is judged from this process's own view, without store I/O.

    Args:
        critical: the critical services; None reads ``BALDUR_HEALTH_CRITICAL_SERVICES``.
        timeout: seconds to wait for the read; None uses
            :data:`~baldur_django.contrib.health.reading.READ_TIMEOUT_SECONDS`.

    Returns:
        Judgement: see the module docstring for the rules.

    Raises:
        ConfigError: a bad ``BALDUR_HEALTH_CRITICAL_SERVICES``.
    """
    names = tuple(settings.get("BALDUR_HEALTH_CRITICAL_SERVICES") if critical is None else critical)
    for name in names:
        registry.get(name)  # registered here, so the read and the local view both know it
    reading = read(names, timeout)
    if reading is None:
        reading = Reading(emergency_core.mode.known_level(), {}, NO_ANSWER)
    states = {breaker.name: _own_view(breaker) for breaker in registry}
    states.update(reading.states)
    down: list[str] = []
    degraded: list[str] = []
    if reading.level:
        degraded.append(f"Emergency Level {reading.level} is in force")
    for name, state in sorted(states.items()):
        if name in names and state is CircuitState.OPEN:
            down.append(f"critical breaker {name!r} is OPEN")
        elif name in names and state is CircuitState.HALF_OPEN:
            degraded.append(f"critical breaker {name!r} is HALF_OPEN")
        elif state is CircuitState.OPEN:
            degraded.append(f"breaker {name!r} is OPEN")
    status = DOWN if down else DEGRADED if degraded else OK
    return Judgement(
        status=status,
        emergency_level=reading.level,
        breakers={name: state.value for name, state in sorted(states.items())},
        critical=names,
        reasons=tuple(down + degraded),
        store=reading.store,
    )


def _own_view(breaker: CircuitBreaker) -> CircuitState:
    """The state this process holds for *breaker*, without store I/O: a breaker that shares
    a store answers the state it last adopted (reading ``state`` never consults the store)."""
    return breaker.state


def stage_details() -> dict[str, dict[str, Any]]:
    """name -> the stages' section (:func:`~baldur_django.core.stages.figures.stage_section`)
    of every breaker of this process that has outbound stages; no store I/O.

    Returns:
        dict: empty when no breaker has stages.
    """
    found = {}
    for breaker in registry:
        section = stage_section(breaker)
        if section is not None:
            found[breaker.name] = section
    return dict(sorted(found.items()))


def _may_see_details(request: HttpRequest) -> bool:
    if settings.get("BALDUR_HEALTH_DETAILS"):
        return True
    user = getattr(request, "user", None)
    return bool(getattr(user, "is_staff", False) and getattr(user, "is_active", False))


@require_safe
def health_view(request: HttpRequest) -> JsonResponse:
    """The readiness document: ``{"status", "emergency_level"}`` plus, for staff or when
    ``BALDUR_HEALTH_DETAILS`` is on, ``"breakers"``, ``"critical"``, ``"store"`` and, when a
    breaker has outbound stages, ``"stages"`` (:func:`stage_details`).

    Args:
        request: a GET or HEAD request (others get 405).

    Returns:
        JsonResponse: 503 when the status is ``"down"``, else 200; never cached. A 503 is
        logged once at WARNING on logger ``django.request`` (with the reasons), not as the
        server error Django logs for other 5xx answers: the site works as designed when it
        reports a dependency down.
    """
    verdict = judge()
    body: dict[str, Any] = {"status": verdict.status, "emergency_level": verdict.emergency_level}
    if _may_see_details(request):
        body["breakers"] = verdict.breakers
        body["critical"] = list(verdict.critical)
        body["store"] = verdict.store
        stages = stage_details()
        if stages:
            body["stages"] = stages
    response = JsonResponse(body, status=verdict.http_status)
    add_never_cache_headers(response)
    if verdict.http_status == 503:
        # logged here at WARNING; Django's handler then leaves it (it logs a response once)
        log_response(
            "Health: %s answered 503 (%s)",
            request.path,
            "; ".join(verdict.reasons),
            response=response,
            request=request,
            level="warning",
        )
    return response


def _health_check_base() -> tuple[Any, Any, bool]:
    """django-health-check's base class, its exceptions module, and whether the base is the
    4.x one (``health_check.base.HealthCheck``, a ``run()`` method) rather than the 3.x one
    (``health_check.backends.HealthCheck``, a ``check_status()`` method). ``(None, None,
    False)`` when the package is not installed (untyped: imported as modules)."""
    try:
        errors: Any = importlib.import_module("health_check.exceptions")
    except ImportError:  # pragma: no cover - the [health] extra is not installed
        return None, None, False
    try:
        return importlib.import_module("health_check.base").HealthCheck, errors, True
    except ImportError:  # django-health-check 3.x
        return importlib.import_module("health_check.backends").HealthCheck, errors, False


_Base, _errors, _V4 = _health_check_base()


if _Base is not None:

    @dataclasses.dataclass
    class BreakerHealthCheck(_Base):  # type: ignore[misc,valid-type]  # an untyped base class
        """A django-health-check check that reports :func:`judge`'s verdict.

        ``"down"`` raises ``ServiceUnavailable`` (the page answers 500, as for any failing
        check); ``"degraded"`` passes unless *warn_when_degraded*, then it raises
        ``ServiceWarning``, which django-health-check also counts as an error. Works with
        django-health-check 3.21+ (``check_status``) and 4.x (``run``).

        Args:
            critical_services (tuple[str, ...] | None): overrides
                ``BALDUR_HEALTH_CRITICAL_SERVICES`` for this check.
            warn_when_degraded (bool): report ``"degraded"`` as a warning.
        """

        critical_services: tuple[str, ...] | None = None
        warn_when_degraded: bool = False

        def run(self) -> None:
            """Judge and raise as described above; runs in django-health-check's executor."""
            verdict = judge(self.critical_services)
            if verdict.status == DOWN:
                raise _errors.ServiceUnavailable("; ".join(verdict.reasons))
            if verdict.status == DEGRADED and self.warn_when_degraded:
                raise _errors.ServiceWarning("; ".join(verdict.reasons))

        if not _V4:

            def check_status(self) -> None:
                """django-health-check 3.x calls this: the same as :meth:`run`."""
                self.run()

else:  # pragma: no cover
    BreakerHealthCheck = None  # type: ignore[assignment,misc]
