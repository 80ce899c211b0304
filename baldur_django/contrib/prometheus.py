"""Prometheus metrics for the breakers and Emergency Mode, read at scrape time.

::

    from baldur_django.contrib import prometheus

    prometheus.install()          # once, anywhere: settings, AppConfig.ready(), a urls module

    # urls.py
    path("metrics", prometheus.metrics_view)

Series (every counter also labelled ``service``):

* ``baldur_circuit_breaker_calls_total{service, outcome}``: final outcomes of the protected
  calls (``success``, ``failure``, ``ignored``, ``rate_limited``);
* ``baldur_circuit_breaker_blocked_requests_total{service, reason}``: rejections
  (``open``, ``half_open_full``, ``frozen``; the outbound stages' ``bulkhead_full``,
  ``throttled``, ``deadline``, ``retry_after``);
* ``baldur_circuit_breaker_transitions_total{service, from_state, to_state, trigger}``;
* ``baldur_circuit_breaker_state{service}``: 0 closed, 1 open, 2 half_open;
* ``baldur_emergency_level``: the Emergency Mode level in force, 0..3;
* ``baldur_retry_budget_exhausted_total{service}``: retries a retry budget refused;
* ``baldur_bulkhead_in_flight{service}``: bulkhead slots held in this process (a
  breaker with a bulkhead; in multiprocess mode one series per process, ``pid``).

Nothing runs per call: the breakers keep counts they already need (or one atomic
increment where nothing existed, the OPEN rejection), and :class:`BaldurCollector` reads
them from the process's registry when the registry is scraped, with one
``core.readings.metric_values()`` per breaker (a few ints, no dict).

**Which series are exported.** The state gauge is exported for every breaker of the
process. A counter series (a ``service`` with one ``outcome``, one ``reason`` or one
``from_state``/``to_state``/``trigger`` combination) is exported from its first count on,
and never dropped afterwards: the counts only grow, a breaker replaced under its name
carries its counts into its successor's series, and a forgotten breaker's series stay at
their last values (its state gauge goes). A combination that never occurred in the process
is not exported at 0, as a labelled prometheus_client ``Counter`` does for label values it
never saw: a breaker that only ever succeeded has two samples (its state and its
successes), not eight, which keeps a scrape of 10,000 breakers within half a second. What
that costs a query: ``rate()`` and ``increase()`` need two samples, so the very first count
of a series (the first failure of a service since the process started, or in
multiprocess mode since the directory was emptied) is not in them; and an expression over
a series that does not exist yet has no value rather than 0 for that service (a failure
ratio needs the usual ``(failures or calls * 0) / calls`` form).

**Multi-process servers.** With prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is first imported), each
process runs a daemon thread that writes what its breakers counted since the last pass
into the shared directory every :data:`FLUSH_SECONDS` (less often when a pass is long:
:func:`flush_pause`; and once more at a clean exit), as
multiprocess-mode counters (a series reaches the files with its first count) and gauges
(the state gauge ``liveall``, the level gauge ``livemax``); prometheus_client names each
file after the writing process's pid.
:func:`metrics_view` then serves a ``MultiProcessCollector`` over the directory, so a
scrape that lands on any worker reports the host's sums. A forked child (gunicorn
``--preload``, Celery prefork) starts its counts from zero and runs its own thread: what
the parent counted before the fork stays in the parent's file, counted once.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

try:
    import prometheus_client
    from prometheus_client import values as _values
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.registry import CollectorRegistry
except ImportError as exc:  # exercised by tests/metrics (prometheus_client hidden)
    raise ImportError(
        "baldur_django.contrib.prometheus needs prometheus_client; install it with "
        "pip install 'baldur-django[prometheus]'"
    ) from exc

from ..core.errors import ConfigError
from .prometheus_readings import (
    BLOCKED,
    BULKHEAD_IN_FLIGHT,
    CALLS,
    COUNT_FAMILY,
    COUNT_LABELS,
    COUNTERS,
    EMERGENCY_LEVEL,
    HELP,
    LABELS,
    NO_TRANSITIONS,
    RETRY_BUDGET_EXHAUSTED,
    STATE,
    TRANSITIONS,
    ZEROS,
    Transition,
    View,
)
from .prometheus_readings import TALLY as _tally
from .prometheus_readings import WARNINGS as _warnings

__all__ = [
    "install",
    "metrics_view",
    "BaldurCollector",
    "flush",
    "multiprocess_dir",
    "FLUSH_SECONDS",
    "FLUSH_SHARE",
    "FLUSH_DEADLINE",
    "flush_pause",
    "CALLS",
    "BLOCKED",
    "TRANSITIONS",
    "STATE",
    "EMERGENCY_LEVEL",
    "RETRY_BUDGET_EXHAUSTED",
    "BULKHEAD_IN_FLIGHT",
    "Transition",
    "View",
]

log = logging.getLogger("baldur.metrics")

#: How often a process's counts reach the multiprocess directory (seconds); less often
#: when a pass takes long (thousands of breakers), see :func:`flush_pause`.
FLUSH_SECONDS = 0.5
#: The flusher thread's share of the time in passes, at most (the rest it sleeps), as long
#: as counts still reach the directory within :data:`FLUSH_DEADLINE`.
FLUSH_SHARE = 0.1
#: Counts reach the multiprocess directory within this many seconds of the call:
#: the pause after a pass is capped so that pause + next pass stay within it.
FLUSH_DEADLINE = 1.0


def flush_pause(took: float) -> float:
    """The flusher thread's sleep after a pass: at least :data:`FLUSH_SECONDS`, and long
    enough that passes fill at most :data:`FLUSH_SHARE` of the thread's time (a pass over
    10,000 breakers takes about 0.1 s of CPU: then about one pass a second), but never so
    long that a count made just after a pass misses :data:`FLUSH_DEADLINE` (the pause plus
    the next pass, which takes about as long as this one). The deadline wins over the share.

    Args:
        took: how long the last pass took, in seconds (0 before the first).

    Returns:
        float: seconds to sleep before the next pass (0 when a pass alone fills the deadline).
    """
    wanted = max(FLUSH_SECONDS, took * (1.0 - FLUSH_SHARE) / FLUSH_SHARE)
    return max(0.0, min(wanted, FLUSH_DEADLINE - took))


def multiprocess_dir() -> str | None:
    """The prometheus_client multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``), or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# ----------------------------------------------------------------------- collector
def _families(view: View | None) -> Iterator[Metric]:
    calls = CounterMetricFamily(CALLS, HELP[CALLS], labels=LABELS[CALLS])
    blocked = CounterMetricFamily(BLOCKED, HELP[BLOCKED], labels=LABELS[BLOCKED])
    moved = CounterMetricFamily(TRANSITIONS, HELP[TRANSITIONS], labels=LABELS[TRANSITIONS])
    states = GaugeMetricFamily(STATE, HELP[STATE], labels=LABELS[STATE])
    level = GaugeMetricFamily(EMERGENCY_LEVEL, HELP[EMERGENCY_LEVEL])
    exhausted = CounterMetricFamily(
        RETRY_BUDGET_EXHAUSTED, HELP[RETRY_BUDGET_EXHAUSTED], labels=LABELS[RETRY_BUDGET_EXHAUSTED]
    )
    slots = GaugeMetricFamily(BULKHEAD_IN_FLIGHT, HELP[BULKHEAD_IN_FLIGHT], labels=LABELS[BULKHEAD_IN_FLIGHT])
    if view is not None:
        family = {CALLS: calls, BLOCKED: blocked, RETRY_BUDGET_EXHAUSTED: exhausted}
        add = {name: family[name].add_metric for name in COUNT_FAMILY}
        adders = tuple(add[name] for name in COUNT_FAMILY)
        series = view.series
        for service in sorted(series):
            entry = series[service]
            totals = entry.totals
            if totals is not ZEROS:
                for value, add_metric, labels in zip(totals, adders, COUNT_LABELS, strict=True):
                    if value:  # a series that never counted anything is not exported
                        add_metric((service, *labels), value)
            if entry.transitions:
                for (before, after, trigger), value in sorted(entry.transitions.items()):
                    moved.add_metric((service, before, after, trigger), value)
        for service, state in sorted(view.states):
            states.add_metric((service,), state)
        for service, held in sorted(view.in_flight):
            slots.add_metric((service,), held)
        level.add_metric((), view.level)
    return iter((calls, blocked, moved, states, level, exhausted, slots))


class BaldurCollector:
    """A prometheus_client collector reading this process's breakers when scraped.

    Made and registered by :func:`install`; the series are listed in the module docstring.
    ``collect()`` never raises: a breaker that cannot be read is left out of that scrape
    (logged once a minute at most).
    """

    def describe(self) -> list[Metric]:
        """The families, without samples (so registering reads no breaker)."""
        return list(_families(None))

    def collect(self) -> Iterator[Metric]:
        """The families with one sample per series, read now."""
        try:
            view = _tally.read()
        except Exception:  # pragma: no cover - read() catches its own errors
            _warnings.warn("metrics.collect_failed: baldur's series are left out of this scrape")
            return
        yield from _families(view)


# ------------------------------------------------------------- multiprocess flusher
class _Flusher:
    """This process's writer into the multiprocess directory (one per process).

    Counters get ``inc(delta)`` with what the process counted since the last pass (a
    series with its first count); gauges are set when they change. A pass runs in a daemon
    thread every :data:`FLUSH_SECONDS` or more (:func:`flush_pause`), from
    :func:`metrics_view` before it reads the directory, and once at a clean exit.
    Passes hold ``lock`` from the first breaker read to the last file write, and a fork
    waits for it: a child never inherits a breaker lock (or prometheus_client's) taken
    by the flusher thread, which does not exist in the child.
    """

    def __init__(self) -> None:
        self.active = False
        self.pid: int | None = None
        self.thread: threading.Thread | None = None
        self.metrics: dict[str, Any] | None = None
        self._start_lock = threading.Lock()
        self._fresh()

    def _fresh(self) -> None:
        # reentrant: a listener of an event published during a pass may fork in this thread
        self.lock = threading.RLock()
        self.pushed: dict[str, tuple[int, ...]] = {}  # service -> the totals written
        self.pushed_transitions: dict[str, Mapping[Transition, int]] = {}
        self.states: dict[str, int] = {}
        self.slots: dict[str, int] = {}  # service -> the bulkhead in-flight gauge written
        self.level: int | None = None

    def _metrics(self) -> dict[str, Any]:
        if self.metrics is None:
            from prometheus_client import Counter, Gauge

            made: dict[str, Any] = {name: Counter(name, HELP[name], LABELS[name], registry=None) for name in COUNTERS}
            made[STATE] = Gauge(STATE, HELP[STATE], LABELS[STATE], registry=None, multiprocess_mode="liveall")
            made[BULKHEAD_IN_FLIGHT] = Gauge(
                BULKHEAD_IN_FLIGHT,
                HELP[BULKHEAD_IN_FLIGHT],
                LABELS[BULKHEAD_IN_FLIGHT],
                registry=None,
                multiprocess_mode="liveall",
            )
            made[EMERGENCY_LEVEL] = Gauge(
                EMERGENCY_LEVEL, HELP[EMERGENCY_LEVEL], registry=None, multiprocess_mode="livemax"
            )
            self.metrics = made
        return self.metrics

    def start(self) -> None:
        """Run the flusher thread in this process (idempotent; again in a forked child)."""
        with self._start_lock:
            self.active = True
            pid = os.getpid()
            if self.pid != pid:  # first start, or a child whose fork hook did not run
                if self.pid is not None:
                    self._fresh()
                    _tally.reset()
                self.pid = pid
                self.thread = None
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="baldur-metrics-flusher", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        took = 0.0
        while True:
            time.sleep(flush_pause(took))
            if self.pid != os.getpid():  # pragma: no cover - a thread never survives a fork
                return
            started = time.perf_counter()
            try:
                self.flush()
            except Exception:
                _warnings.warn("metrics.flush_failed: the counts will be written at the next pass")
            took = time.perf_counter() - started

    def flush(self) -> None:
        """Write what this process counted since the last pass (no-op unless started)."""
        if not self.active:
            return
        with self.lock:
            view = _tally.read()
            metrics = self._metrics()
            families = tuple(metrics[name] for name in COUNT_FAMILY)
            moved = metrics[TRANSITIONS]
            pushed, pushed_transitions = self.pushed, self.pushed_transitions
            for service, entry in view.series.items():
                totals = entry.totals  # read once: the fold replaces it, never changes it
                before = pushed.get(service, ZEROS)
                if totals is not before:
                    for now, was, family, labels in zip(totals, before, families, COUNT_LABELS, strict=True):
                        if now > was:  # a series reaches the files with its first count
                            family.labels(service, *labels).inc(now - was)
                    pushed[service] = totals
                transitions = entry.transitions
                written = pushed_transitions.get(service, NO_TRANSITIONS)
                if transitions is not written:
                    for key, now in transitions.items():
                        was = written.get(key, 0)
                        if now > was:
                            moved.labels(service, *key).inc(now - was)
                    pushed_transitions[service] = transitions
            for service, state in view.states:
                if self.states.get(service) != state:
                    metrics[STATE].labels(service).set(state)
                    self.states[service] = state
            for service, held in view.in_flight:
                if self.slots.get(service) != held:
                    metrics[BULKHEAD_IN_FLIGHT].labels(service).set(held)
                    self.slots[service] = held
            if self.level != view.level:
                metrics[EMERGENCY_LEVEL].set(view.level)
                self.level = view.level

    # fork hooks: no pass is half-written when the process forks; the child starts afresh
    def before_fork(self) -> None:
        self.lock.acquire()

    def after_fork_in_parent(self) -> None:
        self.lock.release()

    def after_fork_in_child(self) -> None:
        self._start_lock = threading.Lock()
        self._fresh()
        _tally.reset()
        self.thread = None
        if self.active:
            self.pid = None  # start() takes this process's pid
            try:
                self.start()
            except Exception:  # pragma: no cover - never fail a fork
                _warnings.warn("metrics.fork_failed: the flusher will start at the next scrape")
        else:
            self.pid = os.getpid()

    def at_exit(self) -> None:
        if self.active and self.pid == os.getpid():
            try:
                self.flush()
            except Exception:  # pragma: no cover - the process is going anyway
                _warnings.warn("metrics.flush_failed at exit")


_flusher = _Flusher()
atexit.register(_flusher.at_exit)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_flusher.before_fork,
        after_in_parent=_flusher.after_fork_in_parent,
        after_in_child=_flusher.after_fork_in_child,
    )


def flush() -> None:
    """Write this process's counts to the multiprocess directory now (what the flusher
    thread does every :data:`FLUSH_SECONDS`). A no-op until :func:`install` ran in
    multiprocess mode. Raises what prometheus_client raises when a file cannot be written.
    """
    _flusher.flush()


# --------------------------------------------------------------------------- install
_install_lock = threading.Lock()
_collectors: weakref.WeakKeyDictionary[Any, BaldurCollector] = weakref.WeakKeyDictionary()


def _check_multiprocess(path: str) -> None:
    if not os.path.isdir(path):
        raise ConfigError(f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory: create it before the workers start")
    if not getattr(_values.ValueClass, "_multiprocess", False):
        raise ConfigError(
            "PROMETHEUS_MULTIPROC_DIR is set, but prometheus_client was imported before it was: "
            "set it in the environment of the server (before Python starts)"
        )


def install(registry: CollectorRegistry | None = None) -> BaldurCollector:
    """Register baldur's collector on *registry* (idempotent) and, in multiprocess mode,
    start this process's flusher. May be called anywhere: settings, ``AppConfig.ready()``,
    a urls module; reading no breaker and opening no connection.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``; None means
            ``prometheus_client.REGISTRY``.

    Returns:
        BaldurCollector: the collector registered on that registry (the same object on
        every call with the same registry).

    Raises:
        ConfigError: ``PROMETHEUS_MULTIPROC_DIR`` names no directory, or was set after
            prometheus_client was imported (its counters would never reach the files).
        ValueError: another collector on *registry* already produces these series.
    """
    target = prometheus_client.REGISTRY if registry is None else registry
    path = multiprocess_dir()
    if path:
        _check_multiprocess(path)
    with _install_lock:
        collector = _collectors.get(target)
        if collector is None:
            collector = BaldurCollector()
            target.register(collector)
            _collectors[target] = collector
    if path:
        _flusher.start()
    return collector


def metrics_view(request: Any) -> Any:
    """A Django view serving the metrics in the text exposition format (OpenMetrics when
    the scraper asks for it).

    In multiprocess mode it writes this process's newest counts, then serves a
    ``MultiProcessCollector`` over ``PROMETHEUS_MULTIPROC_DIR`` (every process of the
    host, summed); otherwise ``prometheus_client.REGISTRY``. Calls :func:`install` first.
    Protect the URL as you would any internal endpoint.

    Args:
        request: the ``HttpRequest``; GET or HEAD.

    Returns:
        HttpResponse: 200 with the exposition; 405 for another method.
    """
    from django.http import HttpResponse, HttpResponseNotAllowed

    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    install()
    if multiprocess_dir():
        _flusher.flush()
        target = CollectorRegistry()
        MultiProcessCollector(target)
    else:
        target = prometheus_client.REGISTRY
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(encoder(target), content_type=content_type)
