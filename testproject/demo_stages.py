"""The demo's outbound-stage phases (``testproject.demo`` runs them last).

Two situations that hurt a web worker before any breaker trips, each before and after:

* **A 429 with Retry-After.** The payments stand-in's rates API answers every lookup 429
  with ``Retry-After: 2`` (:data:`RETRY_AFTER`, scaled down from a real provider's 20 s).
  Shops A and B each get :attr:`PhasePlan.count` lookups, one every :data:`SPACING`
  seconds (B half a step after A), taking turns between two call sites of one service:
  the documentation's retry example, ``BreakerAdapter(retry=RetryPolicy(max_attempts=3,
  backoff_initial=0.1))`` with a 10 s request timeout, and an adapter without retry.
  *Before*: the retry example waits out the cooldown before each further attempt, so its
  web requests are held for seconds and make up to three calls each, while the call site
  without retry sends every lookup to the provider during its Retry-After. *After*: the
  service has ``honor_retry_after`` on, and each request carries a deadline of
  :data:`DEADLINE` seconds (``X-Request-Deadline``, read by ``RequestDeadlineMiddleware``):
  no request is held past it, and one call of the fleet reaches the provider during its
  Retry-After: the shops share the database store, which keeps the gate's end for the
  fleet, and each shop reads it at its next consult (within the demo's 0.5 s sync
  interval; a shop that had read the store just before the gate closed may make one call
  of its own).
* **A hanging service.** Shop C serves at most :data:`THREADS` requests at once (like a
  gunicorn worker with ``--threads 4``). It gets :attr:`PhasePlan.count` lookups at once
  while the rates API hangs, and meanwhile :attr:`PhasePlan.extra` requests to another
  view that calls nothing (``/orders/``). *Without a bulkhead* every thread sits in a
  doomed call for the 1.5 s timeout, and the other view waits its turn; *with*
  ``max_concurrent_calls=2, max_wait=0.0`` the excess is refused at once
  (``BulkheadFullError``, answered by the fallback) and the other view answers at once.

Each phase's figures (time held, calls the provider counted, refusals by reason) go into
``PhaseResult.stages``; :func:`problems` judges them and :func:`summary_lines` prints
them. The functions take the running ``Demo`` (``demo``) for its servers and helpers.
"""

from __future__ import annotations

import statistics
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from testproject.demo_http import SetupError, http_call

if TYPE_CHECKING:
    from testproject.demo import PhasePlan, PhaseResult

#: Seconds of quiet the rates API asks for with each 429.
RETRY_AFTER = 2.0
#: Each request's deadline in the guarded 429 phase, seconds (X-Request-Deadline).
DEADLINE = 1.0
#: Seconds between two lookups sent to one shop in the 429 phases.
SPACING = 0.15
#: Request threads of shop C (``testproject.serve --threads``).
THREADS = 4
#: The bulkhead of the ``bulkhead`` rate client (testproject.shop.rates).
BULKHEAD_SLOTS = 2
#: The shop's rate lookup; ``client`` picks the adapter (testproject.shop.rates.CLIENTS).
RATE_PATH = "/orders/{id}/rate/{client}/"
#: The call site without retry of each 429 phase's service, taking turns with the one with it.
PLAIN = {"retry": "plain", "guarded": "guarded_plain"}
#: A view of the same shop that calls no dependency.
OTHER_PATH = "/orders/"
#: How much later than its deadline a request may be answered (the network, the server).
SLACK = 0.25


def stage_plans(short: bool) -> list[dict[str, Any]]:
    """The four phases as ``PhasePlan`` arguments, in order: 429 before and after, hang
    without and with a bulkhead."""
    per_shop = 5 if short else 7
    return [
        dict(
            key="retry_after_docs",
            title="429 Retry-After: the docs' retry example",
            path=RATE_PATH,
            upstream_mode="limit",
            count=per_shop,
            label="429 Retry-After:\nretry example",
            stage="retry_after",
            client="retry",
        ),
        dict(
            key="retry_after_guarded",
            title="429 Retry-After: deadline + honor_retry_after",
            path=RATE_PATH,
            upstream_mode="limit",
            count=per_shop,
            label="429 Retry-After:\ndeadline + gate",
            stage="retry_after",
            client="guarded",
        ),
        dict(
            key="hang_no_bulkhead",
            title=f"rates hang: {THREADS} threads, no bulkhead",
            path=RATE_PATH,
            upstream_mode="hang",
            count=2 * THREADS,
            extra=6,
            label="rates hang:\nno bulkhead",
            stage="bulkhead",
            client="pool",
        ),
        dict(
            key="hang_bulkhead",
            title=f"rates hang: bulkhead of {BULKHEAD_SLOTS}",
            path=RATE_PATH,
            upstream_mode="hang",
            count=2 * THREADS,
            extra=6,
            label="rates hang:\nbulkhead of 2",
            stage="bulkhead",
            client="bulkhead",
        ),
    ]


# ------------------------------------------------------------------------- requests
def _send(demo: Any, shop: str, path: str, headers: dict[str, str] | None = None, client: str = "") -> dict[str, Any]:
    """One request to *shop* ("A", "B" or "C"); returns what the phase keeps of it."""
    base = {"A": demo.base, "B": demo.base_b, "C": demo.base_c}[shop]
    sent = demo.now()
    reply = http_call("GET", base + path, timeout=20, headers=headers)
    data = reply.data if isinstance(reply.data, dict) else {}
    return {
        "server": shop,
        "client": client,
        "order": data.get("order"),
        "sent": sent,
        "held": reply.seconds,
        "status": reply.status,
        "served_by": data.get("served_by"),
        "rejected": bool(data.get("rejected")),
        "reason": data.get("reason", ""),
        "breaker_state": data.get("breaker_state"),
    }


def _probe(demo: Any) -> dict[str, Any]:
    """One request to shop C's view that calls no dependency."""
    return dict(_send(demo, "C", OTHER_PATH), probe=True)


def _at(start: float, delay: float, job: Any, out: list[dict[str, Any]], lock: threading.Lock) -> threading.Thread:
    """A thread that runs *job* *delay* seconds after *start* (monotonic) and keeps its result."""

    def run() -> None:
        pause = start + delay - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # the load's schedule, not synchronisation
        answer = job()
        with lock:
            out.append(answer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _schedule(jobs: list[tuple[float, Any]]) -> list[dict[str, Any]]:
    """Run each ``(delay, job)`` on its own thread at its delay from now; their results."""
    out: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = time.monotonic()
    threads = [_at(start, delay, job, out, lock) for delay, job in jobs]
    for thread in threads:
        thread.join(timeout=60)
    return sorted(out, key=lambda r: r["sent"])


def _calls_mark(demo: Any) -> int:
    stats = demo.upstream_stats()
    return int(stats["charge_requests"] + stats.get("quote_requests", 0) + stats.get("rate_requests", 0))


def _calls_since(demo: Any, mark: int) -> list[dict[str, Any]]:
    """The stand-in's rate calls from *mark* on, each with ``t`` in seconds since the demo began."""
    reply = http_call("GET", f"{demo.upstream}/control/calls?since={mark}", timeout=5)
    calls = reply.data.get("calls", []) if reply.status == 200 and isinstance(reply.data, dict) else []
    return [dict(c, t=c["t"] - demo.wall0) for c in calls if c.get("kind") == "rate"]


def _outcome(request: dict[str, Any], calls: int) -> str:
    """What became of one request, for the picture (a key of timeline.OUTCOMES)."""
    if request.get("probe"):
        return "other_view" if request["status"] == 200 else "error"
    if request["served_by"] == "upstream":
        return "paid"
    if request["served_by"] != "fallback":
        return "error"
    if request["rejected"] and not calls:
        return {"bulkhead_full": "bulkhead_full", "deadline": "deadline"}.get(request["reason"], "retry_after")
    return "failed"


def _tally(
    demo: Any, plan: PhasePlan, result: PhaseResult, requests: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> None:
    """Count the phase's requests into *result* and the picture (with the time each was held)."""
    per_order: dict[str, int] = {}
    for call in calls:
        per_order[str(call.get("order"))] = per_order.get(str(call.get("order")), 0) + 1
    for request in requests:
        request["calls"] = 0 if request.get("probe") else per_order.get(str(request["order"]), 0)
        outcome = _outcome(request, request["calls"])
        result.sent += 1
        result.latencies.append(request["held"])
        result.ok += outcome in ("paid", "other_view")
        result.fallback += request["served_by"] == "fallback"
        result.rejected += request["served_by"] == "fallback" and request["rejected"]
        result.errors += outcome == "error"
        entry = {"t": round(request["sent"], 3), "server": request["server"], "outcome": outcome}
        demo.requests.append(
            dict(entry, held=round(request["held"], 3), **({"probe": True} if request.get("probe") else {}))
        )
    result.upstream_counted = len(calls)


def _band(plan: PhasePlan, result: PhaseResult, requests: list[dict[str, Any]], breaker: str) -> list[dict[str, Any]]:
    """The phase's breaker states as its shops' answers reported them (when each was answered)."""
    strips = []
    for shop in sorted({r["server"] for r in requests if not r.get("probe")}):
        states = [{"t": result.started, "state": "closed"}]
        for r in sorted(
            (r for r in requests if r["server"] == shop and r.get("breaker_state")), key=lambda r: r["sent"] + r["held"]
        ):
            if r["breaker_state"] != states[-1]["state"]:
                states.append({"t": r["sent"] + r["held"], "state": r["breaker_state"]})
        strips.append({"name": f"{breaker} breaker, shop {shop}", "host": f"shop {shop}", "states": states})
    return strips


def _header(demo: Any, index: int, plan: PhasePlan, text: str) -> None:
    d = demo.display
    d.line(d.bold(f"Phase {index}/{demo.phase_count}: {plan.title}") + f"  ({text})")


def _mode(demo: Any, body: dict[str, Any]) -> None:
    reply = http_call("POST", demo.upstream + "/control/mode", body, timeout=5)
    if reply.status != 200:
        raise SetupError(f"could not switch the upstream to {body}: {reply.error or reply.data}")


# ------------------------------------------------------------------------- 429 phases
def run_retry_after(demo: Any, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
    """A 429 phase: lookups to shops A and B while the rates API asks for quiet."""
    guarded = plan.client == "guarded"
    how = (
        f"honor_retry_after=True, each request's deadline {DEADLINE:g} s (X-Request-Deadline)"
        if guarded
        else "BreakerAdapter(retry=RetryPolicy(max_attempts=3, backoff_initial=0.1)), request timeout 10 s"
    )
    _header(demo, index, plan, f"the rates API answers 429 with Retry-After: {RETRY_AFTER:g}; {how}")
    _mode(demo, {"mode": "limit", "retry_after": RETRY_AFTER})
    mark, started = _calls_mark(demo), time.monotonic()
    service = "rates_guarded" if guarded else "rates"
    reasons_before = _reasons(demo, service, "AB")
    headers = {"X-Request-Deadline": f"{DEADLINE:g}"} if guarded else None
    jobs = []
    for i in range(plan.count or 0):
        client = plan.client if i % 2 == 0 else PLAIN[plan.client]  # two call sites, taking turns
        for shop, offset in (("A", 0.0), ("B", SPACING / 2)):
            path = plan.path.format(id=demo.next_order(), client=client)
            jobs.append((i * SPACING + offset, partial(_send, demo, shop, path, headers, client)))
    requests = _schedule(jobs)
    calls = _calls_since(demo, mark)
    _tally(demo, plan, result, requests, calls)
    # the servers count every refusal, the retry stage's after an attempt included (as the
    # responses' "rejected" does)
    result.reasons = _since(reasons_before, _reasons(demo, service, "AB"))
    result.server_rejections = sum(result.reasons.values())
    result.stages = _retry_after_figures(requests, calls, guarded)
    result.stages["bands"] = _band(plan, result, requests, service)
    _say_retry_after(demo, result.stages)
    return _finish(demo, result, started)


def _retry_after_figures(requests: list[dict[str, Any]], calls: list[dict[str, Any]], guarded: bool) -> dict[str, Any]:
    """Per shop: requests, time held, calls the provider counted, and those in the Retry-After
    of its first 429 to that shop (from the first call, before the quiet ended)."""
    order_shop = {str(r["order"]): r["server"] for r in requests}
    shops = {
        shop: _shop_figures(
            [r for r in requests if r["server"] == shop],
            sorted(c["t"] for c in calls if order_shop.get(str(c.get("order"))) == shop),
        )
        for shop in ("A", "B")
    }
    return {
        "client": "guarded" if guarded else "retry",
        "retry_after": RETRY_AFTER,
        "deadline": DEADLINE if guarded else None,
        "shops": shops,
        "held_max": max(s["held_max"] for s in shops.values()),
        "calls": len(calls),
        "gate_scope": "fleet (database store)",
        "fleet_calls_in_retry_after": _in_first_quiet(sorted(c["t"] for c in calls)),
    }


def _shop_figures(mine: list[dict[str, Any]], times: list[float]) -> dict[str, Any]:
    """One shop's figures in a 429 phase: its requests *mine*, its calls' arrival *times*."""
    held = [r["held"] for r in mine]
    sites = sorted({r["client"] for r in mine})
    return {
        "requests": len(mine),
        "held_max": _most(held),
        "held_median": _median(held),
        "calls": len(times),
        "calls_in_retry_after": _in_first_quiet(times),
        "fallback": sum(1 for r in mine if r["served_by"] == "fallback"),
        "reasons": _count(r["reason"] for r in mine if r["rejected"] and not r["calls"]),
        "held_max_by_call_site": {c: _most(r["held"] for r in mine if r["client"] == c) for c in sites},
    }


def _in_first_quiet(times: list[float]) -> int:
    """How many of the sorted call *times* fall within the Retry-After of the first one."""
    return 0 if not times else sum(1 for t in times if t < times[0] + RETRY_AFTER)


def _median(seconds: list[float]) -> float | None:
    """The median of *seconds*, rounded to the millisecond; None for none."""
    return round(statistics.median(seconds), 3) if seconds else None


def _most(seconds: Any) -> float:
    """The largest of *seconds*, rounded to the millisecond; 0.0 for none."""
    return round(max(seconds, default=0.0), 3)


def _calls(count: int) -> str:
    """ "1 call", "2 calls"."""
    return f"{count} call" if count == 1 else f"{count} calls"


def _say_retry_after(demo: Any, f: dict[str, Any]) -> None:
    for shop, s in f["shops"].items():
        reasons = ", ".join(f"{n} {r}" for r, n in s["reasons"].items()) or "none"
        counted = (
            f"{_calls(s['calls'])} from it, {s['calls_in_retry_after']} within the {RETRY_AFTER:g} s of quiet it "
            "asked for at its first 429"
            if s["calls"]
            else "no call from it (the fleet's gate was closed already)"
        )
        demo.display.line(
            f"    {demo.stamp()}  shop {shop}: {s['requests']} requests held up to {s['held_max']:.2f} s "
            f"(median {s['held_median']:.2f} s); the provider counted {counted}; refused before sending: {reasons}"
        )


# ------------------------------------------------------------------------- hang phases
def run_bulkhead(demo: Any, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
    """A hang phase on shop C: a burst of lookups while the rates API hangs, and requests to
    another view meanwhile."""
    with_bulkhead = plan.client == "bulkhead"
    how = f"max_concurrent_calls={BULKHEAD_SLOTS}, max_wait=0.0" if with_bulkhead else "no bulkhead"
    _header(demo, index, plan, f"shop C serves {THREADS} requests at once; the rates API hangs; {how}")
    _mode(demo, {"mode": "hang", "hang_seconds": 10})
    mark, started = _calls_mark(demo), time.monotonic()
    reasons_before = _reasons(demo, "rates_bulkhead" if with_bulkhead else "rates_pool")
    paths = [plan.path.format(id=demo.next_order(), client=plan.client) for _ in range(plan.count or 0)]
    jobs = [(0.0, partial(_send, demo, "C", path)) for path in paths]
    jobs += [(0.2 + 0.25 * i, partial(_probe, demo)) for i in range(plan.extra)]
    requests = _schedule(jobs)
    _mode(demo, {"mode": "ok"})  # nothing hangs past the phase
    calls = _calls_since(demo, mark)
    _tally(demo, plan, result, requests, calls)
    result.reasons = _since(reasons_before, _reasons(demo, "rates_bulkhead" if with_bulkhead else "rates_pool"))
    result.server_rejections = sum(result.reasons.values())
    result.stages = _bulkhead_figures(requests, calls, result.reasons, with_bulkhead)
    result.stages["bands"] = _band(plan, result, requests, "rates_bulkhead" if with_bulkhead else "rates_pool")
    _say_bulkhead(demo, result.stages)
    return _finish(demo, result, started)


def _reasons(demo: Any, service: str, shops: str = "C") -> dict[str, int]:
    """The rejections of *service* by reason, summed over *shops* (their ``/breakers/``)."""
    found: dict[str, int] = {}
    for shop in shops:
        base = {"A": demo.base, "B": demo.base_b, "C": demo.base_c}[shop]
        reply = http_call("GET", base + "/breakers/", timeout=5)
        data = reply.data if reply.status == 200 and isinstance(reply.data, dict) else {}
        for reason, n in data.get("rejections", {}).get(service, {}).items():
            found[reason] = found.get(reason, 0) + n
    return found


def _since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {r: n - before.get(r, 0) for r, n in sorted(after.items()) if n > before.get(r, 0)}


def _bulkhead_figures(
    requests: list[dict[str, Any]], calls: list[dict[str, Any]], reasons: dict[str, int], with_bulkhead: bool
) -> dict[str, Any]:
    """The figures of a hang phase: the lookups, the provider's calls, the refusals, and the
    other view's requests."""
    lookups = [r for r in requests if not r.get("probe")]
    return {
        "client": "bulkhead" if with_bulkhead else "pool",
        "threads": THREADS,
        "slots": BULKHEAD_SLOTS if with_bulkhead else None,
        "lookups": len(lookups),
        "lookups_held_max": _most(r["held"] for r in lookups),
        "calls": len(calls),
        "refused": _count(r["reason"] for r in lookups if r["rejected"]),
        "server_rejections_by_reason": dict(reasons),
        "refused_held_max": _most(r["held"] for r in lookups if r["rejected"]),
        **_other_view([r for r in requests if r.get("probe")]),
    }


def _other_view(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of the requests to the view that calls nothing."""
    return {
        "other_view": len(probes),
        "other_view_answered": sum(1 for r in probes if r["status"] == 200),
        "other_view_held_max": _most(r["held"] for r in probes),
        "other_view_held_median": _median([r["held"] for r in probes]),
    }


def _say_bulkhead(demo: Any, f: dict[str, Any]) -> None:
    refused = ", ".join(f"{n} {r}" for r, n in f["refused"].items()) or "none"
    demo.display.line(
        f"    {demo.stamp()}  shop C: {f['lookups']} lookups, the provider counted {_calls(f['calls'])}; refused "
        f"before sending: {refused} (each answered within {f['refused_held_max']:.2f} s); the other view "
        f"answered {f['other_view_answered']} of {f['other_view']} requests, held up to {f['other_view_held_max']:.2f} s "
        f"(median {f['other_view_held_median']:.2f} s)"
    )


# ------------------------------------------------------------------------- common
def _count(values: Any) -> dict[str, int]:
    found: dict[str, int] = {}
    for value in values:
        found[value] = found.get(value, 0) + 1
    return dict(sorted(found.items()))


def _finish(demo: Any, result: PhaseResult, started: float) -> PhaseResult:
    result.seconds = time.monotonic() - started
    result.ended = demo.now()
    demo.refresh()
    demo.display.end_progress()
    demo.current = None
    return result


def run(demo: Any, index: int, plan: PhasePlan, result: PhaseResult) -> PhaseResult:
    """Run one of :func:`stage_plans`' phases."""
    if plan.stage == "retry_after":
        return run_retry_after(demo, index, plan, result)
    return run_bulkhead(demo, index, plan, result)


# ------------------------------------------------------------------------- judging
def problems(by_key: dict[str, PhaseResult]) -> list[str]:
    """What went wrong in the stage phases, as report lines."""
    return _retry_after_problems(by_key) + _bulkhead_problems(by_key)


def _retry_after_problems(by_key: dict[str, PhaseResult]) -> list[str]:
    found = []
    for shop, s in by_key["retry_after_docs"].stages["shops"].items():
        held = s["held_max_by_call_site"].get("retry", 0.0)
        if held < RETRY_AFTER or s["calls"] <= s["requests"] or s["calls_in_retry_after"] < 2:
            found.append(
                f"retry example phase: shop {shop}'s retried requests were held up to {held:.2f} s and its "
                f"{s['requests']} requests made {s['calls']} calls, {s['calls_in_retry_after']} within the Retry-After: "
                f"expected requests held for the provider's {RETRY_AFTER:g} s cooldowns and calls during them"
            )
    guarded = by_key["retry_after_guarded"].stages
    fleet = guarded["fleet_calls_in_retry_after"]
    if not 1 <= fleet <= len(guarded["shops"]):
        found.append(
            f"guarded 429 phase: the provider counted {_calls(fleet)} from the fleet within its {RETRY_AFTER:g} s "
            f"Retry-After, expected one (one more from a shop that read the store just before the gate closed)"
        )
    for shop, s in guarded["shops"].items():
        if s["held_max"] > DEADLINE + SLACK:
            found.append(
                f"guarded 429 phase: shop {shop} held a request {s['held_max']:.2f} s, past its {DEADLINE:g} s deadline"
            )
        if s["calls_in_retry_after"] > 1:
            found.append(
                f"guarded 429 phase: the provider counted {s['calls_in_retry_after']} calls from shop {shop} within its "
                f"{RETRY_AFTER:g} s Retry-After, expected at most 1"
            )
        if s["fallback"] != s["requests"]:
            found.append(
                f"guarded 429 phase: {s['fallback']} of shop {shop}'s {s['requests']} requests got the fallback"
            )
    return found


def _bulkhead_problems(by_key: dict[str, PhaseResult]) -> list[str]:
    found = []
    pool, bulk = by_key["hang_no_bulkhead"].stages, by_key["hang_bulkhead"].stages
    if pool["calls"] != pool["lookups"] or pool["other_view_held_max"] < 1.0:
        found.append(
            f"hang phase without a bulkhead: {pool['calls']} of {pool['lookups']} lookups reached the provider and the "
            f"other view waited at most {pool['other_view_held_max']:.2f} s: expected every thread in a doomed call"
        )
    if not bulk["refused"].get("bulkhead_full") or not bulk["server_rejections_by_reason"].get("bulkhead_full"):
        found.append(f"hang phase with a bulkhead: no lookup was refused with reason bulkhead_full ({bulk['refused']})")
    if bulk["calls"] > BULKHEAD_SLOTS:
        found.append(
            f"hang phase with a bulkhead: the provider counted {bulk['calls']} calls, more than {BULKHEAD_SLOTS} slots"
        )
    if bulk["other_view_answered"] != bulk["other_view"] or bulk["other_view_held_max"] >= 1.0:
        found.append(
            f"hang phase with a bulkhead: the other view answered {bulk['other_view_answered']} of {bulk['other_view']}, "
            f"held up to {bulk['other_view_held_max']:.2f} s: expected every one at once"
        )
    return found


def notes(by_key: dict[str, PhaseResult]) -> list[dict[str, Any]]:
    """The picture's notes on the stage phases, ``{"t": s, "text": str}`` each."""
    found = []
    for key in ("retry_after_docs", "retry_after_guarded"):
        r = by_key[key]
        f = r.stages
        if f:
            found.append(
                {
                    "t": r.started + 0.05,
                    "text": f"{r.sent} requests to shops A and B: held up to {f['held_max']:.2f} s (dots); "
                    f"the provider counted {_calls(f['calls'])} ("
                    + ", ".join(f"{s['calls_in_retry_after']} from shop {k}" for k, s in f["shops"].items())
                    + f" within its {RETRY_AFTER:g} s Retry-After)",
                }
            )
    for key in ("hang_no_bulkhead", "hang_bulkhead"):
        r = by_key[key]
        f = r.stages
        if f:
            found.append(
                {
                    "t": r.started + 0.05,
                    "text": f"{f['lookups']} lookups at once: {f['calls']} reached the provider, "
                    f"{f['refused'].get('bulkhead_full', 0)} refused (bulkhead full); the other view (diamonds) "
                    f"waited up to {f['other_view_held_max']:.2f} s",
                }
            )
    return found


def summary_lines(by_key: dict[str, PhaseResult]) -> list[str]:
    """The summary's lines for the stage phases."""
    docs, guarded = by_key["retry_after_docs"].stages, by_key["retry_after_guarded"].stages
    pool, bulk = by_key["hang_no_bulkhead"].stages, by_key["hang_bulkhead"].stages
    return [
        f"  429 with Retry-After: {RETRY_AFTER:g}, the docs' retry example: requests held up to {docs['held_max']:.1f} s, "
        f"{docs['calls']} calls reached the provider for {by_key['retry_after_docs'].sent} requests; with a "
        f"{DEADLINE:g} s request deadline and honor_retry_after: held up to {guarded['held_max']:.2f} s, "
        f"{_calls(guarded['calls'])}, {guarded['fleet_calls_in_retry_after']} of the fleet within the Retry-After ("
        + ", ".join(f"shop {k} {s['calls_in_retry_after']}" for k, s in guarded["shops"].items())
        + "): the gate is the fleet's, kept in the shared database",
        f"  rates hang, shop C with {THREADS} request threads: without a bulkhead {pool['calls']} doomed calls and the "
        f"other view waited up to {pool['other_view_held_max']:.1f} s; with max_concurrent_calls={BULKHEAD_SLOTS}, "
        f"max_wait=0: {bulk['calls']} calls, {bulk['refused'].get('bulkhead_full', 0)} refused (bulkhead_full) within "
        f"{bulk['refused_held_max']:.2f} s, the other view answered within {bulk['other_view_held_max']:.2f} s",
    ]
