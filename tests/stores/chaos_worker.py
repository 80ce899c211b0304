"""Worker process of the chaos test (tests/stores/test_chaos.py): a few breakers, real traffic.

Started with ``multiprocessing`` (spawn) and SIGKILLed at random by the controller. Each
incarnation appends JSON lines to a file of its own through an ``O_APPEND`` descriptor,
one ``os.write`` per line, so whatever it wrote before a SIGKILL is on disk. All times
are ``time.time()`` (one host: the controller, the target, the workers and the Redis
server it started share one wall clock).

What a worker does until the controller's stop file appears:

* one caller thread per breaker: ``acquire()``, a call to the controller's flaky target
  (a TCP line protocol that answers ``ok`` or ``fail``), then ``record_success`` or
  ``record_failure``. A trial carries the probing round the store admitted it in;
* one job thread running the fleet jobs of ``core.maintenance`` (recovery sweep, state
  sync, emergency check) at random moments, every store operation of a run logged with
  the time it was sent and answered;
* an event listener logging every transition, force, release, lapse and store problem,
  with whether the worker's store was down (its last operation failed) at that moment.

Line kinds (``k``): ``hello``, ``adm`` (a trial admitted, before its call), ``call`` (a
call done), ``rej`` (a CircuitOpenError), ``leak`` (any other exception reaching a
caller: a bug), ``fin`` (a trial's finish_probe answered or failed), ``ev`` (an event),
``op``/``opb`` (a job's store operation ended/began), ``job`` (a job run ended),
``final`` (local states at the end).
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from typing import Any


class Log:
    """Append-only JSON lines, one ``os.write`` each (survives SIGKILL line by line)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, **fields: Any) -> None:
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())


class TargetError(Exception):
    """The flaky target's own failure (the only thing that may count as a failure)."""


def call_target(address: tuple[str, int], request: dict[str, Any]) -> None:
    """One request to the controller's target; raises TargetError on ``fail`` or any socket trouble."""
    try:
        with socket.create_connection(address, timeout=3.0) as sock:
            sock.sendall((json.dumps(request) + "\n").encode())
            reply = sock.makefile("rb").readline()
    except OSError as exc:
        raise TargetError(f"target unreachable: {exc}") from exc
    if reply.strip() != b"ok":
        raise TargetError(reply.strip().decode() or "no answer")


def _store_class():
    from baldur_django.core.breaker import core_of
    from baldur_django.core.stores.redis import RedisStore

    class ChaosStore(RedisStore):
        """A RedisStore that tells the worker which round admitted each probe, logs each trial's
        finish, and logs (and sometimes slows down) the fleet jobs' store operations."""

        def __init__(self, client: Any, prefix: str, log: Log, rng: random.Random, slow: float) -> None:
            super().__init__(client, prefix=prefix)
            self.log = log
            self.rng = rng
            self.slow = slow  # longest injected delay of a job's store operation, seconds
            self.admitted: dict[str, list[Any]] = {}
            self.local = threading.local()
            self.breakers: dict[str, Any] = {}  # name -> this worker's breaker, set once made

        # ---- a fresh CLOSED record (a store that came back empty) read while this worker's
        # breaker holds OPEN or HALF_OPEN: logged with the state held (invariant 9)
        def _watch(self, op: str, name: str, sent: float, answer: Any) -> Any:
            record = answer.record
            breaker = self.breakers.get(name)
            if breaker is not None and record.state == "closed" and record.version == 0 and record.forced is None:
                view = core_of(breaker).view()
                if view.state.value != "closed" and view.forced is None:
                    self.log(k="empty", b=name, op=op, ts=sent, te=time.time(), state=view.state.value)
            return answer

        def load(self, name: str, **kwargs: Any):
            sent = time.time()
            return self._watch("load", name, sent, super().load(name, **kwargs))

        # ---- probes: the round (version, opened_at) and lease expiry the store admitted a token in
        def acquire_probe(self, name: str, **kwargs: Any):
            sent = time.time()
            answer = self._watch("acquire_probe", name, sent, super().acquire_probe(name, **kwargs))
            token = kwargs["token"]
            if answer.result:
                record = answer.record
                self.admitted[token] = [record.version, record.opened_at, answer.now, record.probes.get(token)]
            return answer

        def finish_probe(self, name: str, **kwargs: Any):
            token, outcome = kwargs["token"], kwargs["outcome"]
            sent = time.time()
            try:
                answer = super().finish_probe(name, **kwargs)
            except BaseException as exc:
                self.log(k="fin", b=name, tok=token, o=outcome, ts=sent, te=time.time(), ok=False, e=type(exc).__name__)
                raise
            self.log(k="fin", b=name, tok=token, o=outcome, ts=sent, te=time.time(), ok=True, r=answer.result)
            return self._watch("finish_probe", name, sent, answer)

        # ---- the jobs' operations (only on the job thread, which sets self.local.run)
        def _job_op(self, op: str, call, *args: Any, **kwargs: Any):
            run = getattr(self.local, "run", None)
            if run is None:
                return call(*args, **kwargs)
            if op not in ("lock", "extend", "unlock") and self.slow and self.rng.random() < 0.15:
                time.sleep(self.rng.uniform(0.0, self.slow))  # a slow run: the lock must cover it
            sent = time.time()
            self.log(k="opb", run=run, op=op, ts=sent)
            try:
                result = call(*args, **kwargs)
            except BaseException as exc:
                self.log(k="op", run=run, op=op, ts=sent, te=time.time(), ok=False, e=type(exc).__name__, a=args[:1])
                raise
            shown = result if op in ("lock", "extend", "unlock") else None
            if op in ("sweep", "inspect"):
                shown = {"moved": result.result, "lapsed": result.lapsed, "state": result.record.state}
            self.log(k="op", run=run, op=op, ts=sent, te=time.time(), ok=True, r=shown, a=args[:1])
            return result

        def lock(self, name: str, **kwargs: Any):
            return self._job_op("lock", super().lock, name, **kwargs)

        def extend(self, name: str, **kwargs: Any):
            return self._job_op("extend", super().extend, name, **kwargs)

        def unlock(self, name: str, **kwargs: Any):
            return self._job_op("unlock", super().unlock, name, **kwargs)

        def names(self):
            return self._job_op("names", super().names)

        def inspect(self, name: str, **kwargs: Any):
            return self._job_op("inspect", super().inspect, name, **kwargs)

        def sweep(self, name: str, **kwargs: Any):
            if getattr(self.local, "run", None) is None:  # a breaker's own sweep (a state read)
                sent = time.time()
                return self._watch("sweep", name, sent, super().sweep(name, **kwargs))
            return self._job_op("sweep", super().sweep, name, **kwargs)

        def prune(self, **kwargs: Any):
            return self._job_op("prune", super().prune, **kwargs)

    return ChaosStore


def main(wid: int, incarnation: int, cfg: dict[str, Any]) -> None:
    """Run one worker incarnation until ``cfg["stop_file"]`` exists.

    Args:
        wid: worker number; incarnation: how many times it was restarted.
        cfg: the controller's settings (see test_chaos.CONFIG and the fixture that fills it).
    """
    for key, value in cfg["env"].items():
        os.environ[key] = str(value)
    import logging

    quiet = logging.getLogger("baldur")  # the history is in the log file; keep stderr clean
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    from baldur_django.core import maintenance
    from baldur_django.core.errors import CircuitOpenError
    from baldur_django.core.events import bus
    from baldur_django.core.registry import registry
    from baldur_django.core.stores.redis import connect

    log = Log(os.path.join(cfg["log_dir"], f"w{wid}-{incarnation}.jsonl"))
    rng = random.Random(f"{cfg['seed']}-{wid}-{incarnation}")
    store = _store_class()(
        connect(cfg["redis_url"], socket_timeout=float(cfg["env"]["BALDUR_REDIS_SOCKET_TIMEOUT"])),
        cfg["prefix"],
        log,
        random.Random(rng.random()),
        cfg["job_slow"],
    )
    registry.set_store(store)

    def listener(event: Any) -> None:
        data = {k: v for k, v in vars(event).items() if k not in ("service", "at", "kind")}
        guard = registry.guard
        log(
            k="ev",
            t=time.time(),
            at=event.at,
            b=event.service,
            kind=event.kind,
            th=threading.current_thread().name,
            down=None if guard is None else guard.down,  # the store had not answered: a local judgement
            **data,
        )

    listener.wants_rejections = False  # type: ignore[attr-defined]
    bus.subscribe(listener)
    breakers = {name: registry.get(name, overrides) for name, overrides in cfg["breakers"].items()}
    store.breakers.update(breakers)
    stop_file = cfg["stop_file"]
    target = tuple(cfg["target"])
    log(k="hello", t=time.time(), pid=os.getpid(), w=wid, inc=incarnation)

    def caller(name: str) -> None:
        breaker = breakers[name]
        own = random.Random(rng.random())
        n = 0
        while not os.path.exists(stop_file):
            n += 1
            cid = f"{wid}.{incarnation}.{name}.{n}"
            t0 = time.time()
            try:
                permit = breaker.acquire()
            except CircuitOpenError as exc:
                log(k="rej", b=name, t=t0, te=time.time(), r=exc.reason)
                time.sleep(own.uniform(0.01, 0.03))  # pacing of the traffic
                continue
            except BaseException as exc:  # a store error reaching a caller: what ST-4 forbids
                log(k="leak", b=name, t=t0, where="acquire", e=type(exc).__name__, m=str(exc)[:300])
                time.sleep(0.02)
                continue
            ta = time.time()
            token = permit.token
            if token is not None and token.startswith("local-"):
                token = None  # a slot of the worker's own record (it judges alone), not a store lease
            rnd = store.admitted.pop(token, None) if token else None
            if permit.trial:
                log(k="adm", b=name, id=cid, t=ta, tok=token, rnd=rnd)
            ok = True
            try:
                request = {
                    "b": name,
                    "id": cid,
                    "t0": t0,
                    "ta": ta,
                    "trial": permit.trial,
                    "shared": token is not None,
                    "tok": token,
                }
                call_target(target, {**request, "rnd": rnd})
            except TargetError:
                ok = False
            except BaseException as exc:
                log(k="leak", b=name, t=time.time(), where="target", e=type(exc).__name__, m=str(exc)[:300])
                ok = False
            t1 = time.time()
            try:
                if ok:
                    breaker.record_success(permit)
                else:
                    breaker.record_failure(permit)
            except BaseException as exc:
                log(k="leak", b=name, t=time.time(), where="record", e=type(exc).__name__, m=str(exc)[:300])
            log(
                k="call",
                b=name,
                id=cid,
                t0=t0,
                ta=ta,
                t1=t1,
                te=time.time(),
                ok=ok,
                trial=permit.trial,
                tok=token,
                rnd=rnd,
            )
            time.sleep(own.uniform(0.01, 0.03))

    jobs = {
        "recovery_sweep": maintenance.recovery_sweep,
        "sync_state": maintenance.sync_state,
        "emergency_check": maintenance.emergency_check,
    }

    def job_runner() -> None:
        own = random.Random(rng.random())
        n = 0
        while not os.path.exists(stop_file):
            time.sleep(own.uniform(0.02, 0.25))
            n += 1
            job = own.choice(sorted(jobs))
            run = f"{wid}.{incarnation}.{n}"
            store.local.run = run
            t0 = time.time()
            try:
                report = jobs[job]()
            except BaseException as exc:
                log(k="leak", b=None, t=time.time(), where=f"job {job}", e=type(exc).__name__, m=str(exc)[:300])
                continue
            finally:
                store.local.run = None
            log(
                k="job",
                run=run,
                job=job,
                t0=t0,
                te=time.time(),
                skipped=report.skipped,
                moved=report.moved,
                lapsed=report.lapsed,
            )

    threads = [threading.Thread(target=caller, args=(name,), name=f"caller-{name}", daemon=True) for name in breakers]
    threads.append(threading.Thread(target=job_runner, name="jobs", daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, breaker in breakers.items():
        breaker.sync()
        log(k="final", b=name, t=time.time(), state=breaker.state.value, forced=breaker.forced)
