"""Circuit states, rejection reasons and transition triggers."""

from __future__ import annotations

import enum

__all__ = ["CircuitState", "Trigger", "Reason"]


class CircuitState(str, enum.Enum):
    """The three states of a breaker (CB-1). Values are the strings shown in logs and JSON."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:  # "closed", not "CircuitState.CLOSED"
        return self.value


class Trigger:
    """Names of what caused a transition (section 0 of the requirements)."""

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


class Reason:
    """Values of :attr:`CircuitOpenError.reason`."""

    OPEN = "open"
    HALF_OPEN_FULL = "half_open_full"
    FROZEN = "frozen"
