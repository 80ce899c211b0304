"""Operator control of a breaker: forces, release, reset, and a peer's propagated decision.

Each function works on a breaker's core (:class:`~baldur_django.core.calls.BreakerCore`)
and is what the matching method of :class:`~baldur_django.core.breaker.CircuitBreaker`
runs. With a shared store the store operation comes first, its answer is adopted, and the
event is published after the state lock is released.
"""

from __future__ import annotations

from . import rules, steps
from .calls import BreakerCore
from .errors import ConfigError
from .events import Forced, ForceLapsed, Released, Reset, TripBlocked
from .permit import validate_ttl
from .states import Trigger

__all__ = [
    "force",
    "release",
    "reset",
    "apply_peer",
    "PEER_APPLIED",
    "PEER_UNCHANGED",
    "PEER_BLOCKED",
    "PEER_LIFTED",
]

# What apply_peer did with a peer's decision: the verdicts of rules.peer_verdict.
PEER_APPLIED = rules.PEER_APPLIED
PEER_UNCHANGED = rules.PEER_UNCHANGED
PEER_BLOCKED = rules.PEER_BLOCKED
PEER_LIFTED = rules.PEER_LIFTED


def force(core: BreakerCore, mode: str, ttl_minutes: float | None, reason: str, actor: str | None) -> None:
    """Hold the breaker in *mode* (``"open"`` or ``"closed"``) for *ttl_minutes* minutes (see
    :meth:`~baldur_django.core.breaker.CircuitBreaker.force_open`). Raises ConfigError or StoreError."""
    ttl = validate_ttl(ttl_minutes, core.config.default_ttl_minutes)
    reason = reason or ""
    events = core.outbox
    with core.sync.serial():
        answer = core.sync.store_force(core, mode, ttl * 60.0, reason, actor)
        now = core.mono()
        wall = core.clock.wall()
        with core.lock:
            if answer is None:
                core.evaluate(now, events)
            before = core.state
            if answer is None:  # a process-local force: its transition publishes no StateChanged
                core.apply_step(steps.Force(mode, ttl * 60.0, reason, actor), now, None)
                expires = wall + ttl * 60.0
            else:
                core.adopt(answer, now, [], force=True)
                expires = answer.record.force_expires_at or 0.0
            events.append(
                Forced(
                    core.name,
                    wall,
                    mode=mode,
                    from_state=before.value,
                    to_state=core.state.value,
                    ttl_minutes=ttl,
                    expires_at=expires,
                    reason=reason,
                    actor=actor,
                    dry_run=core.config.dry_run,
                )
            )
    core.settle(events)


def release(core: BreakerCore, actor: str | None = None, reason: str = "") -> bool:
    """Hand the breaker back to automatic judgement.

    A forced open goes straight to HALF_OPEN; a forced closed stays CLOSED with its
    counts, and the next outcome evaluates the triggers.

    Returns:
        True when a force was removed, False when nothing was forced (a no-op).

    Raises:
        StoreError: a shared store could not store the release.
    """
    events = core.outbox
    with core.sync.serial():
        answer = core.sync.store_release(core)
        now = core.mono()
        with core.lock:
            before = core.state
            if answer is None:
                core.evaluate(now, events)
                before = core.state
                released = core.apply_step(steps.Release(), now, None).result
                previous = None if released is None else str(released)
            else:
                previous = answer.result
                if answer.lapsed is not None:
                    events.append(
                        ForceLapsed(
                            core.name,
                            core.clock.wall(),
                            previous=answer.lapsed,
                            from_state=before.value,
                            to_state=answer.record.state,
                        )
                    )
                core.adopt(answer, now, [], force=True)
            if previous is not None:
                events.append(
                    Released(
                        core.name,
                        core.clock.wall(),
                        previous=previous,
                        from_state=before.value,
                        to_state=core.state.value,
                        actor=actor,
                        reason=reason,
                    )
                )
    core.settle(events)
    return previous is not None


# -------------------------------------------------------------- peers


def apply_peer(core: BreakerCore, state: str) -> str:
    """Adopt a peer worker's OPEN or CLOSED decision received through cluster propagation.

    Local adoption, with no threshold of its own and no store I/O: the deciding worker
    already wrote any shared store (whose record stays the authority: the next admission
    consults it). Published with trigger ``propagated``, which the propagation listener
    never sends on again, so peers cannot echo each other. Applied during Emergency
    Level 3 too: catching up with a decision taken elsewhere is not a new one.

    * ``"open"``: a CLOSED or HALF_OPEN breaker opens for its own (backed-off) recovery
      duration; a breaker forced closed refuses it as it refuses a trip (nothing changes,
      a ``TripBlocked`` event with trigger ``propagated`` is published).
    * ``"closed"``: an OPEN or HALF_OPEN breaker closes with its counts cleared, a forced
      open included: the force is lifted (the documented hazard of propagation).

    Returns:
        str: :data:`PEER_APPLIED`, :data:`PEER_UNCHANGED` (already in that state; a forced
        closed breaker stays forced), :data:`PEER_BLOCKED` or :data:`PEER_LIFTED`.

    Raises:
        ConfigError: *state* is neither ``"open"`` nor ``"closed"``.
    """
    if state not in ("open", "closed"):
        raise ConfigError(f"state={state!r}: a peer's decision is 'open' or 'closed'")
    events = core.outbox
    now = core.mono()
    with core.lock:
        core.evaluate(now, events)
        outcome = str(core.apply_step(steps.Peer(state), now, events).result)
        if outcome == PEER_BLOCKED:
            events.append(TripBlocked(core.name, core.clock.wall(), forced="closed", trigger=Trigger.PROPAGATED))
        if outcome in (PEER_APPLIED, PEER_LIFTED):
            core.sync.after_peer(core)
            core.refresh_fast()
    core.settle(events)
    return outcome


def reset(core: BreakerCore) -> None:
    """Return to a fresh CLOSED breaker: counts, 429 cooldown, backoff and any force
    cleared (for tests and operator tooling), whatever the state was.

    With a shared store the shared record is reset too (one store operation), so every
    worker follows at its next consult; a trip of this worker still waiting to be
    written is dropped. Publishes a :class:`~baldur_django.core.events.Reset` event,
    logged as ``circuit_breaker.reset`` and sent as the Django signal ``circuit_reset``.

    Raises:
        StoreError: a shared store could not store the reset; nothing changed.
    """
    events = core.outbox
    with core.sync.serial():
        answer = core.sync.store_reset(core)
        now = core.mono()
        with core.lock:
            if answer is None:
                core.evaluate(now, events)  # a lapse due now is announced first
            before = core.state
            previous = core.forced if answer is None else answer.result
            if answer is not None:
                core.adopt(answer, now, [], force=True)  # the record's version: not adopted again
            core.apply_step(steps.Clear(), now, None)  # a new generation: calls in flight are stale
            core.consecutive = 0
            core.window.clear()
            core.cascade.clear()
            core.cooldown_until = 0.0
            core.epoch = object()  # the stage lanes may take retry policies' first attempts again
            core.dry_run_rejections = 0
            events.append(
                Reset(
                    core.name,
                    core.clock.wall(),
                    from_state=before.value,
                    to_state=core.state.value,
                    forced=previous or "",
                )
            )
    core.settle(events)
