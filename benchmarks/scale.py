"""What 1,000 and 10,000 breakers cost: memory, creation, the fleet jobs, a scrape, the status
command and the admin's first page (``./dev bench --scale``).

For each breaker count N (1,000 and 10,000 by default), in one process:

* **memory store** -- N breakers made by their first inline ``protect(name, fn)``: the time
  per breaker, the bytes per breaker (``tracemalloc``, a second set of N), and one
  ``/metrics`` scrape (``baldur_django.contrib.prometheus``'s collector on a private
  ``CollectorRegistry``, ``generate_latest``) over the N breakers;
* **Redis store** (the real server, a database and a key prefix of the run's own, deleted
  afterwards) -- N breakers made the same way (each first use reads the shared record), a
  tenth of them tripped with a recovery timeout already over, then ``recovery_sweep`` and
  ``sync_state`` (``baldur_django.core.maintenance``) over all N records; then, with this
  process's registry emptied as in a fresh process, ``baldur_status --json`` (in-process,
  ``call_command``) and the admin's breaker list, first page, as a logged-in superuser
  (Django's test client).

Each figure has a goal at 10,000 and a "grows at most linearly" line from the smallest to the
largest N: the larger figure at most (N ratio) x 1.2 the smaller (20 % for noise), per-breaker
memory at most 1.2 x. ``--runs`` repeats the whole thing; the median of the runs decides.
"""

from __future__ import annotations

import gc
import io
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import baldur_django as baldur

__all__ = ["ScaleSettings", "DEFAULT", "QUICK", "ScaleGoal", "SCALE_GOALS", "run_scale", "format_scale", "main"]


@dataclass(frozen=True)
class ScaleSettings:
    """What to measure.

    Attributes:
        counts: breaker counts, smallest first; the goals are read at the largest.
        redis_url: the Redis server and the database of the run's own.
        runs: repeated runs (the median decides).
        tripped_share: the share of the Redis records tripped before the sweep.
        django: also measure ``baldur_status --json`` and the admin page (needs Django).
    """

    counts: tuple[int, ...] = (1_000, 10_000)
    redis_url: str = "redis://127.0.0.1:6379/9"
    runs: int = 3
    tripped_share: float = 0.1
    django: bool = True


DEFAULT = ScaleSettings()
QUICK = ScaleSettings(counts=(200, 2_000), runs=1)

FIGURES = {
    "memory_bytes": "memory per breaker (memory store), bytes",
    "create_memory_us": "creation + first call, memory store, us per breaker",
    "create_redis_us": "creation + first call, Redis store, us per breaker",
    "scrape_s": "/metrics scrape over every breaker, s",
    "sweep_s": "recovery_sweep over every record (Redis), s",
    "sync_s": "sync_state over every record (Redis), s",
    "status_s": "baldur_status --json (Redis, fresh registry), s",
    "admin_s": "admin breaker list, first page (Redis, fresh registry), s",
}
#: figures that are per breaker (linear growth = a flat figure), the rest are totals
PER_BREAKER = ("memory_bytes", "create_memory_us", "create_redis_us")


@dataclass(frozen=True)
class ScaleGoal:
    """*figure* at the largest count must be <= *limit* (None: no absolute goal)."""

    figure: str
    limit: float | None
    text: str


SCALE_GOALS = (
    ScaleGoal("sweep_s", 2.0, "recovery_sweep over 10,000 records <= 2 s"),
    ScaleGoal("sync_s", 2.0, "sync_state over 10,000 records <= 2 s"),
    ScaleGoal("admin_s", 0.3, "admin breaker list, first page, with 10,000 breakers <= 300 ms"),
    ScaleGoal("scrape_s", 0.5, "a /metrics scrape with 10,000 breakers <= 500 ms"),
    ScaleGoal("status_s", 2.0, "baldur_status --json with 10,000 breakers <= 2 s"),
    ScaleGoal("memory_bytes", 2048.0, "memory per breaker <= 2 KB (2048 bytes)"),
    ScaleGoal("create_memory_us", None, "creation + first call, memory store"),
    ScaleGoal("create_redis_us", None, "creation + first call, Redis store"),
)
LINEAR_SLACK = 1.2


@dataclass
class ScaleRun:
    """One run: count -> figure -> value (None: not measured)."""

    figures: dict[int, dict[str, float | None]] = field(default_factory=dict)
    prefixes: list[str] = field(default_factory=list)  # the Redis key prefixes used (all deleted)


def _target() -> int:
    return 1


def _timed(func: Callable[[], Any]) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def _create(names: Sequence[str]) -> None:
    protect = baldur.protect
    for name in names:
        protect(name, _target)


def _memory_per_breaker(names: Sequence[str]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _create(names)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(names)


def _scrape() -> float:
    from prometheus_client import CollectorRegistry, generate_latest

    from baldur_django.contrib import prometheus

    scrape_registry = CollectorRegistry()
    prometheus.install(scrape_registry)
    generate_latest(scrape_registry)  # the collector's first scrape builds its caches
    return _timed(lambda: generate_latest(scrape_registry))


def _django_ready() -> bool:
    from django.apps import apps

    return apps.ready


def setup_django() -> None:
    """Configure a minimal Django project in this process (admin, an in-memory SQLite
    database, migrated) unless one is configured already (a test run)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-scale",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "baldur_django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        ROOT_URLCONF="tests.urls",
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
        BALDUR_STATE_BACKEND="memory",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _superuser_client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user_model = get_user_model()
    name = f"bench-scale-{uuid.uuid4().hex[:8]}"
    user = user_model.objects.create_superuser(name, f"{name}@example.com", "x")
    client = Client()
    client.force_login(user)
    return client


def _django_figures(redis_url: str) -> tuple[float, float]:
    """(``baldur_status --json`` seconds, admin first page seconds), each with this
    process's registry emptied first (a fresh worker knows no breaker yet)."""
    from django.core.management import call_command
    from django.test import override_settings
    from django.urls import reverse

    from baldur_django.core.registry import registry

    store = registry.store
    with override_settings(BALDUR_STATE_BACKEND="redis", BALDUR_REDIS_URL=redis_url):
        client = _superuser_client()
        url = reverse("admin:baldur_django_breaker_changelist")
        # warm-up with every breaker already in this process: imports, templates and URL
        # resolution are paid here, not in the timed calls (they do not grow with N)
        call_command("baldur_status", "--json", stdout=io.StringIO(), stderr=io.StringIO())
        client.get(url)
        registry.clear()
        registry.set_store(store)
        out = io.StringIO()
        status = _timed(lambda: call_command("baldur_status", "--json", stdout=out, stderr=io.StringIO()))
        if '"breakers"' not in out.getvalue():
            raise RuntimeError("baldur_status --json printed no document")
        registry.clear()
        registry.set_store(store)
        responses: list[Any] = []
        admin = _timed(lambda: responses.append(client.get(url)))
        if responses[0].status_code != 200:
            raise RuntimeError(f"the admin list answered {responses[0].status_code}")
    return status, admin


def _redis_client(url: str) -> Any:
    from baldur_django.core.stores.redis import connect

    return connect(url, socket_timeout=5.0)


def _one_count(
    count: int, settings: ScaleSettings, progress: Callable[[str], None], prefixes: list[str]
) -> dict[str, float | None]:
    from baldur_django.core import maintenance
    from baldur_django.core.registry import registry
    from baldur_django.core.stores.redis import RedisStore

    tag = uuid.uuid4().hex[:10]
    figures: dict[str, float | None] = dict.fromkeys(FIGURES)
    # ---- memory store
    registry.clear()
    registry.set_store(None)
    progress(f"{count} breakers, memory store")
    names = [f"scale.{tag}.m{i}" for i in range(count)]
    figures["create_memory_us"] = _timed(lambda: _create(names)) / count * 1e6
    figures["scrape_s"] = _scrape()
    registry.clear()
    figures["memory_bytes"] = _memory_per_breaker([f"scale.{tag}.k{i}" for i in range(count)])
    registry.clear()
    # ---- Redis store
    client = _redis_client(settings.redis_url)
    prefix = f"bench-scale-{tag}"
    prefixes.append(prefix)
    store = RedisStore(client, prefix=prefix)
    try:
        registry.set_store(store)
        progress(f"{count} breakers, Redis store")
        names = [f"scale.{tag}.r{i}" for i in range(count)]
        figures["create_redis_us"] = _timed(lambda: _create(names)) / count * 1e6
        step = max(1, round(1 / settings.tripped_share))
        due = names[::step]
        for name in due:  # set-up, not timed: records whose recovery timeout is already over
            store.trip(name, trigger="consecutive_failures", recovery_timeout=0.0)
        report: list[Any] = []
        figures["sweep_s"] = _timed(lambda: report.append(maintenance.recovery_sweep()))
        if report[0].skipped or len(report[0].moved) != len(due) or report[0].breakers != count:
            raise RuntimeError(f"the sweep did not move what it should: {report[0].as_dict()!r:.300}")
        figures["sync_s"] = _timed(lambda: report.append(maintenance.sync_state()))
        if report[1].skipped or report[1].breakers != count:
            raise RuntimeError(f"sync_state did not read every record: {report[1].skipped}")
        if settings.django:
            progress(f"{count} breakers, baldur_status --json and the admin page")
            figures["status_s"], figures["admin_s"] = _django_figures(settings.redis_url)
    finally:
        registry.clear()
        registry.set_store(None)
        for key in client.scan_iter(f"{prefix}:*", count=1_000):
            client.delete(key)
        client.close()
    return figures


def run_scale(settings: ScaleSettings = DEFAULT, progress: Callable[[str], None] | None = None) -> list[ScaleRun]:
    """Measure every count, ``settings.runs`` times.

    Raises:
        redis.ConnectionError: Redis cannot be reached.
    """
    say = progress or (lambda text: None)
    if settings.django:
        setup_django()
    runs = []
    for index in range(settings.runs):
        run = ScaleRun()
        for count in settings.counts:
            run.figures[count] = _one_count(
                count, settings, lambda text, i=index: say(f"run {i + 1}: {text}"), run.prefixes
            )
        runs.append(run)
    return runs


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(figure: str, value: float | None) -> str:
    if value is None:
        return "-"
    if figure.endswith("_s"):
        return f"{value * 1e3:.0f} ms"
    if figure.endswith("_us"):
        return f"{value:.0f} us"
    return f"{value:.0f} B"


def verdicts(runs: list[ScaleRun], counts: Sequence[int]) -> list[tuple[str, str, str]]:
    """``(status, text, figures)`` for every goal and every linear-growth line."""
    small, large = counts[0], counts[-1]
    out = []
    for goal in SCALE_GOALS:
        values = [run.figures[large][goal.figure] for run in runs]
        median = _median(values)
        shown = ", ".join(_fmt(goal.figure, v) for v in values)
        if goal.limit is not None:
            status = "N/A" if median is None else ("PASS" if median <= goal.limit else "MISS")
            text = goal.text if large == 10_000 else f"{goal.text} (measured at {large:,})"
            out.append((status, text, f"{_fmt(goal.figure, median)} (limit {_fmt(goal.figure, goal.limit)}) [{shown}]"))
    for figure, label in FIGURES.items():
        growths = []
        for run in runs:
            a, b = run.figures[small][figure], run.figures[large][figure]
            growths.append(None if a is None or b is None or a <= 0 else b / a)
        median = _median(growths)
        allowed = LINEAR_SLACK if figure in PER_BREAKER else LINEAR_SLACK * large / small
        what = "per breaker" if figure in PER_BREAKER else "total"
        status = "N/A" if median is None else ("PASS" if median <= allowed else "MISS")
        shown = ", ".join("-" if g is None else f"{g:.2f}" for g in growths)
        out.append(
            (
                status,
                f"grows at most linearly from {small:,} to {large:,}: {label} ({what})",
                f"x{'-' if median is None else f'{median:.2f}'} (limit x{allowed:.1f}) [{shown}]",
            )
        )
    return out


def format_scale(runs: list[ScaleRun], settings: ScaleSettings, elapsed: float) -> str:
    """The report: each run's figures per count, then the goals (the median of the runs decides)."""
    import os

    out = [
        f"Python {sys.version.split()[0]}; load average {os.getloadavg()[0]:.2f} at the end; "
        f"{len(runs)} run(s) of counts {', '.join(f'{c:,}' for c in settings.counts)}; "
        f"Redis {settings.redis_url} (a key prefix of the run's own, deleted after); took {elapsed:.0f} s",
        "",
    ]
    header = ["figure", *[f"{c:,} run {i + 1}" for c in settings.counts for i in range(len(runs))]]
    rows = [header]
    for figure, label in FIGURES.items():
        rows.append([label, *[_fmt(figure, run.figures[c][figure]) for c in settings.counts for run in runs]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)))
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("")
    out.append(f"Goals (the median of {len(runs)} run(s) decides; each run's figure in brackets)")
    for status, text, figures in verdicts(runs, settings.counts):
        out.append(f"  {status:<4}  {text}: {figures}")
    return "\n".join(out)


def to_json(runs: list[ScaleRun], settings: ScaleSettings) -> dict[str, Any]:
    """Every figure and verdict, JSON-ready."""
    return {
        "settings": {"counts": list(settings.counts), "redis_url": settings.redis_url, "runs": settings.runs},
        "runs": [{str(c): figs for c, figs in run.figures.items()} for run in runs],
        "goals": [{"status": s, "goal": t, "figures": f} for s, t, f in verdicts(runs, settings.counts)],
    }


def main(
    argv: list[str] | None = None,
    *,
    quick: bool = False,
    json_file: str | None = None,
    redis_url: str | None = None,
    runs: int | None = None,
    counts: tuple[int, ...] | None = None,
) -> int:
    """``python -m benchmarks.scale`` / ``./dev bench --scale``; returns the exit code
    (2 when Redis cannot be reached)."""
    import json
    import logging

    settings = QUICK if quick or (argv and "--quick" in argv) else DEFAULT
    if redis_url:
        settings = replace(settings, redis_url=redis_url)
    if runs is not None:
        settings = replace(settings, runs=runs)
    if counts:
        settings = replace(settings, counts=tuple(sorted(counts)))
    for name in ("baldur", "baldur.tasks", "django.request"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    started = time.monotonic()
    try:
        result = run_scale(settings, progress=lambda text: print(f"measuring {text} ...", file=sys.stderr, flush=True))
    except Exception as exc:
        import redis

        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            print(f"cannot reach Redis at {settings.redis_url}: {exc}", file=sys.stderr)
            return 2
        raise
    print(format_scale(result, settings, time.monotonic() - started))
    if json_file:
        with open(json_file, "w", encoding="utf-8") as handle:
            json.dump(to_json(result, settings), handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
