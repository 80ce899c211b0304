"""EM-7: installing the metrics adds no work to the CLOSED hot path.

Checked on the code itself rather than timed (``./dev bench --metrics`` gives the
figures): a profile hook records every Python and C function the calling thread enters
during steady-state CLOSED calls, in every call style, before and after ``install()``,
and the breaker's lock-free metric counter (the OPEN rejections' ``itertools.count``) is
replaced by a tracing one; the counts kept as plain ints under the state lock are compared
before and after.
"""

from __future__ import annotations

import os
from typing import Any

import prometheus_client
import pytest

import baldur_django as baldur
from baldur_django.contrib import prometheus, prometheus_readings
from baldur_django.core import hotpath
from baldur_django.core import wrappers as wrappers_module
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry
from tests.closed_lane import profile, warm_batch

from .conftest import Scraper


class TracingCounter:
    """Stands in for one of the breaker's metric counters; logs every step."""

    def __init__(self, log: list[str], name: str, inner: Any) -> None:
        self.log, self.name, self.inner = log, name, inner

    def __next__(self) -> int:
        self.log.append(self.name)
        return next(self.inner)

    def __repr__(self) -> str:  # read by the scrape as "count(N)"
        return repr(self.inner)


#: The breaker's metric counts kept as plain ints, changed only under its state lock.
LOCKED_COUNTS = (
    "m_failure",
    "m_rate_limited",
    "m_ignored",
    "m_uncounted",
    "m_noted",
    "blocked_half_open",
    "blocked_frozen",
)


def _trace_metric_counters(breaker: Any, log: list[str]) -> dict[str, int]:
    """Trace the lock-free counter; return the locked counts as they are now (see :func:`_stepped`)."""
    core_of(breaker).blocked_open = TracingCounter(log, "blocked open", core_of(breaker).blocked_open)
    return {name: getattr(core_of(breaker), name) for name in LOCKED_COUNTS}


def _stepped(breaker: Any, counts: dict[str, int]) -> list[str]:
    """The locked counts that changed since *counts* was taken."""
    return [name for name in LOCKED_COUNTS if getattr(core_of(breaker), name) != counts[name]]


@pytest.mark.parametrize("style", ["decorated", "protect", "async"])
def test_em7_installing_metrics_leaves_the_closed_fast_lane_untouched(clock, style):
    """EM-7: steady-state CLOSED successes enter exactly the same functions before and after
    ``install()`` (none of the metrics module's or prometheus_client's), step none of the
    breaker's metric counters, and are still counted at the next scrape."""
    service = f"em7-hot-{style}"
    log: list[str] = []

    breaker = registry.get(service)
    counts = _trace_metric_counters(breaker, log)
    batch, close = warm_batch(service, style)
    before = profile(batch)
    scraper = Scraper()
    prometheus.install()  # the default registry too, as an application does
    after = profile(batch)
    close()
    assert after == before
    client_dir = os.path.dirname(prometheus_client.__file__)
    ours = (prometheus.__file__, prometheus_readings.__file__)
    touched = [e for e in after if e[1] in ours or e[1].startswith((client_dir, "prometheus_client"))]
    # the hook did see the calls (the wrappers are built by core/wrappers.py)
    assert any(e[1] in (hotpath.__file__, wrappers_module.__file__) or e[2] == "protect" for e in after)
    assert touched == []
    assert log == []  # no metric counter stepped on the CLOSED path
    assert _stepped(breaker, counts) == []
    assert scraper.value("baldur_circuit_breaker_calls_total", service=service, outcome="success") == 250


def test_em7_the_tracing_sees_a_metric_counter_when_one_is_stepped(clock):
    """Meta-test: the tracing counters do log a step (an OPEN rejection's, here), so an
    empty log above means nothing was counted."""
    log: list[str] = []
    breaker = registry.get("em7-hot-meta", {"failure_threshold": 1})
    counts = _trace_metric_counters(breaker, log)

    @baldur.circuit_breaker("em7-hot-meta")
    def down() -> int:
        raise ValueError("down")

    with pytest.raises(ValueError):
        down()
    with pytest.raises(baldur.CircuitOpenError):
        down()
    assert log == ["blocked open"]
    assert _stepped(breaker, counts) == ["m_failure", "m_noted"]
