"""ST-2: the database store applies the one step function (``steps.step``), as the breaker
and the memory store do (tests/core/test_steps.py): with it broken, every record operation
of the database store fails."""

from __future__ import annotations

import math

import pytest

from baldur_django.core import steps


class StepCalled(Exception):
    pass


@pytest.mark.django_db
def test_st2_the_database_store_goes_through_the_step_function(monkeypatch):
    """ST-2: load, sweep, trip, force, release, clear, probe request and the prune's rule are
    each a call of ``steps.step`` on the database store."""
    from baldur_django.backends.database import DatabaseStore

    store = DatabaseStore(alias="default")
    store.load("meta")  # a registered CLOSED record, for prune

    def broken(*args, **kwargs):
        raise StepCalled

    monkeypatch.setattr(steps, "step", broken)
    calls = [
        ("load", {}),
        ("sweep", {}),
        ("trip", {"trigger": "failure_rate", "recovery_timeout": 5.0}),
        ("force", {"mode": "open", "ttl_seconds": 60.0}),
        ("release", {}),
        ("clear", {}),
        ("acquire_probe", {"token": "t", "max_calls": 1, "lease_seconds": 5.0}),
    ]
    for op, kwargs in calls:
        with pytest.raises(Exception) as info:  # the store may wrap it
            getattr(store, op)("meta", **kwargs)
        assert _caused_by_step(info.value), op
    with pytest.raises(Exception) as info:
        store.prune(older_than=math.inf)
    assert _caused_by_step(info.value)


def _caused_by_step(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, StepCalled):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
