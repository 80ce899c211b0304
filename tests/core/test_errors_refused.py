"""Refusals share one base: CallRefusedError with service, reason and retry_after."""

from __future__ import annotations

import pickle

import pytest

import baldur_django as baldur
from baldur_django.core.errors import new_open_error


def test_every_refusal_is_a_call_refused_error():
    """Section 0: CircuitOpenError and RateLimitCooldownError subclass CallRefusedError, exported by the package."""
    assert issubclass(baldur.CircuitOpenError, baldur.CallRefusedError)
    assert issubclass(baldur.RateLimitCooldownError, baldur.CallRefusedError)
    assert "CallRefusedError" in baldur.__all__


@pytest.mark.parametrize(
    "error",
    [
        baldur.CircuitOpenError("payments", "open", 12.5),
        new_open_error("payments", "open", 12.5),  # the hot path's C-only constructor
    ],
    ids=["init", "fast"],
)
def test_circuit_open_error_answers_as_a_refusal(error):
    """Section 0: caught as CallRefusedError, it carries service, reason and retry_after."""
    with pytest.raises(baldur.CallRefusedError) as caught:
        raise error
    assert (caught.value.service, caught.value.reason, caught.value.retry_after) == ("payments", "open", 12.5)


def test_cooldown_refusal_has_retry_after_equal_to_remaining():
    """RL-6/section 0: RateLimitCooldownError.retry_after is its remaining cooldown; reason "cooldown";
    it survives pickling (Celery results, multiprocessing)."""
    error = baldur.RateLimitCooldownError("payments", 7.25)
    assert error.retry_after == error.remaining == 7.25 and error.reason == "cooldown"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.service, copy.retry_after, copy.reason) == ("payments", 7.25, "cooldown")


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (baldur.BulkheadFullError, "bulkhead_full"),
        (baldur.ThrottledError, "throttled"),
        (baldur.DeadlineExceededError, "deadline"),
    ],
)
def test_stage_refusals_are_call_refused_errors_with_their_reason(kind, reason):
    """Section 0 (outbound stages): each stage's refusal subclasses CallRefusedError, carries its reason,
    names the service in its message and survives pickling."""
    error = kind("payments", 2.5)
    assert isinstance(error, baldur.CallRefusedError) and kind.__name__ in baldur.__all__
    assert (error.service, error.reason, error.retry_after) == ("payments", reason, 2.5)
    assert "payments" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.service, copy.reason, copy.retry_after) == (kind, "payments", reason, 2.5)


def test_retry_after_gate_refusal_has_its_own_reason():
    """RS-3: the Retry-After gate refuses with RateLimitCooldownError, reason "retry_after", retry_after = seconds left."""
    error = baldur.RateLimitCooldownError("payments", 12.0, reason="retry_after")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.retry_after, copy.remaining) == ("retry_after", 12.0, 12.0)
    assert "Retry-After" in str(error)
