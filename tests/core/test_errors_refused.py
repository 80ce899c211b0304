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
