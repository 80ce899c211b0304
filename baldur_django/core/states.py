"""Circuit states, rejection reasons, transition triggers and the legal-transition table.

:data:`TRANSITIONS` is the one table of the edges a breaker may take;
:func:`check_transition` is what the breaker calls before it applies the state change a
step computed, so an edge outside the table is a programming error the tests catch.
"""

from __future__ import annotations

import enum

__all__ = [
    "CircuitState",
    "Trigger",
    "Reason",
    "TRANSITIONS",
    "ANY_STATE",
    "IllegalTransition",
    "check_transition",
]


class CircuitState(enum.StrEnum):
    """The three states of a breaker. Values are the strings shown in logs and JSON
    (``str()`` and f-strings give ``"closed"``, not ``"CircuitState.CLOSED"``)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Trigger:
    """Names of what caused a transition."""

    CONSECUTIVE_FAILURES = "consecutive_failures"
    FAILURE_RATE = "failure_rate"
    RATE_LIMIT_CASCADE = "rate_limit_cascade"
    HALF_OPEN_FAILURE = "half_open_failure"
    SLOW_CALL_RATE = "slow_call_rate"
    FORCED = "forced"
    PROPAGATED = "propagated"
    RECOVERY_TIMEOUT = "recovery_timeout"
    HALF_OPEN_SUCCESS = "half_open_success"
    RELEASED = "released"
    FORCE_LAPSED = "force_lapsed"
    #: the worker followed a shared record that names no trigger of its own (a fresh record)
    ADOPTED = "adopted"
    #: ``CircuitBreaker.reset()``: back to a fresh CLOSED breaker (tests and operators)
    RESET = "reset"


class Reason:
    """Values of :attr:`CircuitOpenError.reason`."""

    OPEN = "open"
    HALF_OPEN_FULL = "half_open_full"
    FROZEN = "frozen"


_C, _O, _H = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN

#: The automatic edges and the triggers that may take each: a trip, the recovery
#: timeout, and a trial round's end.
TRANSITIONS: dict[tuple[CircuitState, CircuitState], frozenset[str]] = {
    (_C, _O): frozenset(
        {Trigger.CONSECUTIVE_FAILURES, Trigger.FAILURE_RATE, Trigger.SLOW_CALL_RATE, Trigger.RATE_LIMIT_CASCADE}
    ),
    (_O, _H): frozenset({Trigger.RECOVERY_TIMEOUT, Trigger.RELEASED, Trigger.FORCE_LAPSED}),
    (_H, _C): frozenset({Trigger.HALF_OPEN_SUCCESS}),
    (_H, _O): frozenset({Trigger.HALF_OPEN_FAILURE, Trigger.SLOW_CALL_RATE}),
}

#: Triggers that may move a breaker from any state to any state: the operator's
#: force and reset, and adopting a decision taken elsewhere: a peer's through
#: cluster propagation or the shared record of a store.
ANY_STATE: frozenset[str] = frozenset({Trigger.FORCED, Trigger.RESET, Trigger.PROPAGATED, Trigger.ADOPTED})


class IllegalTransition(AssertionError):
    """A breaker was about to enter a state by an edge outside :data:`TRANSITIONS`.

    A programming error, never a runtime condition: an ``AssertionError`` so that tests
    fail loudly wherever it is raised."""


def check_transition(before: CircuitState, after: CircuitState, trigger: str | None, *, adopted: bool = False) -> str:
    """Check one edge against the table and return its (named) trigger.

    Args:
        before (CircuitState): the state left.
        after (CircuitState): the state entered (may equal *before*: a new round or a force
            on a breaker already in that state).
        trigger (str | None): what caused it; must be a name, never None or ``"unknown"``.
        adopted (bool): the state is taken over from a shared record, which may name any
            trigger of the deciding worker (peer adoption is legal from any state).

    Returns:
        str: *trigger*.

    Raises:
        IllegalTransition: no trigger, or an edge the table does not hold.
    """
    if not trigger or trigger == "unknown":
        raise IllegalTransition(f"{before.value} -> {after.value} without a named trigger")
    if adopted or trigger in ANY_STATE:
        return trigger
    if trigger in TRANSITIONS.get((before, after), ()):
        return trigger
    raise IllegalTransition(f"{before.value} -> {after.value} by {trigger!r} is not a legal transition")
