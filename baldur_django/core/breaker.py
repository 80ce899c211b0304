"""A circuit breaker as users hold it: ask permission, then record the outcome.

:class:`CircuitBreaker` is the user-facing surface: the state and a snapshot, metrics,
forces, release and reset, the explicit store refresh, and the ask-then-record API
(``acquire()`` returns a :class:`Permit` or raises :class:`CircuitOpenError`; the caller
runs its own code with no lock held and reports back with ``record_success`` /
``record_failure`` / ``record_ignored``).

The work is done by the breaker's parts, which it builds and owns:

* :class:`~baldur_django.core.calls.BreakerCore` (``machine.py``, ``shared.py``,
  ``calls.py``): the state, its transitions, the store seam, admission and recording;
* ``wrappers.py``: the hot-path wrappers of protected functions;
* ``readings.py``: metrics reading; ``control.py``: forces, release, reset, peers;
* ``sync.py``: the strategy that meets a shared store.

The package's own modules reach the core with :func:`core_of`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from . import control, readings
from .calls import BreakerCore
from .clock import SYSTEM_CLOCK, Clock
from .config import BreakerConfig
from .configs import shared_config
from .control import PEER_APPLIED, PEER_BLOCKED, PEER_LIFTED, PEER_UNCHANGED
from .events import EventBus
from .events import bus as default_bus
from .nesting import recorded_since
from .permit import Permit, enter_trial, leave_trial, trial_in_progress, validate_ttl
from .readings import METRIC_COUNTS
from .states import CircuitState
from .sync import StoreGuard

__all__ = [
    "Permit",
    "CircuitBreaker",
    "core_of",
    "shared_config",
    "validate_ttl",
    "recorded_since",
    "trial_in_progress",
    "enter_trial",
    "leave_trial",
    "PEER_APPLIED",
    "PEER_UNCHANGED",
    "PEER_BLOCKED",
    "PEER_LIFTED",
    "METRIC_COUNTS",
]

CLOSED = CircuitState.CLOSED
HALF_OPEN = CircuitState.HALF_OPEN
OPEN = CircuitState.OPEN


class CircuitBreaker:
    """One named breaker with consecutive, failure-rate, slow-call and 429-cascade triggers.

    Args:
        name (str): the service name; any non-empty string.
        config (BreakerConfig): resolved configuration (times in seconds).
        clock (Clock): time source; tests pass a ``FakeClock``.
        bus (EventBus): where events are published (the process-wide bus by default).

    Raises:
        ConfigError: *name* is empty or not a string.
    """

    __slots__ = ("_core", "__dict__", "__weakref__")

    def __init__(
        self,
        name: str,
        config: BreakerConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        bus: EventBus = default_bus,
    ) -> None:
        self._core = BreakerCore(name, config, clock, bus)

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self._core.name!r} {self._core.state.value}>"

    # ------------------------------------------------------------------ reading
    @property
    def name(self) -> str:
        """The service name (str)."""
        return self._core.name

    @property
    def config(self) -> BreakerConfig:
        """The effective configuration (a frozen :class:`BreakerConfig`; times in seconds)."""
        return self._core.config

    @property
    def backend(self) -> str:
        """Where the state is shared: ``"memory"`` (this process only), ``"database"`` or ``"redis"``."""
        return self._core.sync.backend

    @property
    def state(self) -> CircuitState:
        """The current :class:`CircuitState`, with a due force lapse and recovery timeout
        applied. Never reads a shared store: this process's view as last adopted (call
        :meth:`refresh` first for the shared record's)."""
        return self._core.read_state()

    @property
    def forced(self) -> str | None:
        """``"open"``, ``"closed"`` or None; a lapsed force reads None. No store I/O, as :attr:`state`."""
        self._core.read_state()
        return self._core.forced

    def refresh(self) -> CircuitState:
        """Read the shared record when a consult is due (or a force lapse is), and sweep an
        OPEN record past its recovery timeout; then return :attr:`state`.

        Store I/O for a shared breaker (none for a process-local one). Store trouble never
        raises: the breaker then judges on its own state.

        Returns:
            CircuitState: the state after the refresh.
        """
        return self._core.refresh()

    def sync(self) -> None:
        """Read the shared record now, whatever the sync interval says (store I/O; a no-op
        for a process-local breaker). Raises nothing: store trouble means local judgement."""
        self._core.sync.consult(self._core, self._core.mono())

    def snapshot(self) -> dict[str, Any]:
        """The breaker's state and counts as a dict (the keys of the status API), after a
        :meth:`refresh` (so it may read a shared store). Never takes a trial slot.

        Returns:
            dict: ``service``, ``state`` (a state value), counts, open and force fields
            (Unix seconds), ``backend`` and ``config`` (the thresholds in force); ``stages``
            for a breaker with outbound stages (their knobs, figures and refusals by
            reason; see :func:`~baldur_django.core.stages.figures.stage_section`).
        """
        self._core.refresh()
        snap = readings.snapshot(self._core)
        for section in readings.SNAPSHOT_SECTIONS:
            section(self, snap)
        return snap

    def metrics(self) -> dict[str, Any]:
        """What this process's breaker counted (for Prometheus); never reads a shared store
        and never takes a trial slot.

        Returns:
            dict: ``state`` (a :class:`CircuitState`); ``calls``: final outcomes by
            ``success``, ``failure``, ``ignored``, ``rate_limited`` (a call with retries is
            one call); ``blocked``: rejections by reason (``open``, ``half_open_full``,
            ``frozen``); ``transitions``: ``{(from_state, to_state, trigger): count}``.
            Counts start at 0 in a process, a forked child included, and never decrease.
        """
        return readings.metrics(self._core)

    def cooldown_remaining(self) -> float:
        """Seconds left on this service's 429 cooldown in this process (0.0 when none)."""
        return self._core.cooldown_remaining()

    # ------------------------------------------------------- ask, then record
    def acquire(self) -> Permit:
        """Ask to make one call.

        Returns:
            Permit: to pass to one of the ``record_*`` methods.

        Raises:
            CircuitOpenError: OPEN (``reason="open"``, ``retry_after`` seconds until a probe
                or until a force lapses) or HALF_OPEN with every trial slot taken
                (``reason="half_open_full"``). Never raised in dry-run.
        """
        return self._core.acquire()

    async def aacquire(self) -> Permit:
        """:meth:`acquire` for coroutines: a shared breaker's admission that may reach its
        store runs in a worker thread, so the event loop never waits on store I/O.

        Returns:
            Permit. Raises CircuitOpenError as :meth:`acquire` does.
        """
        return await self._core.aacquire()

    def record_success(self, permit: Permit, *, count_attempt: bool = True) -> None:
        """Record that the call admitted by *permit* succeeded.

        Args:
            permit (Permit): from :meth:`acquire`.
            count_attempt (bool): also count the call in the 429 cascade window (False
                when each attempt was counted already).
        """
        self._core.record_success(permit, count_attempt=count_attempt)

    def record_failure(
        self, permit: Permit, *, rate_limited: bool = False, retry_after: Any = None, count_attempt: bool = True
    ) -> None:
        """Record that the call admitted by *permit* failed.

        Args:
            permit (Permit): from :meth:`acquire`.
            rate_limited (bool): the failure was a 429; it also feeds the cascade and starts
                the cooldown.
            retry_after: the raw ``Retry-After`` (seconds, or the header's text) for the cooldown.
            count_attempt (bool): False when each attempt was counted already.
        """
        self._core.record_failure(
            permit, rate_limited=rate_limited, retry_after=retry_after, count_attempt=count_attempt
        )

    def record_ignored(self, permit: Permit) -> None:
        """The call counts neither as a success nor as a failure (an ignored exception, or it
        never reached the dependency); a trial gives its slot back."""
        self._core.record_ignored(permit)

    def report_rate_limit(self, retry_after: Any = None) -> None:
        """A 429 seen outside any protected call: counted as a call, starts the cooldown, and
        is a failure of the current state (CLOSED: a failure; HALF_OPEN: a failed trial).

        Args:
            retry_after: the raw ``Retry-After`` (seconds, or the header's text), or None.
        """
        self._core.report_rate_limit(retry_after)

    # ------------------------------------------------------------ operator control
    def force_open(self, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None) -> None:
        """Hold the breaker OPEN for *ttl_minutes* minutes.

        Args:
            ttl_minutes (float | None): lifetime in minutes, > 0 and <= 1440; None uses
                ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``.
            reason (str): free text for logs and the audit.
            actor (str | None): who forced it (a user name, ``"command"``...).

        Raises:
            ConfigError: bad lifetime; nothing changes.
            StoreError: a shared store could not store the force.
        """
        control.force(self._core, "open", ttl_minutes, reason, actor)

    def force_close(self, ttl_minutes: float | None = None, reason: str = "", actor: str | None = None) -> None:
        """Hold the breaker CLOSED for *ttl_minutes* minutes; failures are still recorded.
        Arguments and errors as for :meth:`force_open`."""
        control.force(self._core, "closed", ttl_minutes, reason, actor)

    def release(self, actor: str | None = None, reason: str = "") -> bool:
        """Hand the breaker back to automatic judgement: a forced open goes to HALF_OPEN, a
        forced closed stays CLOSED with its counts.

        Returns:
            bool: True when a force was removed, False when nothing was forced.

        Raises:
            StoreError: a shared store could not store the release.
        """
        return control.release(self._core, actor, reason)

    def reset(self) -> None:
        """Return to a fresh CLOSED breaker: counts, 429 cooldown, backoff and any force
        cleared, whatever the state was. With a shared store the shared record is reset too.
        Publishes a ``Reset`` event (logged as ``circuit_breaker.reset``).

        Raises:
            StoreError: a shared store could not store the reset; nothing changed.
        """
        control.reset(self._core)

    def apply_peer(self, state: str) -> str:
        """Adopt a peer worker's ``"open"`` or ``"closed"`` decision (cluster propagation),
        locally and without store I/O; published with trigger ``propagated``. A forced
        closed breaker refuses an OPEN; a CLOSED lifts a forced open.

        Returns:
            str: ``"applied"``, ``"unchanged"``, ``"blocked"`` or ``"lifted"``.

        Raises:
            ConfigError: *state* is neither ``"open"`` nor ``"closed"``.
        """
        return control.apply_peer(self._core, state)

    # ------------------------------------------------------------ configuration
    def use_store(self, guard: StoreGuard | None) -> None:
        """Share this breaker's state through *guard*'s store, or go back to process-local
        state (None). Functions decorated before keep working; the next call reads the store."""
        self._core.use_store(guard)

    def reconfigure(self, config: BreakerConfig) -> None:
        """Swap in a new configuration (a new window size restarts the window)."""
        self._core.reconfigure(config)


#: ``core_of(breaker)``: the :class:`~baldur_django.core.calls.BreakerCore` a breaker works
#: with, what the package's own modules (the wrappers, the runner, the sync strategy, the
#: inbound shells, metrics reading) call instead of the user-facing methods. The one way
#: into a breaker's parts from outside this module (a C getter: no Python frame per call).
core_of: Callable[[CircuitBreaker], BreakerCore] = operator.attrgetter("_core")
