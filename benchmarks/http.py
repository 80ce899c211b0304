"""Outbound HTTP clients benchmark: what the breaker adapters cost per request.

``python -m benchmarks --http [--quick] [--json FILE]`` (or ``python -m benchmarks.http``)
measures, in one run against a local HTTP server started for it in its own process
(``http.server`` on 127.0.0.1, HTTP/1.1 keep-alive, a 2-byte 200 answer):

1. a loopback ``GET`` through a ``requests.Session`` with the plain ``HTTPAdapter`` and
   with ``BreakerAdapter()`` (one breaker per host) wrapping the same kind of adapter;
   the same with ``httpx.Client`` over ``HTTPTransport`` / ``BreakerTransport``, and with
   ``httpx.AsyncClient`` over ``AsyncHTTPTransport`` / ``AsyncBreakerTransport``. Rounds
   are interleaved in a shuffled order (``benchmarks.harness``) and each breaker round is
   paired with the plain round next to it: the figure is the median of the paired
   differences, in microseconds and as a percentage of the plain request;
2. a refused request: ``session.get()`` through ``BreakerAdapter`` while its breaker is
   OPEN (``CircuitOpenRequestError``) next to the plain adapter's ``ConnectionError`` on a
   closed local port (the cheapest real network failure there is).

Goals (printed PASS/MISS): every adapter adds at most 5 % to the loopback request; an OPEN
refusal costs less than the refused connection. Results and method: ``docs/performance.md``,
section "Outbound HTTP clients".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import socket
import ssl
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import repeat
from typing import Any

from .harness import Sample, ainterleave, interleave

__all__ = ["HttpSettings", "HTTP_DEFAULT", "HTTP_QUICK", "HttpResult", "bench_http", "evaluate_http", "format_http"]

PAIRS = (
    ("requests", "HTTPAdapter", "BreakerAdapter"),
    ("httpx", "HTTPTransport", "BreakerTransport"),
    ("httpx async", "AsyncHTTPTransport", "AsyncBreakerTransport"),
)
REFUSED = "plain adapter, closed port (ConnectionError)"
OPEN = "BreakerAdapter, breaker OPEN (CircuitOpenRequestError)"
GOAL_PERCENT = 5.0


@dataclass(frozen=True)
class HttpSettings:
    """How much to measure.

    Attributes:
        rounds: interleaved rounds per pair (one unrecorded warm-up round runs first).
        requests: requests per contender per round.
        refusal_rounds: rounds of the refusal comparison.
        refusals: refused requests per contender per round.
        seed: seeds the per-round shuffle.
    """

    rounds: int = 21
    requests: int = 300
    refusal_rounds: int = 15
    refusals: int = 200
    seed: int = 1


HTTP_DEFAULT = HttpSettings()
HTTP_QUICK = HttpSettings(rounds=7, requests=100, refusal_rounds=5, refusals=60)


@dataclass
class HttpResult:
    """Everything :func:`bench_http` measured: client -> contender -> :class:`Sample` (ns),
    on the wall clock and on the client thread's CPU clock (``*_cpu``)."""

    settings: HttpSettings
    loopback: dict[str, dict[str, Sample]]
    loopback_cpu: dict[str, dict[str, Sample]]
    refusal: dict[str, Sample]
    refusal_cpu: dict[str, Sample]
    own: dict[str, dict[str, Sample]]
    versions: dict[str, str]
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)

    def overhead_us(self, client: str) -> float:
        """What the wrapper adds to one request, microseconds: its own cost over an inner
        adapter that answers at once (median paired difference). It adds no wait of its
        own (no store round trip on the memory backend), so this is all it adds."""
        _, _, wrapped = next(p for p in PAIRS if p[0] == client)
        return self.own[client][wrapped].overhead / 1000

    def cpu_overhead_us(self, client: str) -> float:
        """Median paired extra CPU time of the wrapper on the loopback GET, microseconds."""
        _, _, wrapped = next(p for p in PAIRS if p[0] == client)
        return self.loopback_cpu[client][wrapped].overhead / 1000

    def wall_overhead_us(self, client: str) -> float:
        """Median paired extra wall time of the breaker contender, microseconds (noisy on a
        busy machine: other processes' time slices land in either contender)."""
        _, _, wrapped = next(p for p in PAIRS if p[0] == client)
        return self.loopback[client][wrapped].overhead / 1000

    def plain_us(self, client: str) -> float:
        _, plain, _ = next(p for p in PAIRS if p[0] == client)
        return self.loopback[client][plain].median / 1000

    def overhead_percent(self, client: str) -> float:
        return 100.0 * self.overhead_us(client) / self.plain_us(client)


# ------------------------------------------------------------------- the server
def _serve(ready: Any) -> None:
    """The server process: a keep-alive HTTP/1.1 server answering every GET with 200 ``ok``."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # one buffered write per answer (flushed after each request) and no Nagle: headers and
        # body in one segment, never a delayed-ACK stall
        wbufsize = 65536
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            pass

        def do_GET(self) -> None:  # noqa: N802 - stdlib's name
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    ready.put(server.server_address[1])
    server.serve_forever(poll_interval=0.05)


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


class Clocks:
    """Both clocks of every round: the wall time goes to the harness, the thread's CPU time
    is kept here (the first entry of each contender is the harness's warm-up round)."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[int]] = {}

    def start(self) -> tuple[int, int]:
        return time.perf_counter_ns(), time.thread_time_ns()

    def stop(self, name: str, started: tuple[int, int]) -> int:
        wall, cpu = started
        self.cpu.setdefault(name, []).append(time.thread_time_ns() - cpu)
        return time.perf_counter_ns() - wall

    def paired(self, baseline: str, n: int) -> dict[str, Sample]:
        """CPU ns per request of each contender per measured round, paired with *baseline*'s."""
        out = {}
        base = [t / n for t in self.cpu[baseline][1:]]
        for name, totals in self.cpu.items():
            per = [t / n for t in totals[1:]]
            out[name] = Sample(per_call=per, over_bare=[a - b for a, b in zip(per, base, strict=True)])
        return out


# ------------------------------------------------------------------ measurements
def _requests_pair(url: str, settings: HttpSettings) -> tuple[dict[str, Sample], dict[str, Sample]]:
    import requests

    from baldur_django.contrib.requests import BreakerAdapter

    sessions = {}
    for name, adapter in (("HTTPAdapter", requests.adapters.HTTPAdapter()), ("BreakerAdapter", BreakerAdapter())):
        session = requests.Session()
        session.mount("http://", adapter)
        sessions[name] = session

    clocks = Clocks()

    def runner(name: str, session: Any) -> Any:
        def run(n: int) -> int:
            get = session.get
            started = clocks.start()
            for _ in repeat(None, n):
                get(url, timeout=5)
            return clocks.stop(name, started)

        return run

    try:
        wall = interleave(
            {name: runner(name, s) for name, s in sessions.items()},
            baseline="HTTPAdapter",
            rounds=settings.rounds,
            n=settings.requests,
            seed=settings.seed,
        )
        return wall, clocks.paired("HTTPAdapter", settings.requests)
    finally:
        for session in sessions.values():
            session.close()


def _httpx_pair(url: str, settings: HttpSettings) -> tuple[dict[str, Sample], dict[str, Sample]]:
    import httpx

    from baldur_django.contrib.httpx import BreakerTransport

    tls = ssl.create_default_context()
    clients = {
        "HTTPTransport": httpx.Client(transport=httpx.HTTPTransport(verify=tls)),
        "BreakerTransport": httpx.Client(transport=BreakerTransport(transport=httpx.HTTPTransport(verify=tls))),
    }

    clocks = Clocks()

    def runner(name: str, client: Any) -> Any:
        def run(n: int) -> int:
            get = client.get
            started = clocks.start()
            for _ in repeat(None, n):
                get(url)
            return clocks.stop(name, started)

        return run

    try:
        wall = interleave(
            {name: runner(name, c) for name, c in clients.items()},
            baseline="HTTPTransport",
            rounds=settings.rounds,
            n=settings.requests,
            seed=settings.seed,
        )
        return wall, clocks.paired("HTTPTransport", settings.requests)
    finally:
        for client in clients.values():
            client.close()


def _httpx_async_pair(url: str, settings: HttpSettings) -> tuple[dict[str, Sample], dict[str, Sample]]:
    import httpx

    from baldur_django.contrib.httpx import AsyncBreakerTransport

    tls = ssl.create_default_context()

    clocks = Clocks()

    async def scenario() -> tuple[dict[str, Sample], dict[str, Sample]]:
        clients = {
            "AsyncHTTPTransport": httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(verify=tls)),
            "AsyncBreakerTransport": httpx.AsyncClient(
                transport=AsyncBreakerTransport(transport=httpx.AsyncHTTPTransport(verify=tls))
            ),
        }

        def runner(name: str, client: Any) -> Any:
            async def run(n: int) -> int:
                get = client.get
                started = clocks.start()
                for _ in repeat(None, n):
                    await get(url)
                return clocks.stop(name, started)

            return run

        try:
            wall = await ainterleave(
                {name: runner(name, c) for name, c in clients.items()},
                baseline="AsyncHTTPTransport",
                rounds=settings.rounds,
                n=settings.requests,
                seed=settings.seed,
            )
            return wall, clocks.paired("AsyncHTTPTransport", settings.requests)
        finally:
            for client in clients.values():
                await client.aclose()

    return asyncio.run(scenario())


def _refusals(url: str, settings: HttpSettings) -> tuple[dict[str, Sample], dict[str, Sample]]:
    import requests

    import baldur_django as baldur
    from baldur_django.contrib.requests import BreakerAdapter

    closed = f"http://127.0.0.1:{_closed_port()}/"
    plain = requests.Session()
    plain.mount("http://", requests.adapters.HTTPAdapter())
    guarded = requests.Session()
    guarded.mount("http://", BreakerAdapter("bench-http-open", recovery_timeout=3600))
    baldur.force_open_circuit("bench-http-open", ttl_minutes=60, reason="benchmark")

    clocks = Clocks()

    def runner(name: str, session: Any, target: str) -> Any:
        def run(n: int) -> int:
            get = session.get
            started = clocks.start()
            for _ in repeat(None, n):
                try:
                    get(target, timeout=5)
                except requests.ConnectionError:
                    pass
            return clocks.stop(name, started)

        return run

    try:
        wall = interleave(
            {REFUSED: runner(REFUSED, plain, closed), OPEN: runner(OPEN, guarded, url)},
            baseline=REFUSED,
            rounds=settings.refusal_rounds,
            n=settings.refusals,
            seed=settings.seed,
        )
        return wall, clocks.paired(REFUSED, settings.refusals)
    finally:
        baldur.release_circuit("bench-http-open")
        plain.close()
        guarded.close()


def _own_cost(settings: HttpSettings) -> dict[str, dict[str, Sample]]:
    """What each wrapper adds by itself: ``send()``/``handle_request()`` over an inner
    adapter or transport that answers at once with a ready 200 (no I/O), next to calling
    that inner one directly. Precise where the loopback pairs are noisy: these loops run
    no network and no other process."""
    import httpx
    import requests

    from baldur_django.contrib.httpx import AsyncBreakerTransport, BreakerTransport
    from baldur_django.contrib.requests import BreakerAdapter

    prepared = requests.Request("GET", "http://127.0.0.1:9/").prepare()
    ready = requests.Response()
    ready.status_code = 200

    class Ready(requests.adapters.BaseAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            return ready

        def close(self) -> None:
            pass

    request = httpx.Request("GET", "http://127.0.0.1:9/")
    answer = httpx.Response(200)

    class ReadyTransport(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return answer

    class AsyncReadyTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return answer

    def looped(call: Any) -> Any:
        def run(n: int) -> int:
            start = time.perf_counter_ns()
            for _ in repeat(None, n):
                call()
            return time.perf_counter_ns() - start

        return run

    n = settings.requests * 20
    plain_adapter, plain_transport = Ready(), ReadyTransport()
    breaker_adapter, breaker_transport = BreakerAdapter(adapter=Ready()), BreakerTransport(transport=ReadyTransport())
    out = {
        "requests": interleave(
            {
                "HTTPAdapter": looped(lambda: plain_adapter.send(prepared)),
                "BreakerAdapter": looped(lambda: breaker_adapter.send(prepared)),
            },
            baseline="HTTPAdapter",
            rounds=settings.rounds,
            n=n,
            seed=settings.seed,
        ),
        "httpx": interleave(
            {
                "HTTPTransport": looped(lambda: plain_transport.handle_request(request)),
                "BreakerTransport": looped(lambda: breaker_transport.handle_request(request)),
            },
            baseline="HTTPTransport",
            rounds=settings.rounds,
            n=n,
            seed=settings.seed,
        ),
    }
    aplain, abreaker = AsyncReadyTransport(), AsyncBreakerTransport(transport=AsyncReadyTransport())

    def alooped(call: Any) -> Any:
        async def run(n: int) -> int:
            start = time.perf_counter_ns()
            for _ in repeat(None, n):
                await call()
            return time.perf_counter_ns() - start

        return run

    async def scenario() -> dict[str, Sample]:
        return await ainterleave(
            {
                "AsyncHTTPTransport": alooped(lambda: aplain.handle_async_request(request)),
                "AsyncBreakerTransport": alooped(lambda: abreaker.handle_async_request(request)),
            },
            baseline="AsyncHTTPTransport",
            rounds=settings.rounds,
            n=n,
            seed=settings.seed,
        )

    out["httpx async"] = asyncio.run(scenario())
    return out


def bench_http(settings: HttpSettings, progress: Any = None) -> HttpResult:
    """Run every measurement of the module docstring against a server process of its own.

    Args:
        settings: how much to measure.
        progress: ``progress(text)`` before each part, or None.

    Returns:
        HttpResult: the samples (ns per request) of every contender.
    """
    import httpx
    import requests

    say = progress or (lambda text: None)
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    server = context.Process(target=_serve, args=(ready,), daemon=True)
    server.start()
    started = time.monotonic()
    try:
        port = ready.get(timeout=60)
        url = f"http://127.0.0.1:{port}/"
        loopback, loopback_cpu = {}, {}
        for client, run in (("requests", _requests_pair), ("httpx", _httpx_pair), ("httpx async", _httpx_async_pair)):
            say(f"a loopback GET with {client}")
            loopback[client], loopback_cpu[client] = run(url, settings)
        say("an OPEN refusal and a refused connection")
        refusal, refusal_cpu = _refusals(url, settings)
        say("each wrapper's own cost over an inner one that answers at once")
        own = _own_cost(settings)
    finally:
        server.terminate()
        server.join(10)
    import baldur_django

    return HttpResult(
        settings=settings,
        loopback=loopback,
        loopback_cpu=loopback_cpu,
        refusal=refusal,
        refusal_cpu=refusal_cpu,
        own=own,
        versions={
            "python": sys.version.split()[0],
            "requests": requests.__version__,
            "httpx": httpx.__version__,
            "baldur_django": baldur_django.__version__,
        },
        elapsed=time.monotonic() - started,
    )


@dataclass(frozen=True)
class HttpVerdict:
    goal: str
    measured: str
    status: str


def evaluate_http(result: HttpResult) -> list[HttpVerdict]:
    """PASS/MISS of the HTTP adapters' goals."""
    verdicts = []
    for client, _, wrapped in PAIRS:
        percent = result.overhead_percent(client)
        verdicts.append(
            HttpVerdict(
                f"{wrapped} adds <= {GOAL_PERCENT:g} % to a loopback GET",
                f"{percent:+.2f} % ({result.overhead_us(client):+.2f} us on a {result.plain_us(client):.0f} us request)",
                "PASS" if percent <= GOAL_PERCENT else "MISS",
            )
        )
    refused = result.refusal_cpu[REFUSED].median / 1000
    refusal = result.refusal_cpu[OPEN].median / 1000
    verdicts.append(
        HttpVerdict(
            "an OPEN refusal costs less than a refused connection",
            f"{refusal:.1f} us vs {refused:.1f} us CPU (wall {result.refusal[OPEN].median / 1000:.1f} us vs "
            f"{result.refusal[REFUSED].median / 1000:.1f} us)",
            "PASS" if refusal < refused else "MISS",
        )
    )
    return verdicts


def format_http(result: HttpResult) -> str:
    """The report as text: per-request times, paired overheads, refusal costs, verdicts."""
    s = result.settings
    out = [
        f"Outbound HTTP clients: {s.rounds} rounds x {s.requests} loopback GETs per contender; "
        f"refusals {s.refusal_rounds} x {s.refusals} ({', '.join(f'{k} {v}' for k, v in result.versions.items())})",
        "per request: median wall time, and the client thread's CPU time; overhead: median of the "
        "paired per-round differences (+CPU, +wall); own cost: the wrapper over an inner adapter that "
        "answers at once, no I/O",
        "",
        f"{'client':<13}{'contender':<23}{'wall':>11}{'CPU':>11}{'+CPU':>12}{'+wall':>12}{'own cost':>12}",
    ]
    for client, plain, wrapped in PAIRS:
        wall, cpu = result.loopback[client], result.loopback_cpu[client]
        for name in (plain, wrapped):
            extra = ("", "", "")
            if name == wrapped:
                extra = (
                    f"{result.cpu_overhead_us(client):+.1f} us",
                    f"{result.wall_overhead_us(client):+.1f} us",
                    f"{result.overhead_us(client):+.2f} us",
                )
            out.append(
                f"{client if name == plain else '':<13}{name:<23}{wall[name].median / 1000:>8.1f} us"
                f"{cpu[name].median / 1000:>8.1f} us{extra[0]:>12}{extra[1]:>12}{extra[2]:>12}"
            )
    out += ["", "refused requests (requests.Session.get, exception caught):"]
    for name in (REFUSED, OPEN):
        out.append(
            f"  {name:<56}{result.refusal[name].median / 1000:>8.1f} us wall"
            f"{result.refusal_cpu[name].median / 1000:>8.1f} us CPU"
        )
    out += ["", "goals:"]
    for verdict in evaluate_http(result):
        out.append(f"  [{verdict.status}] {verdict.goal}: {verdict.measured}")
    out.append(f"\n({result.elapsed:.1f} s)")
    return "\n".join(out)


def to_json(result: HttpResult) -> dict[str, Any]:
    """Every figure as plain data (nanoseconds unless named)."""
    return {
        "settings": asdict(result.settings),
        "versions": result.versions,
        "loopback_ns": {
            client: {name: {"median": sample.median, "overhead": sample.overhead} for name, sample in samples.items()}
            for client, samples in result.loopback.items()
        },
        "loopback_cpu_ns": {
            client: {name: {"median": sample.median, "overhead": sample.overhead} for name, sample in samples.items()}
            for client, samples in result.loopback_cpu.items()
        },
        "own_cost_ns": {
            client: {name: {"median": sample.median, "overhead": sample.overhead} for name, sample in samples.items()}
            for client, samples in result.own.items()
        },
        "overhead_percent": {client: result.overhead_percent(client) for client, _, _ in PAIRS},
        "refusal_ns": {name: sample.median for name, sample in result.refusal.items()},
        "refusal_cpu_ns": {name: sample.median for name, sample in result.refusal_cpu.items()},
        "goals": [asdict(v) for v in evaluate_http(result)],
        "notes": result.notes,
    }


def main(argv: list[str] | None = None, *, quick: bool | None = None, json_file: str | None = None) -> int:
    """``python -m benchmarks.http [--quick] [--json FILE]``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http", description="outbound HTTP clients")
    parser.add_argument("--quick", action="store_true", help="a short run (noisier figures)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figures as JSON to FILE")
    args = parser.parse_args(argv or [])
    quick = args.quick if quick is None else quick
    json_file = args.json if json_file is None else json_file
    logging.getLogger("baldur").setLevel(logging.CRITICAL)  # the forced open logs on purpose
    result = bench_http(
        HTTP_QUICK if quick else HTTP_DEFAULT,
        progress=lambda text: print(f"measuring {text} ...", file=sys.stderr, flush=True),
    )
    print(format_http(result))
    if json_file:
        with open(json_file, "w", encoding="utf-8") as handle:
            json.dump(to_json(result), handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
