"""Prometheus metrics for the breakers and Emergency Mode (EM-7), read at scrape time.

::

    from baldur_django.contrib import prometheus

    prometheus.install()          # once, anywhere: settings, AppConfig.ready(), a urls module

    # urls.py
    path("metrics", prometheus.metrics_view)

Series (every counter also labelled ``service``):

* ``baldur_circuit_breaker_calls_total{service, outcome}``: final outcomes of the protected
  calls (``success``, ``failure``, ``ignored``, ``rate_limited``);
* ``baldur_circuit_breaker_blocked_requests_total{service, reason}``: rejections
  (``open``, ``half_open_full``, ``frozen``);
* ``baldur_circuit_breaker_transitions_total{service, from_state, to_state, trigger}``;
* ``baldur_circuit_breaker_state{service}``: 0 closed, 1 open, 2 half_open;
* ``baldur_emergency_level``: the Emergency Mode level in force, 0..3.

Nothing runs per call: the breakers keep counts they already need (or one atomic
increment where nothing existed, the OPEN rejection), and :class:`BaldurCollector` reads
them from the process's registry when the registry is scraped.

**Multi-process servers.** With prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is first imported), each
process runs a daemon thread that writes what its breakers counted since the last pass
into the shared directory every :data:`FLUSH_SECONDS` (and once more at a clean exit), as
multiprocess-mode counters and gauges (the state gauge ``liveall``, the level gauge
``livemax``); prometheus_client names each file after the writing process's pid.
:func:`metrics_view` then serves a ``MultiProcessCollector`` over the directory, so a
scrape that lands on any worker reports the host's sums. A forked child (gunicorn
``--preload``, Celery prefork) starts its counts from zero and runs its own thread: what
the parent counted before the fork stays in the parent's file, counted once.

Implements EM-7.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
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

from ..core import emergency
from ..core.errors import ConfigError
from ..core.registry import registry as _breakers
from ..core.states import CircuitState

__all__ = [
    "install",
    "metrics_view",
    "BaldurCollector",
    "flush",
    "multiprocess_dir",
    "FLUSH_SECONDS",
    "CALLS",
    "BLOCKED",
    "TRANSITIONS",
    "STATE",
    "EMERGENCY_LEVEL",
]

log = logging.getLogger("baldur.metrics")

#: How often a process's counts reach the multiprocess directory (seconds).
FLUSH_SECONDS = 0.5

# Names as a scrape shows them (the counters without their ``_total`` suffix, as
# prometheus_client names counter families), with help texts and label names.
CALLS = "baldur_circuit_breaker_calls"
BLOCKED = "baldur_circuit_breaker_blocked_requests"
TRANSITIONS = "baldur_circuit_breaker_transitions"
STATE = "baldur_circuit_breaker_state"
EMERGENCY_LEVEL = "baldur_emergency_level"

_HELP = {
    CALLS: "Calls through a circuit breaker by final outcome (success, failure, ignored, rate_limited).",
    BLOCKED: "Requests a circuit breaker refused, by reason (open, half_open_full, frozen).",
    TRANSITIONS: "State changes of a circuit breaker, by from_state, to_state and trigger.",
    STATE: "Circuit breaker state: 0 closed, 1 open, 2 half_open.",
    EMERGENCY_LEVEL: "Emergency Mode level in force: 0 normal to 3 (every breaker frozen).",
}
_LABELS: dict[str, tuple[str, ...]] = {
    CALLS: ("service", "outcome"),
    BLOCKED: ("service", "reason"),
    TRANSITIONS: ("service", "from_state", "to_state", "trigger"),
    STATE: ("service",),
    EMERGENCY_LEVEL: (),
}
_COUNTERS = (CALLS, BLOCKED, TRANSITIONS)
_STATE_VALUES = {CircuitState.CLOSED: 0, CircuitState.OPEN: 1, CircuitState.HALF_OPEN: 2}

#: A counter series: ``(family, label values)``.
Key = tuple[str, tuple[str, ...]]


def multiprocess_dir() -> str | None:
    """The prometheus_client multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``), or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _Warnings:
    """One warning, then at most one a minute (a scrape or flush that keeps failing)."""

    def __init__(self) -> None:
        self._last = float("-inf")

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last >= 60.0:
            self._last = now
            log.warning(message, *args, exc_info=True)


_warnings = _Warnings()


# ------------------------------------------------------------------------ readings
class View:
    """One reading of every breaker of the process.

    Attributes:
        counters: ``{(family, label values): value}``: cumulative counts of this process,
            never lower than in an earlier view.
        states: service -> state gauge value (0, 1, 2).
        level: the emergency level (0..3).
    """

    __slots__ = ("counters", "states", "level")

    def __init__(self, counters: dict[Key, float], states: dict[str, int], level: int) -> None:
        self.counters = counters
        self.states = states
        self.level = level


def _flatten(service: str, counts: dict[str, Any]) -> dict[Key, float]:
    flat: dict[Key, float] = {}
    for outcome, value in counts["calls"].items():
        flat[(CALLS, (service, outcome))] = value
    for reason, value in counts["blocked"].items():
        flat[(BLOCKED, (service, reason))] = value
    for (before, after, trigger), value in counts["transitions"].items():
        flat[(TRANSITIONS, (service, before, after, trigger))] = value
    return flat


class _Tally:
    """Turns readings of the breakers into counter series that never go down.

    A breaker's counts only grow, but two readers (a scrape and the flusher) may fold
    their readings out of order, and a breaker may be replaced under its name (the
    registry cleared): each series keeps the highest value seen per breaker, and a
    replaced breaker's last counts are carried into its successor's series.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (a forked child: its breakers' counts restart at zero; the
        lock is new, as another thread of the parent may have held the old one)."""
        self.lock = threading.Lock()
        self._live: dict[str, tuple[weakref.ref[Any], dict[Key, float]]] = {}
        self._carried: dict[Key, float] = {}

    def read(self) -> View:
        """Read every breaker of the process and the emergency level. Never raises."""
        readings = []
        for breaker in _breakers:
            try:
                readings.append((breaker, breaker.metrics()))
            except Exception:
                _warnings.warn("metrics.read_failed service=%s: its series are left out of this reading", breaker.name)
        try:
            level = int(emergency.current_level())
        except Exception:  # current_level() never raises; belt and braces
            _warnings.warn("metrics.read_failed: the emergency level could not be read")
            level = 0
        states = {breaker.name: _STATE_VALUES.get(counts["state"], 0) for breaker, counts in readings}
        with self.lock:
            counters = self._fold(readings)
        return View(counters, states, level)

    def _fold(self, readings: Iterable[tuple[Any, dict[str, Any]]]) -> dict[Key, float]:
        live, carried = self._live, self._carried
        for breaker, counts in readings:
            flat = _flatten(breaker.name, counts)
            entry = live.get(breaker.name)
            if entry is not None and entry[0]() is not breaker:
                for key, value in entry[1].items():  # a replaced breaker: keep its counts
                    carried[key] = carried.get(key, 0) + value
                entry = None
            if entry is None:
                live[breaker.name] = (weakref.ref(breaker), flat)
            else:
                seen = entry[1]
                for key, value in flat.items():
                    if value > seen.get(key, 0):
                        seen[key] = value
        totals = dict(carried)
        for _, seen in live.values():
            for key, value in seen.items():
                totals[key] = totals.get(key, 0) + value
        return totals


_tally = _Tally()


# ----------------------------------------------------------------------- collector
def _families(view: View | None) -> Iterator[Metric]:
    families: dict[str, Metric] = {}
    for name in _COUNTERS:
        families[name] = CounterMetricFamily(name, _HELP[name], labels=_LABELS[name])
    families[STATE] = GaugeMetricFamily(STATE, _HELP[STATE], labels=_LABELS[STATE])
    families[EMERGENCY_LEVEL] = GaugeMetricFamily(EMERGENCY_LEVEL, _HELP[EMERGENCY_LEVEL])
    if view is not None:
        for (name, labels), value in sorted(view.counters.items()):
            families[name].add_metric(labels, value)  # type: ignore[attr-defined]
        for service, state in sorted(view.states.items()):
            families[STATE].add_metric([service], state)  # type: ignore[attr-defined]
        families[EMERGENCY_LEVEL].add_metric([], view.level)  # type: ignore[attr-defined]
    yield from families.values()


class BaldurCollector:
    """A prometheus_client collector reading this process's breakers when scraped (EM-7).

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

    Counters get ``inc(delta)`` with what the process counted since the last pass; gauges
    are set when they change. A pass runs every :data:`FLUSH_SECONDS` in a daemon thread,
    from :func:`metrics_view` before it reads the directory, and once at a clean exit.
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
        self.pushed: dict[Key, float] = {}
        self.states: dict[str, int] = {}
        self.level: int | None = None

    def _metrics(self) -> dict[str, Any]:
        if self.metrics is None:
            from prometheus_client import Counter, Gauge

            made: dict[str, Any] = {
                name: Counter(name, _HELP[name], _LABELS[name], registry=None) for name in _COUNTERS
            }
            made[STATE] = Gauge(STATE, _HELP[STATE], _LABELS[STATE], registry=None, multiprocess_mode="liveall")
            made[EMERGENCY_LEVEL] = Gauge(
                EMERGENCY_LEVEL, _HELP[EMERGENCY_LEVEL], registry=None, multiprocess_mode="livemax"
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
        while True:
            time.sleep(FLUSH_SECONDS)
            if self.pid != os.getpid():  # pragma: no cover - a thread never survives a fork
                return
            try:
                self.flush()
            except Exception:
                _warnings.warn("metrics.flush_failed: the counts will be written at the next pass")

    def flush(self) -> None:
        """Write what this process counted since the last pass (no-op unless started)."""
        if not self.active:
            return
        with self.lock:
            view = _tally.read()
            metrics = self._metrics()
            pushed = self.pushed
            for key, total in view.counters.items():
                before = pushed.get(key)
                if before is None or total > before:
                    name, labels = key
                    child = metrics[name].labels(*labels)  # creates the series at 0 in the file
                    delta = total - (before or 0)
                    if delta > 0:
                        child.inc(delta)
                    pushed[key] = total
            for service, state in view.states.items():
                if self.states.get(service) != state:
                    metrics[STATE].labels(service).set(state)
                    self.states[service] = state
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

    Implements EM-7."""
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

    Implements EM-7.
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

    Implements EM-7.
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
