"""The scripted demo: real shop servers calling a real, misbehaving payments server.

``python -m testproject.demo [--short] [--no-color] [--no-plot] [--json-summary PATH]
[--out-dir DIR]`` (what ``./dev demo`` runs).

It starts six processes on free loopback ports: the payments stand-in
(``testproject.upstream``), two more of them as the shop's shipping carriers (one host
each), and three instances of the test project's Django server (``testproject.serve``,
Django's threaded development server), shops A, B and C, which share the breaker's state
through the project's SQLite database (shop C serves at most 4 requests at once, like a
worker with a fixed pool of request threads). It waits until all answer, and drives them
over HTTP through fifteen phases (phases 1-9 and 11 on shop A alone, 10, 12 and 13 on
shops A and B, 14 and 15 on shop C):

1. healthy traffic;
2. the payments service answers 503: the ``payments`` breaker trips CLOSED -> OPEN and
   later requests are answered by the fallback without contacting the service;
3. the service recovers: after the recovery timeout the breaker lets probes through
   (HALF_OPEN) and closes once they succeed;
4. an operator runs ``manage.py baldur_force open payments`` in another process: the
   running server reads the force from the shared database and stops calling the service;
5. ``manage.py baldur_force release payments``: the server probes and closes again;
6. Emergency Mode: the service is down again and the breaker trips; an operator runs
   ``manage.py baldur_emergency set 3`` in another process. At Level 3 the breaker stays
   OPEN past its recovery timeout: the server rejects with reason ``frozen`` (counted in
   its ``/breakers/``) and sends no trial call, even once the service is healthy again;
7. ``manage.py baldur_emergency step-down`` (level 2 freezes nothing): the breaker probes
   and closes; then ``baldur_emergency set 0`` ends the emergency;
8. the service hangs: the protected view's latency, with the breaker;
9. the service still hangs: the same load on a view without the breaker;
10. a fleet of two: the service recovers while the breaker is HALF_OPEN, and both shops get
   requests at once; the upstream's own counter shows the fleet sent exactly
   ``half_open_max_calls`` trial calls between them (the shared store admits them
   atomically), not that many per server. The upstream holds those trial calls until
   every other request has been answered, so the count is exact, not a matter of timing;
11. per-host breakers: shop A asks both carriers for shipping quotes through one requests
   adapter with a breaker per host (``BreakerAdapter()``); one carrier answers 503 and its
   host's breaker opens, the other's stays CLOSED. The carriers' own counters show the
   failing host spared once its breaker is OPEN and every call to the healthy host answered;
12. the outbound stages (``testproject.demo_stages``): the payments stand-in's rates API
   answers 429 with ``Retry-After: 2``; the documentation's retry example holds each
   retried web request for the pauses, and a call site without retry keeps calling;
13. the same with a 1 s request deadline (``RequestDeadlineMiddleware``) and
   ``honor_retry_after``: no request held past it, one call of the fleet within the
   provider's Retry-After (the database store keeps the gate for the fleet);
14. the rates API hangs: on shop C's 4 request threads, a burst of lookups takes every
   thread and a view that calls nothing waits behind them;
15. the same with a bulkhead (``max_concurrent_calls=2, max_wait=0.0``): the excess is
   refused at once (``bulkhead_full``) and the other view answers at once.

Each run uses a throwaway SQLite database in the output directory (``demo-out/`` by
default, beside the servers' logs), so the breaker always starts CLOSED even though the
test project keeps breaker state in its database. The servers and the commands share the
Emergency Mode level through a state file there too (``emergency-level.json``, the
``file`` backend, read through a 0.5 s cache), so the demo never touches the host's
default level file. Every breaker transition is printed as
the server records it (``/breakers/``). The run ends
with a summary table and, unless ``--no-plot``, a picture of the run drawn from what was
recorded on the way (``timeline.png`` in the output directory: one panel per phase, named
in words, with the breaker's state as a band where a breaker is in use, the requests by
outcome and the operators' commands, on the console's clock; see
``testproject.timeline``); the exit status is 0 when the expected transitions and counts were
observed, 1 when not, 2 when the servers could not be started, 130 on Ctrl-C. The child
processes are always stopped, and they also exit by themselves if this process dies.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from testproject import demo_stages
from testproject.demo_http import Reply, SetupError, http_call

REPO = Path(__file__).resolve().parent.parent
EXPECTED = [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
#: The shop's view protected by the ``payments`` breaker (the other one calls the service bare).
PROTECTED_PATH = "/orders/{id}/charge/"
#: The shop's view asking every carrier for a quote, one breaker per host.
QUOTES_PATH = "/orders/{id}/shipping-quotes/"
#: The shop's two carriers, as the demo runs them: the first fails in the per-host phase.
CARRIERS = ("parcelpost", "swiftship")


# ----------------------------------------------------------------------------- output
class Display:
    """Terminal output: one live progress line (``\\r`` updates on a TTY) plus event lines.

    Off a TTY the progress line is printed once, when the phase ends.
    """

    STATE_COLORS = {"closed": "32", "open": "31", "half_open": "33", "frozen": "36"}

    def __init__(self, color: bool, tty: bool, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.color = color
        self.tty = tty
        self.lock = threading.RLock()
        self.progress_text = ""

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def state(self, state: str | None) -> str:
        name = (state or "?").upper()
        return self.paint(name, self.STATE_COLORS.get(state or "", "0"))

    def bold(self, text: str) -> str:
        return self.paint(text, "1")

    def fit(self, text: str, tail: str, painted_tail: str) -> str:
        """``text + tail`` cut to the terminal width (a wrapped line defeats ``\r``); *tail*
        is shown as *painted_tail* when it fits whole."""
        if not self.tty:
            return text + painted_tail
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        if len(text) + len(tail) <= width:
            return text + painted_tail
        return (text + tail)[:width]

    def _draw(self) -> None:
        if self.tty and self.progress_text:
            self.stream.write("\r\033[K" + self.progress_text)
            self.stream.flush()

    def progress(self, text: str) -> None:
        """Replace the live progress line (no-op off a TTY until :meth:`end_progress`)."""
        with self.lock:
            self.progress_text = text
            self._draw()

    def end_progress(self) -> None:
        """Leave the progress line as the phase's final line."""
        with self.lock:
            if self.progress_text:
                if self.tty:
                    self.stream.write("\r\033[K" + self.progress_text + "\n")
                else:
                    self.stream.write(self.progress_text + "\n")
                self.stream.flush()
            self.progress_text = ""

    def line(self, text: str = "") -> None:
        """Print *text* on its own line, above the live progress line."""
        with self.lock:
            if self.tty and self.progress_text:
                self.stream.write("\r\033[K")
            self.stream.write(text + "\n")
            self._draw()
            self.stream.flush()


# ------------------------------------------------------------------------- processes
class Child:
    """A server subprocess that prints ``... listening on URL`` on stdout when ready."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,  # closing it (or our death) makes the child exit
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,  # Ctrl-C reaches only us; we stop the children
        )
        self.url = ""

    def wait_url(self, timeout: float) -> str:
        """Read the ``listening on URL`` line; SetupError if it does not come in time."""
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        buffered = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(
                    f"{self.name} exited with status {self.proc.returncode}; see {self.log_path}:\n{self.tail()}"
                )
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                buffered += chunk
                if b"\n" in buffered:
                    line = buffered.split(b"\n", 1)[0].decode(errors="replace")
                    if " listening on " not in line:
                        raise SetupError(f"{self.name} printed {line!r} instead of its address")
                    self.url = line.rsplit(" ", 1)[-1].strip()
                    threading.Thread(target=self._drain, daemon=True).start()
                    return self.url
        raise SetupError(f"{self.name} did not report its address within {timeout:g} s; see {self.log_path}")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        try:
            for chunk in iter(lambda: os.read(self.proc.stdout.fileno(), 4096), b""):
                self.log.write(chunk.decode(errors="replace"))
        except (OSError, ValueError):
            pass

    def tail(self, lines: int = 15) -> str:
        try:
            self.log.flush()
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate, then kill after 5 s; always closes our ends of the pipes."""
        proc = self.proc
        if proc.poll() is None:
            try:
                proc.terminate()
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        self.log.close()


def wait_ready(url: str, child: Child, timeout: float) -> None:
    """Poll *url* until it answers 200 (bounded); SetupError otherwise."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise SetupError(
                f"{child.name} exited with status {child.proc.returncode}; see {child.log_path}:\n{child.tail()}"
            )
        reply = http_call("GET", url, timeout=2.0)
        if reply.status == 200:
            return
        last = reply.error or f"HTTP {reply.status}"
        time.sleep(0.1)
    raise SetupError(f"{child.name} did not answer {url} within {timeout:g} s (last: {last}); see {child.log_path}")


# ---------------------------------------------------------------------------- phases
@dataclass
class PhasePlan:
    key: str
    title: str
    path: str  # "/orders/{id}/charge/"
    upstream_mode: str
    count: int | None  # None: until the breaker closes (plus `extra` requests)
    concurrency: int = 1
    pace: float = 0.0  # seconds each worker waits between its requests
    extra: int = 0
    deadline: float = 30.0
    operator: str | None = None  # "open" / "release": run `manage.py baldur_force` first
    label: str = ""  # short name in the picture ("\n" breaks the line)
    fleet: bool = False  # the two-server phase (Demo.run_fleet), `count` requests per server
    # Emergency Mode phases: "freeze" (Demo.run_freeze: `count` rejections with reason
    # frozen wanted, then `extra` requests once the upstream is healthy again) or
    # "step_down" (Demo.run_step_down: like the release phase, after a step-down)
    emergency: str | None = None
    per_host: bool = False  # the per-host breakers phase (Demo.run_per_host), on the carriers
    # the outbound-stage phases (testproject.demo_stages): "retry_after" or "bulkhead", and
    # the shop's rate client they use (testproject.shop.rates.CLIENTS)
    stage: str | None = None
    client: str = ""


@dataclass
class PhaseResult:
    key: str
    title: str
    sent: int = 0
    ok: int = 0
    fallback: int = 0
    rejected: int = 0
    errors: int = 0
    upstream_counted: int = 0
    server_rejections: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    last_state: str = "?"
    started: float = 0.0  # seconds since the demo started (the phase's span in the picture)
    ended: float = 0.0
    fleet: dict[str, Any] = field(default_factory=dict)  # the fleet phase's own figures
    emergency: dict[str, Any] = field(default_factory=dict)  # the Emergency Mode phases' own figures
    reasons: dict[str, int] = field(default_factory=dict)  # the server's rejections by reason
    per_host: dict[str, Any] = field(default_factory=dict)  # the per-host phase's own figures
    stages: dict[str, Any] = field(default_factory=dict)  # an outbound-stage phase's own figures

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.latencies) * 1000 if self.latencies else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "sent": self.sent,
            "ok": self.ok,
            "fallback": self.fallback,
            "rejected_fast": self.rejected,
            "errors": self.errors,
            "upstream_counted": self.upstream_counted,
            "server_rejections": self.server_rejections,
            "server_rejections_by_reason": dict(self.reasons),
            "seconds": round(self.seconds, 3),
            "median_ms": None if self.median_ms is None else round(self.median_ms, 1),
            "max_ms": round(max(self.latencies) * 1000, 1) if self.latencies else None,
            "transitions": [f"{t['from']}->{t['to']}" for t in self.transitions],
            **({"fleet": self.fleet} if self.fleet else {}),
            **({"emergency": self.emergency} if self.emergency else {}),
            **({"per_host": self.per_host} if self.per_host else {}),
            **({"stages": self.stages} if self.stages else {}),
        }


def summary_table(results: list[PhaseResult]) -> list[str]:
    """The summary's table, one line per phase and a total, as printed (no colour)."""
    header = f"  {'phase':<41}{'sent':>6}{'upstream':>10}{'paid':>6}{'fallback':>10}{'rej.fast':>10}{'errors':>8}{'median':>10}"
    rule = "  " + "-" * (len(header) - 2)
    lines = [header, rule]
    notes = []
    for i, r in enumerate(results, 1):
        median = "-" if r.median_ms is None else f"{r.median_ms:.0f} ms"
        upstream = str(r.upstream_counted)
        if r.per_host.get("upstream_counted"):
            # each request asks every carrier: one count per carrier, none above the requests sent
            carriers = [r.per_host["failing"], r.per_host["healthy"]]
            counted = r.per_host["upstream_counted"]
            upstream = "+".join(str(counted[c]) for c in carriers)
            note = (
                f"phase {i}: each of the {r.sent} requests asks both carriers, so its upstream cell is per carrier: "
                f"{carriers[0]} ({r.per_host['breakers'][carriers[0]]}) counted {counted[carriers[0]]}, "
                f"{carriers[1]} ({r.per_host['breakers'][carriers[1]]}) {counted[carriers[1]]}; paid: requests "
                f"answered with a quote (from either carrier); rej.fast: the {r.rejected} calls to a carrier its "
                "host's open breaker refused"
            )
            notes += textwrap.wrap(note, len(header), initial_indent="  ", subsequent_indent="    ")
        lines.append(
            f"  {f'{i}. {r.title}':<41}{r.sent:>6}{upstream:>10}{r.ok:>6}{r.fallback:>10}{r.rejected:>10}{r.errors:>8}{median:>10}"
        )
    total = {
        k: sum(getattr(r, k) for r in results)
        for k in ("sent", "upstream_counted", "ok", "fallback", "rejected", "errors")
    }
    lines.append(rule)
    lines.append(
        f"  {'total':<41}{total['sent']:>6}{total['upstream_counted']:>10}{total['ok']:>6}{total['fallback']:>10}{total['rejected']:>10}{total['errors']:>8}"
    )
    return lines + notes


def plans(short: bool) -> list[PhasePlan]:
    """The fifteen phases; ``--short`` sends fewer requests and keeps the hang phases brief."""
    protected = PROTECTED_PATH
    unprotected = "/orders/{id}/charge-unprotected/"
    hang_count = 16 if short else 32
    return [
        PhasePlan(
            "healthy",
            "healthy traffic",
            protected,
            "ok",
            10 if short else 30,
            concurrency=2 if short else 3,
            pace=0.02,
            label="healthy",
        ),
        # the full run lasts longer than the recovery timeout here, so one probe meets the
        # failing service and the breaker reopens (HALF_OPEN -> OPEN)
        PhasePlan(
            "failing",
            "upstream fails (503)",
            protected,
            "fail",
            10 if short else 40,
            pace=0.03 if short else 0.1,
            label="upstream\nfails (503)",
        ),
        PhasePlan(
            "recovering",
            "upstream recovers",
            protected,
            "recover",
            None,
            pace=0.1,
            extra=3 if short else 10,
            deadline=20.0,
            label="upstream\nrecovers",
        ),
        # an operator in another process forces the breaker open, then releases it
        PhasePlan(
            "operator_forced",
            "operator forces it open",
            protected,
            "ok",
            6 if short else 12,
            pace=0.05,
            operator="open",
            label="operator\nforces OPEN",
        ),
        PhasePlan(
            "operator_released",
            "operator releases it",
            protected,
            "ok",
            None,
            pace=0.1,
            extra=2,
            deadline=20.0,
            operator="release",
            label="operator\nreleases it",
        ),
        # Emergency Mode: the upstream fails, the breaker trips, an operator in
        # another process declares Level 3; the breaker is held OPEN past its recovery
        # timeout (reason frozen), even once the upstream is healthy; a step-down lets it
        # probe and close, then the operator clears the level
        PhasePlan(
            "emergency",
            "upstream down, Emergency Level 3",
            protected,
            "fail",
            4 if short else 10,
            pace=0.1,
            extra=3 if short else 6,
            label="upstream down,\nLevel 3 freeze",
            emergency="freeze",
        ),
        PhasePlan(
            "emergency_step_down",
            "operator steps the level down",
            protected,
            "recover",
            None,
            pace=0.1,
            extra=2,
            deadline=20.0,
            label="level stepped\ndown: recovers",
            emergency="step_down",
        ),
        PhasePlan(
            "hang_protected",
            "upstream hangs, with breaker",
            protected,
            "hang",
            hang_count,
            concurrency=4,
            pace=0.02 if short else 0.05,
            label="upstream hangs\nwith breaker",
        ),
        PhasePlan(
            "hang_unprotected",
            "upstream hangs, no breaker",
            unprotected,
            "hang",
            hang_count,
            concurrency=4,
            label="upstream hangs\nno breaker",
        ),
        # shop A and shop B at once while HALF_OPEN: the fleet sends half_open_max_calls
        # trial calls in all; then a few more requests per server once it has closed
        PhasePlan(
            "fleet",
            "2 servers, upstream recovers",
            protected,
            "recover",
            4,
            extra=2 if short else 4,
            label="2 shop servers,\nupstream recovers",
            fleet=True,
        ),
        # a second dependency behind one adapter with a breaker per host: one carrier fails,
        # its host's breaker opens, the other carrier keeps quoting
        PhasePlan(
            "per_host",
            "one carrier down: a breaker per host",
            QUOTES_PATH,
            "fail",
            12 if short else 20,
            pace=0.05,
            label="one carrier down,\nbreaker per host",
            per_host=True,
        ),
        # the outbound stages: a 429 with Retry-After and a hanging service, each before and after
        *(PhasePlan(**spec) for spec in demo_stages.stage_plans(short)),
    ]


class Monitor(threading.Thread):
    """Polls ``/breakers/`` every 0.1 s: current state, new transitions, rejection count."""

    def __init__(
        self, base: str, service: str, on_transition: Callable[[dict[str, Any]], None], label: str = "A"
    ) -> None:
        super().__init__(name=f"breaker-monitor-{label}", daemon=True)
        self.label = label  # which shop server: "A" or "B"
        self.base = base
        self.service = service
        self.on_transition = on_transition
        self.state = "?"
        self.seq = 0
        self.rejections = 0
        self.rejections_by_reason: dict[str, int] = {}
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.poll_lock = threading.Lock()
        self.stopping = threading.Event()
        self.paused = threading.Event()

    def pause(self) -> None:
        """Stop the background polls (explicit :meth:`poll` calls still go). Reading
        ``/breakers/`` evaluates the breaker, which may move it (lazy transitions); while
        paused, nothing but the caller's own requests touches it. Returns once no
        background poll is in flight."""
        with self.poll_lock:
            self.paused.set()

    def resume(self) -> None:
        self.paused.clear()

    def poll(self, background: bool = False) -> None:
        """Fetch once; report each new transition exactly once (callers may race).
        A *background* poll does nothing while paused."""
        with self.poll_lock:
            if background and self.paused.is_set():
                return
            reply = http_call("GET", f"{self.base}/breakers/?since={self.seq}", timeout=5.0)
            if reply.status != 200 or not isinstance(reply.data, dict):
                return
            snapshot = reply.data.get("breakers", {}).get(self.service, {})
            entries = reply.data.get("transitions", [])
            with self.lock:
                fresh = [
                    dict(t, server=self.label)
                    for t in entries
                    if t.get("service") == self.service and t["seq"] > self.seq
                ]
                self.seq = max([self.seq] + [t["seq"] for t in entries])
                self.state = snapshot.get("state", self.state)
                self.rejections_by_reason = dict(reply.data.get("rejections", {}).get(self.service, {}))
                self.rejections = sum(self.rejections_by_reason.values())
                self.log.extend(fresh)
            for entry in fresh:
                self.on_transition(entry)

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            self.poll(background=True)

    def closed_since(self, seq: int) -> bool:
        with self.lock:
            return any(t["to"] == "closed" and t["seq"] > seq for t in self.log)


class Demo:
    def __init__(self, args: argparse.Namespace, display: Display) -> None:
        self.args = args
        self.display = display
        self.out_dir: Path = args.out_dir.resolve()  # the children run in REPO
        self.db: Path = self.out_dir / "demo.sqlite3"
        # the Emergency Mode level the demo's servers and commands share (its file backend)
        self.level_file: Path = self.out_dir / "emergency-level.json"
        self.children: list[Child] = []
        self.t0 = time.monotonic()
        self.wall0 = time.time()  # the same instant on the wall clock (the servers' event times)
        self.current: PhaseResult | None = None
        self.current_index = 0
        self.current_total: int | None = None
        self.monitor: Monitor | None = None
        self.order_ids: list[int] = []
        self.order_lock = threading.Lock()
        self.phase_count = 0
        self.operator_states: list[str | None] = []
        self.monitor_b: Monitor | None = None
        # recorded for the picture: when each request was sent (seconds since t0), to which
        # server, and what became of it ("paid", "failed", "rejected", "error")
        self.requests: list[dict[str, Any]] = []
        self.record_lock = threading.Lock()
        # for the picture: what the band shows that no transition says (Emergency Mode
        # holds the breaker OPEN: "frozen" from when the server sees Level 3 until it sees
        # the step-down), as {"t": seconds since t0, "state": str, "note": str}
        self.band_marks: list[dict[str, Any]] = []
        self.emergency_commands: list[dict[str, Any]] = []  # each baldur_emergency run
        # for the picture: each operator command's run, {"start": s, "end": s, "text": str}
        # in seconds since t0 (the demo sends no request meanwhile)
        self.commands: list[dict[str, Any]] = []
        # the shop's carriers, {name: base URL}, in CARRIERS order (the first fails in the
        # per-host phase)
        self.carriers: dict[str, str] = {}

    # -- setup ---------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"  # whatever the caller had set
        env["TESTPROJECT_DB"] = str(self.db)
        # every server and command of the demo shares this level file (never the host's
        # default one, nor a Redis the caller may have configured); the servers re-read
        # it at most 0.5 s after a change
        env["BALDUR_EMERGENCY_BACKEND"] = "file"
        env["BALDUR_EMERGENCY_STATE_FILE"] = str(self.level_file)
        env["BALDUR_EMERGENCY_CACHE_SECONDS"] = "0.5"
        env.update(extra)
        return env

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # a throwaway database per run: with the database store the breaker's state
        # outlives the server, and the demo must start from a fresh CLOSED breaker
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.db}{suffix}").unlink(missing_ok=True)
        (self.out_dir / "timeline.png").unlink(missing_ok=True)  # never show an older run's picture
        self.level_file.unlink(missing_ok=True)  # an interrupted run may have left Level 3 behind
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if migrate.returncode != 0:
            raise SetupError(f"manage.py migrate failed:\n{migrate.stderr[-2000:]}")
        upstream = Child(
            "payments upstream",
            [sys.executable, "-m", "testproject.upstream", "--port", "0", "--exit-with-parent"],
            self.out_dir / "upstream.log",
            self.env(),
        )
        self.children.append(upstream)
        # the shop's shipping carriers: the same stand-in, one process (one host) each
        carriers = {}
        for name in CARRIERS:
            carriers[name] = Child(
                f"carrier {name}",
                [sys.executable, "-m", "testproject.upstream", "--port", "0", "--exit-with-parent"],
                self.out_dir / f"carrier-{name}.log",
                self.env(),
            )
            self.children.append(carriers[name])
        self.upstream = upstream.wait_url(20)
        wait_ready(self.upstream + "/health", upstream, 20)
        self.carriers = {}
        for name, child in carriers.items():
            self.carriers[name] = child.wait_url(20)
            wait_ready(self.carriers[name] + "/health", child, 20)
        shipping = ",".join(f"{name}={url}" for name, url in self.carriers.items())
        # shop A carries phases 1-9; shop B joins it for the fleet phase. Both start now,
        # side by side, on the same database (so the same breaker store).
        # Shop B waits up to 10 s for payments (A: the project's 1.5 s, which the hang phases
        # show): in the fleet phase B's trial calls are held upstream while A gets requests.
        # Shop C (the hang phases of the outbound stages) serves at most THREADS requests at
        # once, like a gunicorn worker with a fixed pool of request threads.
        shops = []
        for name, log, timeout, threads in (
            ("django server", "django.log", None, 0),
            ("django server B", "django-b.log", "10", 0),
            ("django server C", "django-c.log", None, demo_stages.THREADS),
        ):
            extra = {"PAYMENTS_TIMEOUT": timeout} if timeout else {}
            shop = Child(
                name,
                [sys.executable, "-m", "testproject.serve", "--port", "0", "--exit-with-parent"]
                + (["--threads", str(threads)] if threads else []),
                self.out_dir / log,
                self.env(
                    PAYMENTS_URL=self.upstream,
                    SHIPPING_CARRIERS=shipping,
                    BALDUR_CB_SYNC_INTERVAL_SECONDS="0.5",
                    **extra,
                ),
            )
            self.children.append(shop)
            shops.append(shop)
        self.django, self.django_b, self.django_c = shops
        self.base = self.django.wait_url(30)
        self.base_b = self.django_b.wait_url(30)
        self.base_c = self.django_c.wait_url(30)
        wait_ready(self.base + "/breakers/", self.django, 30)
        wait_ready(self.base_b + "/breakers/", self.django_b, 30)
        wait_ready(self.base_c + "/breakers/", self.django_c, 30)

    def stop(self) -> None:
        for monitor in (self.monitor, self.monitor_b):
            if monitor is not None:
                monitor.stopping.set()
        for child in reversed(self.children):
            child.stop()

    def stamp(self, t: float | None = None) -> str:
        """*t* (default: now), seconds since the demo started, as the console shows it; the
        picture's time axis uses the same clock and origin."""
        return f"{self.now() if t is None else t:6.2f}s"

    def now(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self.t0

    def record(self, sent: float, server: str, reply: Reply) -> str:
        """Note one request for the picture; returns its outcome."""
        data = reply.data if isinstance(reply.data, dict) else {}
        served = data.get("served_by")
        if reply.status == 200 and served == "upstream":
            outcome = "paid"
        elif reply.status == 202 and served == "fallback":
            outcome = "rejected" if data.get("rejected") else "failed"
        elif reply.status == 502 and served == "error":
            outcome = "failed"  # the unprotected view: the upstream failed or timed out
        else:
            outcome = "error"
        with self.record_lock:
            self.requests.append({"t": round(sent, 3), "server": server, "outcome": outcome})
        return outcome

    # -- helpers -------------------------------------------------------------------------
    def upstream_stats(self) -> dict[str, Any]:
        reply = http_call("GET", self.upstream + "/control/stats", timeout=5)
        if reply.status != 200:
            raise SetupError(f"upstream stats failed: {reply.error or reply.status}")
        return reply.data

    def set_mode(self, mode: str) -> None:
        reply = http_call("POST", self.upstream + "/control/mode", {"mode": mode}, timeout=5)
        if reply.status != 200:
            raise SetupError(f"could not switch the upstream to {mode!r}: {reply.error or reply.data}")

    def create_orders(self, count: int) -> None:
        while count > 0:
            batch = min(count, 1000)
            reply = http_call("POST", self.base + "/orders/", {"count": batch, "amount_cents": 2599}, timeout=30)
            if reply.status != 201:
                raise SetupError(f"could not create orders: {reply.error or reply.data}")
            self.order_ids.extend(reply.data["ids"])
            count -= batch

    def next_order(self) -> int:
        with self.order_lock:
            if not self.order_ids:
                self.create_orders(100)
            return self.order_ids.pop(0)

    def operator(self, action: str) -> None:
        """Run ``manage.py baldur_force`` in a separate process, as an operator would; the
        running server picks the force up from the shared database on its next consult."""
        argv = [sys.executable, "manage.py", "baldur_force", action, "payments"]
        if action == "open":
            argv += ["--ttl", "1", "--reason", "demo: maintenance window"]
        began = self.now()
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=60)
        self.commands.append({"start": began, "end": self.now(), "text": f"manage.py baldur_force {action} payments"})
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        self.display.line(f"    {self.stamp()}  $ manage.py {' '.join(argv[2:])}  ->  {said[-1] if said else ''}")
        if done.returncode != 0:
            raise SetupError(f"baldur_force {action} failed:\n{done.stderr[-2000:]}")
        wanted = {"open": {"open"}, "release": {"half_open", "closed"}}[action]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self.monitor.poll()
            if self.monitor.state in wanted:
                break
            time.sleep(0.05)  # polling the server's state, bounded
        self.display.line(
            f"    {self.stamp()}  the running server now reports: {self.display.state(self.monitor.state)}"
        )
        self.operator_states.append(self.monitor.state)
        # the server adopted this from the shared store and (rightly) published nothing:
        # show it in the transition list all the same, marked as the operator's
        with self.monitor.lock:
            previous = self.monitor.log[-1]["to"] if self.monitor.log else "closed"
            entry = {
                "service": "payments",
                "from": previous,
                "to": self.monitor.state,
                "trigger": f"baldur_force {action}, another process",
                "seq": self.monitor.seq,
                "at": time.time(),
                "server": "operator",
                "band": "forced_open" if action == "open" else self.monitor.state,
            }
            if entry["from"] != entry["to"]:
                self.monitor.log.append(entry)
            else:
                entry = None
        if entry is not None:
            self.on_transition(entry)

    def on_transition(self, entry: dict[str, Any]) -> None:
        # when it happened, in seconds since t0: the server's event time when it has one
        at = entry.get("at")
        entry["t"] = round(at - self.wall0 if isinstance(at, (int, float)) else self.now(), 3)
        trigger = f"  ({entry['trigger']})" if entry.get("trigger") else ""
        where = (
            f"  [shop {entry['server']}]" if entry.get("server") in ("A", "B") and self.monitor_b is not None else ""
        )
        if self.current is not None:
            self.current.transitions.append(entry)
        d = self.display
        d.line(
            f"    {self.stamp(entry['t'])}  breaker {entry['service']}: {d.state(entry['from'])} -> {d.state(entry['to'])}{trigger}{where}"
        )
        self.refresh()

    def refresh(self) -> None:
        r = self.current
        if r is None:
            return
        state = self.monitor.state if self.monitor else "?"
        total = f"/{self.current_total}" if self.current_total else ""
        d = self.display
        text = (
            f"  [{self.current_index}/{self.phase_count}] sent {r.sent:>3}{total:<4} paid {r.ok:>3}  fallback {r.fallback:>3}"
            f" (rejected fast {r.rejected:>3})  errors {r.errors:>3}  breaker "
        )
        d.progress(d.fit(text, (state or "?").upper(), d.state(state)))

    # -- phases --------------------------------------------------------------------------
    def tally(self, result: PhaseResult, reply: Reply, sent: float, server: str = "A") -> str:
        """Count one answered request into *result* and the picture; returns its outcome."""
        outcome = self.record(sent, server, reply)
        data = reply.data if isinstance(reply.data, dict) else {}
        served = data.get("served_by")
        with self.record_lock:
            result.sent += 1
            result.latencies.append(reply.seconds)
            if reply.status == 200 and served == "upstream":
                result.ok += 1
            elif reply.status == 202 and served == "fallback":
                result.fallback += 1
                if data.get("rejected"):
                    result.rejected += 1
            else:
                result.errors += 1
            if data.get("breaker"):
                result.last_state = data["breaker"]
        self.refresh()
        return outcome

    def run_phase(self, index: int, plan: PhasePlan) -> PhaseResult:
        result = PhaseResult(plan.key, plan.title, started=self.now())
        # no planned total where the requests sent are not the plan's count (the fleet phase sends
        # to two shops; an emergency or stage phase's requests depend on what the servers answer)
        total = (
            2 * ((plan.count or 0) + plan.extra) if plan.fleet else None if plan.emergency or plan.stage else plan.count
        )
        self.current, self.current_index, self.current_total = result, index, total
        if plan.fleet:
            return self.run_fleet(index, plan, result)
        if plan.per_host:
            return self.run_per_host(index, plan, result)
        if plan.stage:
            return demo_stages.run(self, index, plan, result)
        if plan.emergency == "freeze":
            return self.run_freeze(index, plan, result)
        if plan.emergency == "step_down":
            return self.run_step_down(index, plan, result)
        self.display.line(
            self.display.bold(f"Phase {index}/{self.phase_count}: {plan.title}")
            + f"  (upstream mode: {plan.upstream_mode})"
        )
        if plan.operator:
            self.operator(plan.operator)
        marks = self.phase_marks()
        self.set_mode(plan.upstream_mode)
        start_seq = self.monitor.seq if self.monitor else 0
        self.drive(plan, result, start_seq)
        return self.finish(result, marks)

    def phase_marks(self) -> dict[str, Any]:
        """Where the counters stand as a phase starts (for :meth:`finish`)."""
        return {
            "upstream": self.upstream_stats()["charge_requests"],
            "rejections": self.monitor.rejections if self.monitor else 0,
            "reasons": dict(self.monitor.rejections_by_reason) if self.monitor else {},
            "started": time.monotonic(),
        }

    def reasons_since(self, marks: dict[str, Any]) -> dict[str, int]:
        """The server's rejections by reason since *marks* (a :meth:`phase_marks`)."""
        assert self.monitor is not None
        with self.monitor.lock:
            now = dict(self.monitor.rejections_by_reason)
        return {r: n - marks["reasons"].get(r, 0) for r, n in sorted(now.items()) if n > marks["reasons"].get(r, 0)}

    def finish(self, result: PhaseResult, marks: dict[str, Any]) -> PhaseResult:
        """Close the phase: its duration, the upstream's and the server's counts."""
        result.seconds = time.monotonic() - marks["started"]
        if self.monitor:
            self.monitor.poll()  # catch transitions from the last responses
            result.reasons = self.reasons_since(marks)
        result.upstream_counted = self.upstream_stats()["charge_requests"] - marks["upstream"]
        result.server_rejections = (self.monitor.rejections if self.monitor else 0) - marks["rejections"]
        result.ended = self.now()
        self.refresh()
        self.display.end_progress()
        self.current = None
        return result

    def send(self, result: PhaseResult, plan: PhasePlan) -> Reply:
        """One request to shop A for a fresh order, counted into *result*."""
        order = self.next_order()
        sent = self.now()
        reply = http_call("POST", self.base + plan.path.format(id=order), timeout=20)
        self.tally(result, reply, sent)
        return reply

    def drive(self, plan: PhasePlan, result: PhaseResult, start_seq: int) -> None:
        """Send the phase's requests to shop A: ``plan.count`` of them, or (count None)
        until the breaker has closed after transition *start_seq* and ``plan.extra`` more
        (bounded by ``plan.deadline``), from ``plan.concurrency`` workers."""
        lock = threading.Lock()
        budget = {"left": plan.count, "closed_at": None}
        deadline = time.monotonic() + plan.deadline

        def take() -> bool:
            with lock:
                if plan.count is not None:
                    if budget["left"] <= 0:
                        return False
                    budget["left"] -= 1
                    return True
                if time.monotonic() > deadline:
                    return False
                if budget["closed_at"] is None and self.monitor and self.monitor.closed_since(start_seq):
                    budget["closed_at"] = result.sent
                return budget["closed_at"] is None or result.sent < budget["closed_at"] + plan.extra

        def worker() -> None:
            while take():
                self.send(result, plan)
                if plan.pace:
                    time.sleep(plan.pace)  # pacing the load generator, not synchronisation

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(plan.concurrency)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()

    # -- Emergency Mode ------------------------------------------------------------------
    def emergency_command(self, *args: str) -> str:
        """Run ``manage.py baldur_emergency ARGS`` in a separate process, as an operator
        would, on the demo's level file; prints it and its answer, returns the answer."""
        argv = [sys.executable, "manage.py", "baldur_emergency", *args]
        began = self.now()
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=60)
        self.commands.append(
            {"start": began, "end": self.now(), "text": f"manage.py baldur_emergency {' '.join(args[:2])}"}
        )
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        answer = said[-1] if said else ""
        self.display.line(f"    {self.stamp()}  $ manage.py {shlex.join(argv[2:])}  ->  {answer}")
        self.emergency_commands.append(
            {"t": round(self.now(), 3), "args": list(args), "status": done.returncode, "said": answer}
        )
        if done.returncode != 0:
            raise SetupError(f"baldur_emergency {' '.join(args)} failed:\n{done.stderr[-2000:]}")
        return answer

    def server_level(self) -> int | None:
        """The Emergency Mode level shop A's breakers see now (``/emergency/``: it goes
        through the server's level cache and touches no breaker); None when unanswered."""
        reply = http_call("GET", self.base + "/emergency/", timeout=5)
        if reply.status == 200 and isinstance(reply.data, dict):
            return reply.data.get("level")
        return None

    def wait_level(self, wanted: int, timeout: float) -> int | None:
        """Poll shop A until it sees level *wanted* (bounded: the server re-reads the level
        file within BALDUR_EMERGENCY_CACHE_SECONDS); returns the last level it reported."""
        deadline = time.monotonic() + timeout
        while True:
            level = self.server_level()
            if level == wanted or time.monotonic() >= deadline:
                return level
            time.sleep(0.05)  # polling the server's level, bounded

    def run_freeze(self, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
        """Phase 6: the upstream is down, the breaker trips, an operator declares Level 3.

        1. The upstream fails; requests go one at a time until a charge reports the
           breaker OPEN (the trip).
        2. ``manage.py baldur_emergency set 3`` runs in another process. Until shop A
           reports Level 3 (``/emergency/``), nothing asks its breaker anything: the
           breaker moves only when asked (lazy transitions), so its recovery timeout
           cannot pass unobserved into a probe while the level is on its way. Whatever
           the command's start-up costs, the breaker is still OPEN when the level lands.
        3. Requests one at a time until the server has rejected ``plan.count`` of them
           with reason ``frozen`` (its ``/breakers/`` counts rejections by reason): past
           its recovery timeout the breaker would probe, Level 3 holds it OPEN instead.
        4. The upstream is healthy again; ``plan.extra`` more requests: still no trial
           call. The upstream's own counter over steps 3-4 is the figure: 0.
        """
        d = self.display
        assert self.monitor is not None
        monitor = self.monitor
        timeout = self.config["recovery_timeout"]
        d.line(
            d.bold(f"Phase {index}/{self.phase_count}: {plan.title}")
            + "  (upstream mode: fail, later recover; the level is set by manage.py in another process)"
        )
        marks = self.phase_marks()
        self.set_mode("fail")
        figures: dict[str, Any] = {"recovery_timeout": timeout, "tripped": False, "level_seen": None}
        result.emergency = figures
        # 1. the trip
        for _ in range(self.config["failure_threshold"] + 5):
            reply = self.send(result, plan)
            if isinstance(reply.data, dict) and reply.data.get("breaker") == "open":
                figures["tripped"] = True
                break
            time.sleep(plan.pace)  # pacing the load generator, not synchronisation
        tripped_at = self.now()
        if not figures["tripped"]:
            return self.finish(result, marks)
        # 2. Level 3 from another process; no background poll until the server sees it
        monitor.poll()  # the trip's transition, printed before the command
        monitor.pause()
        try:
            self.emergency_command(
                "set", "3", "--minutes", "5", "--reason", "demo: payments outage, hold every breaker"
            )
            figures["level_seen"] = self.wait_level(3, 10)
        finally:
            monitor.resume()
        if figures["level_seen"] != 3:
            d.line(f"    {self.stamp()}  shop A still reports emergency level {figures['level_seen']}")
            return self.finish(result, marks)
        frozen_at = self.now()
        self.band_marks.append({"t": frozen_at, "state": "frozen", "note": "Emergency Level 3"})
        upstream_at_freeze = self.upstream_stats()["charge_requests"]
        d.line(
            f"    {self.stamp()}  shop A now sees emergency level 3: the breaker stays {d.state('open')} "
            f"({d.state('frozen')}); past its {timeout:g} s recovery timeout it lets no trial call through"
        )
        # 3. held past the recovery timeout: rejections with reason frozen
        states: dict[str, int] = {}
        sent_frozen = 0

        def frozen_so_far() -> int:
            monitor.poll()
            return self.reasons_since(marks).get("frozen", 0)

        deadline = time.monotonic() + timeout + 10
        while frozen_so_far() < (plan.count or 1) and time.monotonic() < deadline:
            reply = self.send(result, plan)
            sent_frozen += 1
            state = reply.data.get("breaker", "?") if isinstance(reply.data, dict) else "?"
            states[state] = states.get(state, 0) + 1
            time.sleep(plan.pace)  # pacing the load generator, not synchronisation
        # 4. the upstream is healthy again; Level 3 still holds
        self.set_mode("recover")
        d.line(
            f"    {self.stamp()}  the payments service is healthy again; {plan.extra} more requests while Level 3 holds"
        )
        sent_healthy = 0
        for _ in range(plan.extra):
            reply = self.send(result, plan)
            sent_healthy += 1
            state = reply.data.get("breaker", "?") if isinstance(reply.data, dict) else "?"
            states[state] = states.get(state, 0) + 1
            time.sleep(plan.pace)  # pacing the load generator, not synchronisation
        monitor.poll()
        reasons = self.reasons_since(marks)
        figures.update(
            {
                "level_seen": 3,
                "held_open_seconds": round(self.now() - tripped_at, 3),
                "sent_during_freeze": sent_frozen + sent_healthy,
                "sent_while_upstream_healthy": sent_healthy,
                "frozen_rejections": reasons.get("frozen", 0),
                "server_rejections_by_reason": reasons,
                "states_during_freeze": states,
                "upstream_during_freeze": self.upstream_stats()["charge_requests"] - upstream_at_freeze,
                "frozen_from": round(frozen_at, 3),
            }
        )
        d.line(
            f"    {self.stamp()}  shop A's /breakers/ counts its rejections by reason: "
            + ", ".join(f"{r} {n}" for r, n in reasons.items())
            + f"; the upstream counted {figures['upstream_during_freeze']} calls for the {figures['sent_during_freeze']} "
            f"requests sent since Level 3 (breaker OPEN for {figures['held_open_seconds']:.1f} s now)"
        )
        return self.finish(result, marks)

    def run_step_down(self, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
        """Phase 7: ``manage.py baldur_emergency step-down`` (Level 3 -> 2, which freezes
        nothing): the breaker probes the healthy upstream and closes; then
        ``baldur_emergency set 0`` ends the emergency, so the phases after run at level 0.
        As in phase 6, nothing asks the breaker anything until the server sees level 2,
        so the picture's frozen span ends where the server's freeze did."""
        d = self.display
        assert self.monitor is not None
        monitor = self.monitor
        d.line(d.bold(f"Phase {index}/{self.phase_count}: {plan.title}") + f"  (upstream mode: {plan.upstream_mode})")
        marks = self.phase_marks()
        self.set_mode(plan.upstream_mode)
        start_seq = monitor.seq
        figures: dict[str, Any] = {}
        result.emergency = figures
        monitor.pause()
        try:
            self.emergency_command("step-down")
            figures["level_after_step_down"] = self.wait_level(2, 10)
        finally:
            monitor.resume()
        self.band_marks.append({"t": self.now(), "state": "open", "note": "stepped down to level 2"})
        d.line(
            f"    {self.stamp()}  shop A now sees emergency level {figures['level_after_step_down']}: the freeze is lifted "
            f"(levels 1 and 2 change no breaker behaviour), the breaker may probe"
        )
        self.drive(plan, result, start_seq)
        self.emergency_command("set", "0")
        figures["level_at_end"] = self.wait_level(0, 10)
        d.line(f"    {self.stamp()}  shop A now sees emergency level {figures['level_at_end']}")
        return self.finish(result, marks)

    def run_fleet(self, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
        """Phase 10: shops A and B, one breaker store, the upstream recovering.

        With the breaker HALF_OPEN and the upstream holding every charge that reaches it,
        ``plan.count`` requests go to shop B at once: the shared store admits
        ``half_open_max_calls`` of them as trial calls (held upstream) and B refuses the
        rest. Then ``plan.count`` requests go to shop A at once, while those trial calls are
        still in flight: the fleet's allowance is used up, so A refuses every one. Only then
        does the upstream answer the held calls; they succeed and the breaker closes. The
        upstream's own count over the round is how many trial calls the whole fleet made.
        Nothing here races: each step waits for the previous one's answers, and shop B
        (which never meets a hanging upstream) waits up to 10 s for payments, so a held
        trial call cannot time out. Last, once both shops report CLOSED, ``plan.extra``
        more requests per shop show the fleet serving again.
        """
        d = self.display
        max_calls = self.config["half_open_max_calls"]
        d.line(
            d.bold(f"Phase {index}/{self.phase_count}: {plan.title}")
            + "  (shops A and B share the breaker through the database; upstream mode: recover)"
        )
        assert self.monitor is not None
        self.monitor_b = Monitor(self.base_b, "payments", self.on_transition, label="B")
        self.monitor_b.poll()
        self.monitor_b.start()
        monitors = (self.monitor, self.monitor_b)
        rejections_before = sum(m.rejections for m in monitors)
        reasons_before = [dict(m.rejections_by_reason) for m in monitors]
        before = self.upstream_stats()["charge_requests"]
        self.set_control("hold")
        self.set_mode(plan.upstream_mode)
        started = time.monotonic()
        # the hang phase left the breaker OPEN; its recovery timeout has passed or soon will
        state = self.wait_state(self.monitor, {"half_open"}, 15)
        if state != "half_open":
            self.set_control("release")
            raise SetupError(f"fleet phase: the breaker is {state!r}, not HALF_OPEN, so there is nothing to probe")
        d.line(
            f"    {self.stamp()}  breaker HALF_OPEN for the whole fleet (half_open_max_calls = {max_calls}); "
            f"the upstream holds each call it gets"
        )

        answered = threading.Condition()
        outcomes: list[tuple[str, str]] = []  # (server, outcome)

        def burst(server: str, base: str) -> list[threading.Thread]:
            orders = [self.next_order() for _ in range(plan.count or 0)]
            barrier = threading.Barrier(len(orders))

            def one(order: int) -> None:
                barrier.wait(timeout=30)
                sent = self.now()
                reply = http_call("POST", f"{base}{plan.path.format(id=order)}", timeout=30)
                outcome = self.tally(result, reply, sent, server)
                with answered:
                    outcomes.append((server, outcome))
                    answered.notify_all()

            threads = [threading.Thread(target=one, args=(order,), daemon=True) for order in orders]
            for thread in threads:
                thread.start()
            return threads

        def wait_until(predicate: Callable[[], bool], seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while not predicate() and time.monotonic() < deadline:
                with answered:
                    answered.wait(timeout=0.05)

        def answered_by(server: str) -> int:
            with answered:
                return sum(1 for s, _ in outcomes if s == server)

        count = plan.count or 0
        # shop B first: the store admits the round's trial calls, B refuses the rest
        workers = burst("B", self.base_b)
        wait_until(lambda: answered_by("B") >= count - max_calls and self.upstream_stats()["held"] >= max_calls, 15)
        held = self.upstream_stats()["held"]
        d.line(
            f"    {self.stamp()}  shop B got {count} requests at once: the upstream holds {held} trial call(s), "
            f"B refused {answered_by('B')}"
        )
        # shop A while those are in flight: nothing left to admit for the fleet
        workers += burst("A", self.base)
        wait_until(lambda: answered_by("A") >= count, 15)
        d.line(
            f"    {self.stamp()}  shop A got {count} requests at once: A refused {answered_by('A')}, "
            f"the upstream still holds {self.upstream_stats()['held']}"
        )
        burst_upstream = self.upstream_stats()["charge_requests"] - before
        released = self.set_control("release")
        for thread in workers:
            thread.join(timeout=40)
        for monitor in monitors:
            monitor.poll()
        reasons = sorted(
            {
                r
                for m, old in zip(monitors, reasons_before, strict=True)
                for r, n in m.rejections_by_reason.items()
                if n > old.get(r, 0)
            }
        )
        trial_by_server = {name: sum(1 for s, o in outcomes if s == name and o != "rejected") for name in ("A", "B")}
        d.line(
            f"    {self.stamp()}  released the {released.get('released', '?')} held call(s): for {2 * count} requests "
            f"to two shops the upstream counted {burst_upstream} trial call(s); the rest were refused "
            f"({', '.join(reasons) or '?'})"
        )
        # both shops must see the close (A learns it from the store at its next consult)
        states = (self.wait_state(self.monitor, {"closed"}, 10), self.wait_state(self.monitor_b, {"closed"}, 10))
        d.line(
            f"    {self.stamp()}  shop A reports {d.state(states[0])}, shop B reports {d.state(states[1])}; "
            f"{plan.extra} more requests to each"
        )
        after = {"sent": 0, "paid": 0}
        for _ in range(plan.extra):
            for server, base in (("A", self.base), ("B", self.base_b)):
                sent = self.now()
                reply = http_call("POST", f"{base}{plan.path.format(id=self.next_order())}", timeout=20)
                after["sent"] += 1
                after["paid"] += self.tally(result, reply, sent, server) == "paid"
        result.seconds = time.monotonic() - started
        for monitor in monitors:
            monitor.poll()
        result.upstream_counted = self.upstream_stats()["charge_requests"] - before
        result.server_rejections = sum(m.rejections for m in monitors) - rejections_before
        result.fleet = {
            "servers": 2,
            "half_open_max_calls": max_calls,
            "burst_sent": 2 * count,
            "burst_sent_by_server": {"A": count, "B": count},
            "burst_upstream": burst_upstream,
            "burst_rejected": sum(1 for _, o in outcomes if o == "rejected"),
            "burst_paid": sum(1 for _, o in outcomes if o == "paid"),
            "trial_calls_by_server": trial_by_server,
            "rejection_reasons": reasons,
            "states_after": {"A": states[0], "B": states[1]},
            "after_sent": after["sent"],
            "after_paid": after["paid"],
        }
        result.ended = self.now()
        self.refresh()
        d.end_progress()
        self.current = None
        return result

    # -- per-host breakers ----------------------------------------------------------------
    def carrier_stats(self, name: str) -> dict[str, Any]:
        reply = http_call("GET", self.carriers[name] + "/control/stats", timeout=5)
        if reply.status != 200:
            raise SetupError(f"carrier {name} stats failed: {reply.error or reply.status}")
        return reply.data

    def run_per_host(self, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
        """Phase 11: shipping quotes from two carriers, one breaker per host.

        Shop A's ``/orders/<id>/shipping-quotes/`` asks each carrier (its own stand-in
        process, its own port) through one ``BreakerAdapter()`` with no service name, so
        each host gets a breaker named after it (``"127.0.0.1:PORT"``, package defaults:
        5 failures in a row open it, 60 s before a trial call). The first carrier answers
        503, the second stays healthy; ``plan.count`` requests go one at a time. The
        figures come from the carriers' own counters: the failing host counts no call
        once its breaker is OPEN, and the healthy host answered every call it got.
        """
        d = self.display
        failing, healthy = list(self.carriers)
        hosts = {name: urlsplit(url).netloc.lower() for name, url in self.carriers.items()}
        d.line(
            d.bold(f"Phase {index}/{self.phase_count}: {plan.title}")
            + f"  (carrier {failing} at {hosts[failing]} answers 503, {healthy} at {hosts[healthy]} stays healthy)"
        )
        for name, mode in ((failing, "fail"), (healthy, "ok")):
            reply = http_call("POST", self.carriers[name] + "/control/mode", {"mode": mode}, timeout=5)
            if reply.status != 200:
                raise SetupError(f"could not switch carrier {name} to {mode!r}: {reply.error or reply.data}")
        monitors = {name: Monitor(self.base, hosts[name], self.on_transition, label="A") for name in self.carriers}
        for monitor in monitors.values():
            monitor.poll()
            monitor.start()
        before = {name: self.carrier_stats(name)["quote_requests"] for name in self.carriers}
        started = time.monotonic()
        calls = {name: {"quoted": 0, "failed": 0, "rejected": 0, "error": 0} for name in self.carriers}
        states: dict[str, list[str]] = {name: [] for name in self.carriers}
        reported: set[str] = set()  # the breaker names the shop's answers carried
        at_open: int | None = None  # the failing carrier's count when its breaker was first seen OPEN
        sent_after_open = 0
        for _ in range(plan.count or 0):
            order = self.next_order()
            sent = self.now()
            reply = http_call("GET", self.base + plan.path.format(id=order), timeout=20)
            data = reply.data if isinstance(reply.data, dict) else {}
            quotes = data.get("quotes") if isinstance(data.get("quotes"), dict) else {}
            with self.record_lock:
                result.sent += 1
                result.latencies.append(reply.seconds)
                if reply.status == 200 and data.get("best"):
                    result.ok += 1
                else:
                    result.errors += 1
                for name in self.carriers:
                    answer = quotes.get(name) if isinstance(quotes.get(name), dict) else {}
                    if answer.get("status") == "quoted":
                        outcome = "quoted"
                    elif answer.get("status") == "unavailable":
                        outcome = "rejected" if answer.get("rejected") else "failed"
                    else:
                        outcome = "error"
                    calls[name][outcome] += 1
                    result.rejected += outcome == "rejected"
                    states[name].append(answer.get("breaker_state", "?"))
                    if answer.get("breaker"):
                        reported.add(answer["breaker"])
                    self.requests.append({"t": round(sent, 3), "server": "A", "host": hosts[name], "outcome": outcome})
            if at_open is not None:
                sent_after_open += 1
            elif states[failing][-1] == "open":
                at_open = self.carrier_stats(failing)["quote_requests"] - before[failing]
            self.refresh()
            time.sleep(plan.pace)  # pacing the load generator, not synchronisation
        result.seconds = time.monotonic() - started
        counted = {name: self.carrier_stats(name)["quote_requests"] - before[name] for name in self.carriers}
        for monitor in monitors.values():
            monitor.stopping.set()
            monitor.poll()
        snapshot = http_call("GET", self.base + "/breakers/", timeout=5)
        listed = snapshot.data.get("breakers", {}) if snapshot.status == 200 and isinstance(snapshot.data, dict) else {}
        result.upstream_counted = sum(counted.values())
        result.server_rejections = sum(m.rejections for m in monitors.values())
        result.reasons = {}
        for monitor in monitors.values():
            for reason, n in monitor.rejections_by_reason.items():
                result.reasons[reason] = result.reasons.get(reason, 0) + n
        result.per_host = {
            "failing": failing,
            "healthy": healthy,
            "breakers": {name: hosts[name] for name in self.carriers},
            "breakers_reported": sorted(reported),
            "states_after": {name: listed.get(hosts[name], {}).get("state") for name in self.carriers},
            "config": listed.get(hosts[failing], {}).get("config", {}),
            "calls": calls,
            "upstream_counted": counted,
            "failing_counted_when_open": at_open,
            "failing_counted_while_open": None if at_open is None else counted[failing] - at_open,
            "sent_while_open": sent_after_open,
            "transitions": {
                name: [
                    {"from": t["from"], "to": t["to"], "trigger": t.get("trigger"), "t": t.get("t")}
                    for t in monitors[name].log
                ]
                for name in self.carriers
            },
        }
        figures = result.per_host
        d.line(
            f"    {self.stamp()}  shop A's /breakers/ lists one breaker per host: "
            + ", ".join(f"{hosts[n]} ({n}) {d.state(figures['states_after'][n])}" for n in self.carriers)
        )
        d.line(
            f"    {self.stamp()}  {failing} counted {counted[failing]} quote requests for {result.sent} sent "
            f"({figures['failing_counted_while_open']} after its breaker opened, {sent_after_open} requests later); "
            f"{healthy} counted {counted[healthy]} and answered {calls[healthy]['quoted']}"
        )
        result.ended = self.now()
        self.refresh()
        d.end_progress()
        self.current = None
        return result

    def wait_state(self, monitor: Monitor, wanted: set[str], timeout: float) -> str:
        """Poll *monitor* until its server reports a state in *wanted* (bounded); returns the last state."""
        deadline = time.monotonic() + timeout
        while True:
            monitor.poll()
            if monitor.state in wanted or time.monotonic() >= deadline:
                return monitor.state
            time.sleep(0.05)  # polling the server's state, bounded

    def set_control(self, action: str) -> dict[str, Any]:
        """``POST /control/hold`` or ``/control/release`` on the upstream."""
        reply = http_call("POST", f"{self.upstream}/control/{action}", timeout=5)
        if reply.status != 200:
            raise SetupError(f"upstream {action} failed: {reply.error or reply.data}")
        return reply.data

    def run(self) -> tuple[int, dict[str, Any]]:
        d = self.display
        d.line(d.bold("baldur_django demo") + ": a Django shop calling a flaky payments service over real HTTP")
        d.line(
            f"  starting six servers: the payments and two carrier stand-ins, shops A, B and C (logs in {self.out_dir}) ..."
        )
        self.start()
        breaker = http_call("GET", self.base + "/breakers/").data["breakers"]["payments"]
        config = self.config = breaker["config"]
        d.line(f"  shop A {self.base}  ->  payments {self.upstream}   (breaker state store: {breaker['backend']})")
        fleet_phase = next(i for i, p in enumerate(plans(self.args.short), 1) if p.fleet)
        d.line(f"  shop B {self.base_b}  (same database: joins in phase {fleet_phase})")
        first_stage = next(i for i, p in enumerate(plans(self.args.short), 1) if p.stage)
        d.line(
            f"  shop C {self.base_c}  (same database, {demo_stages.THREADS} request threads: "
            f"the hanging-service phases from phase {first_stage + 2})"
        )
        d.line(
            "  shipping carriers "
            + ", ".join(f"{name} {url}" for name, url in self.carriers.items())
            + "  (one breaker per host: BreakerAdapter() with no service name)"
        )
        d.line(
            f"  breaker 'payments': opens after {config['failure_threshold']} failures in a row, waits "
            f"{config['recovery_timeout']:g} s, closes after {config['half_open_max_calls']} successful probes"
        )
        d.line()
        phase_plans = plans(self.args.short)
        self.phase_count = len(phase_plans)
        self.create_orders(
            sum(2 * ((p.count or 0) + p.extra) if p.fleet or p.stage else (p.count or 60) for p in phase_plans)
        )
        self.monitor = Monitor(self.base, "payments", self.on_transition)
        self.monitor.poll()
        self.monitor.start()
        results = [self.run_phase(i, plan) for i, plan in enumerate(phase_plans, 1)]
        self.results, self.plans = results, phase_plans
        self.monitor.stopping.set()
        if self.monitor_b is not None:
            self.monitor_b.stopping.set()
        return self.report(results, breaker)

    # -- summary -------------------------------------------------------------------------
    def report(self, results: list[PhaseResult], breaker: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        d = self.display
        by_key = {r.key: r for r in results}
        problems: list[str] = []
        # both shops' transitions, in the order they happened (each is published only by the
        # server whose store operation made it)
        transitions = list(self.monitor.log) if self.monitor else []
        if self.monitor_b is not None:
            transitions = sorted(transitions + list(self.monitor_b.log), key=lambda t: t.get("t", 0.0))
        self.transitions = transitions
        pairs = [(t["from"], t["to"]) for t in transitions]

        # expectation 1: CLOSED -> OPEN -> HALF_OPEN -> CLOSED, in that order, by the end of phase 3
        early = [(t["from"], t["to"]) for r in results[:3] for t in r.transitions]
        position = 0
        for pair in early:
            if position < len(EXPECTED) and pair == EXPECTED[position]:
                position += 1
        if position < len(EXPECTED):
            missing = " -> ".join(f"{a}->{b}" for a, b in EXPECTED[position:])
            problems.append(f"expected transitions not observed in phases 1-3: {missing}")
        healthy, failing, hang_on, hang_off = (
            by_key["healthy"],
            by_key["failing"],
            by_key["hang_protected"],
            by_key["hang_unprotected"],
        )
        if healthy.ok != healthy.sent:
            problems.append(f"healthy phase: {healthy.ok} of {healthy.sent} requests were paid by the upstream")
        if failing.rejected == 0:
            problems.append("failing phase: no request was rejected fast by the open breaker")
        if not failing.upstream_counted < failing.sent:
            problems.append(
                f"failing phase: the upstream saw {failing.upstream_counted} of {failing.sent} requests (expected fewer)"
            )
        for r in (failing, by_key["recovering"], hang_on):
            if r.errors:
                problems.append(f"{r.title}: {r.errors} requests got neither the upstream's answer nor the fallback")
        if ("closed", "open") not in [(t["from"], t["to"]) for t in hang_on.transitions]:
            problems.append("hang phase with breaker: the breaker did not open")
        forced = by_key["operator_forced"]
        if self.operator_states[:1] != ["open"]:
            problems.append("operator phase: the running server did not report the forced OPEN state")
        elif forced.upstream_counted != 0 or forced.fallback != forced.sent:
            problems.append(
                f"operator phase: while forced open the upstream saw {forced.upstream_counted} requests and "
                f"{forced.fallback} of {forced.sent} got the fallback"
            )
        if ("half_open", "closed") not in [(t["from"], t["to"]) for t in by_key["operator_released"].transitions]:
            problems.append("operator phase: after the release the breaker did not close through HALF_OPEN probes")
        problems += self.emergency_problems(by_key["emergency"], by_key["emergency_step_down"])
        on_ms, off_ms = hang_on.median_ms, hang_off.median_ms
        if on_ms is None or off_ms is None or not on_ms < off_ms:
            problems.append(f"median latency while hanging: with breaker {on_ms} ms is not below without {off_ms} ms")
        fleet = by_key["fleet"].fleet
        if fleet["burst_upstream"] != fleet["half_open_max_calls"]:
            problems.append(
                f"fleet phase: the upstream counted {fleet['burst_upstream']} trial calls from two shops sharing the "
                f"store, expected exactly half_open_max_calls = {fleet['half_open_max_calls']} for the whole fleet"
            )
        if fleet["burst_rejected"] != fleet["burst_sent"] - fleet["half_open_max_calls"]:
            problems.append(
                f"fleet phase: {fleet['burst_rejected']} of {fleet['burst_sent']} requests were rejected fast "
                f"while HALF_OPEN, expected {fleet['burst_sent'] - fleet['half_open_max_calls']}"
            )
        if ("half_open", "closed") not in [(t["from"], t["to"]) for t in by_key["fleet"].transitions]:
            problems.append("fleet phase: the trial calls did not close the breaker")
        if fleet["states_after"] != {"A": "closed", "B": "closed"} or fleet["after_paid"] != fleet["after_sent"]:
            problems.append(
                f"fleet phase: after the close the shops reported {fleet['states_after']} and "
                f"{fleet['after_paid']} of {fleet['after_sent']} requests were paid"
            )
        problems += self.per_host_problems(by_key["per_host"])
        problems += demo_stages.problems(by_key)
        log_lines = self.breaker_log_lines()
        if not any("circuit_breaker.opened" in line for line in log_lines):
            problems.append("no 'circuit_breaker.opened' line on the server's stderr")

        d.line()
        d.line(d.bold("Summary"))
        for line in summary_table(results):
            d.line(line)
        total = {
            k: sum(getattr(r, k) for r in results)
            for k in ("sent", "upstream_counted", "ok", "fallback", "rejected", "errors")
        }
        d.line()
        chain = " -> ".join(d.state(s) for s in ([pairs[0][0]] + [b for _, b in pairs])) if pairs else "(none)"
        d.line(f"  breaker transitions: {chain}")
        if on_ms is not None and off_ms is not None:
            factor = f"  ({off_ms / on_ms:.0f}x faster with the breaker)" if on_ms > 0 and on_ms < off_ms else ""
            d.line(
                f"  median latency while the upstream hangs: {on_ms:.0f} ms with the breaker, {off_ms:.0f} ms without{factor}"
            )
        per_host_phase = next(i for i, r in enumerate(results, 1) if r.key == "per_host")
        d.line(
            f"  rejected fast: {total['rejected']} (by an open breaker, and from phase {per_host_phase + 1} by the "
            f"outbound stages; in phase {per_host_phase} calls to a carrier; server-side count: "
            f"{sum(r.server_rejections for r in results)})"
        )
        d.line(
            f"  fallbacks served: {total['fallback']}; the upstreams counted {total['upstream_counted']} calls "
            f"(charges, the carriers' quotes in phase {per_host_phase}, rate lookups after it) for {total['sent']} "
            "requests sent"
        )
        d.line(
            f"  fleet of two shops, breaker HALF_OPEN: {fleet['burst_sent']} requests, the upstream counted "
            f"{fleet['burst_upstream']} trial calls (half_open_max_calls = {fleet['half_open_max_calls']} for the whole fleet, "
            f"not per server: shop A sent {fleet['trial_calls_by_server']['A']}, shop B {fleet['trial_calls_by_server']['B']})"
        )
        per_host = by_key["per_host"].per_host
        if per_host:
            bad, good = per_host["failing"], per_host["healthy"]
            d.line(
                f"  one carrier down, a breaker per host (BreakerAdapter() with no service name): "
                f"{per_host['breakers'][bad]} ({bad}, answering 503) {d.state(per_host['states_after'][bad])} after "
                f"{per_host['failing_counted_when_open']} calls, then no call for {per_host['sent_while_open']} more requests "
                f"(its counter: {per_host['failing_counted_while_open']} more); {per_host['breakers'][good]} ({good}) "
                f"{d.state(per_host['states_after'][good])}, {per_host['calls'][good]['quoted']} of "
                f"{by_key['per_host'].sent} quotes answered"
            )
        for line in demo_stages.summary_lines(by_key):
            d.line(line)
        freeze = by_key["emergency"].emergency
        if freeze.get("frozen_rejections"):
            d.line(
                f"  Emergency Level 3 (manage.py baldur_emergency set 3, another process): the breaker stayed OPEN "
                f"{freeze['held_open_seconds']:.1f} s, past its {freeze['recovery_timeout']:g} s recovery timeout; shop A "
                f"rejected {freeze['frozen_rejections']} requests with reason 'frozen', and the upstream counted "
                f"{freeze['upstream_during_freeze']} calls during the freeze ({freeze['sent_while_upstream_healthy']} requests "
                f"sent while it was healthy again); after a step-down to level 2 the breaker probed and "
                + (
                    "closed"
                    if "half_open->closed" in by_key["emergency_step_down"].as_dict()["transitions"]
                    else "did NOT close"
                )
            )
        if log_lines:
            d.line(f"  breaker log lines on the server's stderr ({self.out_dir / 'django.log'}):")
            for line in log_lines[:12]:
                d.line("    " + line)
            if len(log_lines) > 12:
                d.line(f"    ... {len(log_lines) - 12} more")
        d.line()
        if problems:
            d.line(d.paint("RESULT: FAILED", "31;1"))
            for problem in problems:
                d.line("  - " + problem)
        else:
            d.line(
                d.paint("RESULT: OK", "32;1")
                + " - the breaker tripped, served fallbacks, recovered, obeyed an operator's force,"
                " held OPEN under Emergency Level 3 and recovered after the step-down, kept latency low while the upstream"
                " hung, two servers shared one round of trial calls, a failing carrier tripped only its own"
                " host's breaker, a request deadline with the Retry-After gate kept a 429 from holding web requests,"
                " and a bulkhead kept a hanging service from taking every request thread"
            )
        summary = {
            "ok": not problems,
            "problems": problems,
            "mode": "short" if self.args.short else "full",
            "config": breaker["config"],
            "backend": breaker.get("backend"),
            "transitions": [
                {
                    "from": t["from"],
                    "to": t["to"],
                    "trigger": t.get("trigger"),
                    "at": t.get("at"),
                    "server": t.get("server"),
                }
                for t in transitions
            ],
            "phases": {r.key: r.as_dict() for r in results},
            "totals": {
                "sent": total["sent"],
                "upstream_counted": total["upstream_counted"],
                "paid": total["ok"],
                "fallbacks": total["fallback"],
                "rejected_fast": total["rejected"],
                "server_rejections": sum(r.server_rejections for r in results),
                "errors": total["errors"],
            },
            "hang_median_ms": {
                "protected": hang_on.as_dict()["median_ms"],
                "unprotected": hang_off.as_dict()["median_ms"],
            },
            "emergency_commands": list(self.emergency_commands),
            "log_lines": log_lines,
        }
        return (1 if problems else 0), summary

    @staticmethod
    def emergency_problems(freeze: PhaseResult, step_down: PhaseResult) -> list[str]:
        """What went wrong in the Emergency Mode phases, as report lines."""
        f, s = freeze.emergency, step_down.emergency
        if not f.get("tripped"):
            return ["emergency phase: the breaker did not trip while the upstream failed"]
        if f.get("level_seen") != 3:
            return [
                f"emergency phase: the server reported level {f.get('level_seen')} after baldur_emergency set 3, not 3"
            ]
        problems = []
        if not f["frozen_rejections"]:
            problems.append("emergency phase: no request was rejected with reason 'frozen' while Level 3 held")
        if f["upstream_during_freeze"]:
            problems.append(
                f"emergency phase: the upstream counted {f['upstream_during_freeze']} calls during the freeze, expected none"
            )
        if set(f["states_during_freeze"]) != {"open"}:
            problems.append(
                f"emergency phase: during the freeze the breaker reported {f['states_during_freeze']}, expected OPEN only"
            )
        if freeze.errors or freeze.fallback != freeze.sent:
            problems.append(
                f"emergency phase: {freeze.fallback} of {freeze.sent} requests got the fallback, {freeze.errors} no answer"
            )
        if s.get("level_after_step_down") != 2:
            problems.append(
                f"step-down phase: the server reported level {s.get('level_after_step_down')} after the step-down, not 2"
            )
        if ("half_open", "closed") not in [(t["from"], t["to"]) for t in step_down.transitions]:
            problems.append("step-down phase: the breaker did not close through HALF_OPEN probes after the step-down")
        if "frozen" in step_down.reasons:
            problems.append(
                f"step-down phase: {step_down.reasons['frozen']} rejections with reason 'frozen' after the step-down"
            )
        if s.get("level_at_end") != 0:
            problems.append(
                f"step-down phase: the server reported level {s.get('level_at_end')} after baldur_emergency set 0"
            )
        return problems

    @staticmethod
    def per_host_problems(phase: PhaseResult) -> list[str]:
        """What went wrong in the per-host phase, as report lines."""
        f = phase.per_host
        if not f:
            return ["per-host phase: it did not run"]
        bad, good = f["failing"], f["healthy"]
        problems = []
        if set(f["breakers_reported"]) != set(f["breakers"].values()):
            problems.append(
                f"per-host phase: the shop reported breakers {f['breakers_reported']}, "
                f"expected one per host {sorted(f['breakers'].values())}"
            )
        if f["states_after"] != {bad: "open", good: "closed"}:
            problems.append(
                f"per-host phase: the host breakers ended {f['states_after']}, expected {bad} OPEN, {good} CLOSED"
            )
        if f["failing_counted_when_open"] is None or not f["sent_while_open"]:
            problems.append(f"per-host phase: no request was sent while {bad}'s breaker was OPEN")
        elif f["failing_counted_while_open"] != 0:
            problems.append(
                f"per-host phase: {bad} counted {f['failing_counted_while_open']} calls while its breaker was OPEN, expected none"
            )
        if f["calls"][good]["quoted"] != phase.sent or f["upstream_counted"][good] != phase.sent:
            problems.append(
                f"per-host phase: {good} answered {f['calls'][good]['quoted']} and counted {f['upstream_counted'][good]} "
                f"of {phase.sent} quote requests, expected all"
            )
        if phase.errors:
            problems.append(f"per-host phase: {phase.errors} requests got no quote at all")
        return problems

    def timeline_data(self) -> dict[str, Any]:
        """What :func:`testproject.timeline.draw` needs, from what this run recorded.

        Every time is in seconds since the demo started, the clock of the console's
        timestamps (:meth:`stamp`), so an event printed at 19.2 s is drawn at 19.2 s. A
        phase whose view has no breaker (the unprotected hang phase) is marked
        ``"breaker": False`` and gets no state band. The per-host phase uses the carriers'
        breakers, not ``payments``: its phase carries ``"bands"``, one per host breaker,
        and its requests are the shop's calls to each carrier (``"host"``)."""
        origin = 0.0  # the demo's own t0: the console's clock
        phases = []
        for plan, r in zip(self.plans, self.results, strict=False):
            phase = {
                "key": plan.key,
                "label": plan.label or plan.title,
                "title": plan.title,
                "start": r.started - origin,
                "end": r.ended - origin,
                "breaker": plan.path in (PROTECTED_PATH, QUOTES_PATH) or bool(plan.stage),
            }
            if plan.stage:  # its own breakers, one strip per shop, and the time each request was held
                phase["bands"] = r.stages.get("bands", [])
                phase["held"] = True
                phase["deadline"] = r.stages.get("deadline")
            if plan.per_host:
                phase["bands"] = [
                    {
                        "name": f"{host} ({carrier})",
                        # a breaker made by the adapter on the phase's first call: CLOSED
                        "states": [{"t": r.started - origin, "state": "closed"}]
                        + [
                            {"t": t["t"] - origin, "state": t["to"], "note": t.get("trigger") or ""}
                            for t in r.per_host.get("transitions", {}).get(carrier, [])
                            if isinstance(t.get("t"), (int, float))
                        ],
                    }
                    for carrier, host in r.per_host.get("breakers", {}).items()
                ]
            phases.append(phase)
        states = [{"t": 0.0, "state": "closed"}]  # a fresh database: the breaker starts CLOSED
        for t in self.transitions:
            states.append({"t": t["t"] - origin, "state": t.get("band", t["to"]), "note": t.get("trigger", "")})
        for mark in self.band_marks:  # Emergency Mode: the span the server held the breaker frozen
            states.append({"t": mark["t"] - origin, "state": mark["state"], "note": mark["note"]})
        commands = [dict(c, start=c["start"] - origin, end=c["end"] - origin) for c in self.commands]
        requests = [
            {
                "t": r["t"] - origin,
                "outcome": r["outcome"],
                **{k: r[k] for k in ("host", "held", "probe") if k in r},
            }
            for r in self.requests
        ]
        by_key = {r.key: r for r in self.results}
        config = self.config
        notes = []
        trip = next((t for t in self.transitions if (t["from"], t["to"]) == ("closed", "open")), None)
        if trip is not None:
            notes.append(
                {
                    "t": trip["t"] - origin,
                    "text": f"{config['failure_threshold']} failures in a row:\nthe breaker opens",
                }
            )
        reopened = next((t for t in self.transitions if (t["from"], t["to"]) == ("half_open", "open")), None)
        if reopened is not None:
            notes.append({"t": reopened["t"] - origin, "text": "a trial call fails:\nOPEN again"})
        recovered = next((t for t in by_key["recovering"].transitions if t["to"] == "closed"), None)
        if recovered is not None:
            notes.append(
                {"t": recovered["t"] - origin, "text": f"{config['half_open_max_calls']} trial calls\nsucceed: CLOSED"}
            )
        hang_off = by_key["hang_unprotected"]
        if hang_off.median_ms is not None:
            notes.append(
                {
                    "t": (hang_off.started + hang_off.ended) / 2 - origin,
                    "text": f"no breaker: every request\nwaits {hang_off.median_ms / 1000:.1f} s and fails",
                }
            )
        fleet = by_key["fleet"]
        if fleet.fleet:
            f = fleet.fleet
            burst = min((r["t"] for r in self.requests if r["t"] >= fleet.started), default=fleet.started)
            notes.append(
                {
                    "t": burst - origin,
                    "text": f"{f['burst_sent']} requests to 2 shops while HALF_OPEN:\nthe upstream got exactly "
                    f"{f['burst_upstream']} trial calls",
                }
            )
        forced = next((t for t in self.transitions if t.get("band") == "forced_open"), None)
        if forced is not None:
            notes.append(
                {
                    "t": forced["t"] - origin,
                    "text": "the running server finds the force in the database: every request gets the fallback",
                }
            )
        freeze = by_key["emergency"]
        if freeze.emergency.get("frozen_rejections"):
            f = freeze.emergency
            notes.append(
                {
                    "t": f["frozen_from"] - origin,
                    "text": f"baldur_emergency set 3 (another process): held\nOPEN past its {f['recovery_timeout']:g} s timeout, "
                    f"{f['frozen_rejections']} rejections\n'frozen', no trial call even once the service is back",
                }
            )
        closed = next((t for t in by_key["emergency_step_down"].transitions if t["to"] == "closed"), None)
        if closed is not None:
            notes.append({"t": closed["t"] - origin, "text": "step-down to level 2:\ntrial calls, CLOSED"})
        per_host = by_key["per_host"].per_host if "per_host" in by_key else {}
        if per_host:
            bad, good = per_host["failing"], per_host["healthy"]
            opened = next((t for t in per_host["transitions"][bad] if t["to"] == "open"), None)
            if opened is not None and isinstance(opened.get("t"), (int, float)):
                notes.append(
                    {
                        "t": opened["t"] - origin,
                        "text": f"{per_host['failing_counted_when_open']} failures in a row at {bad}: only the "
                        f"{per_host['breakers'][bad]} breaker opens; {bad} counts {per_host['failing_counted_while_open']} "
                        f"more calls, {good} ({per_host['breakers'][good]}) answers all "
                        f"{per_host['calls'][good]['quoted']}",
                    }
                )
        notes += demo_stages.notes(by_key)
        return {
            "title": "baldur_django demo: the 'payments' breaker over one run",
            "subtitle": (
                f"A Django shop calls a payments service that fails, recovers and hangs; operators force the breaker open and "
                f"declare Emergency Level 3. Breaker: opens after "
                f"{config['failure_threshold']} failures in a row, waits {config['recovery_timeout']:g} s, then closes after "
                f"{config['half_open_max_calls']} successful trial calls. State shared in the database "
                f"(phase {next((i for i, p in enumerate(self.plans, 1) if p.fleet), len(self.plans))}: by two servers). "
                f"Then shipping quotes from two carriers through one adapter with a breaker per host. Last, the "
                f"outbound stages: a 429 with Retry-After, and a hanging service on a worker with "
                f"{demo_stages.THREADS} request threads, each without and with the stage that helps."
            ),
            "phases": phases,
            "states": states,
            "requests": requests,
            "notes": notes,
            "commands": commands,
        }

    def draw_timeline(self) -> Path:
        """Write ``timeline.png`` into the output directory and return its path."""
        from testproject import timeline

        return timeline.draw(self.out_dir / "timeline.png", self.timeline_data())

    def breaker_log_lines(self) -> list[str]:
        try:
            text = (self.out_dir / "django.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "baldur.circuit_breaker" in line]


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (0 ok, 1 expectations unmet, 2 setup, 130 Ctrl-C)."""
    parser = argparse.ArgumentParser(
        prog="python -m testproject.demo", description="Circuit-breaker demo against a real, misbehaving HTTP upstream."
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="fewer requests and short hang phases (about 45 s; the full run takes about 55 s)",
    )
    parser.add_argument("--no-color", action="store_true", help="no ANSI colours")
    parser.add_argument("--no-plot", action="store_true", help="do not draw timeline.png (needs matplotlib)")
    parser.add_argument("--json-summary", type=Path, metavar="PATH", help="also write the summary as JSON to PATH")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=REPO / "demo-out",
        help="where the servers' logs and the run's throwaway SQLite database go (default demo-out/)",
    )
    args = parser.parse_args(argv)
    tty = sys.stdout.isatty()
    color = tty and not args.no_color and not os.environ.get("NO_COLOR")
    display = Display(color=color, tty=tty)
    demo = Demo(args, display)
    summary: dict[str, Any] = {"ok": False}
    status = 2
    try:
        status, summary = demo.run()
    except SetupError as exc:
        display.end_progress()
        display.line(f"demo: {exc}")
        summary = {"ok": False, "problems": [f"setup: {exc}"]}
        status = 2
    except KeyboardInterrupt:
        display.end_progress()
        display.line("demo: interrupted; stopping the servers")
        summary = {"ok": False, "problems": ["interrupted"]}
        status = 130
    finally:
        demo.stop()
        if status in (0, 1) and not args.no_plot:
            try:
                path = demo.draw_timeline()
            except ImportError as exc:
                display.line(f"demo: no picture ({exc}); install the dev extra, or pass --no-plot")
                summary["timeline_png"] = None
            else:
                display.line(f"timeline of the run: {path}")
                summary["timeline_png"] = str(path)
            summary["timeline"] = demo.timeline_data()
        if args.json_summary:
            args.json_summary.parent.mkdir(parents=True, exist_ok=True)
            args.json_summary.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return status


if __name__ == "__main__":
    sys.exit(main())
