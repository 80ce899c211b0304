"""No test asserts a wall-clock bound under one second (the team's rule).

A bound of tens of milliseconds on real time fails on a loaded machine. Loop stalls and
latencies are shown by a count of ticks, a ratio or an order of events instead (see
tests/hung_store.py), and speed goals live in ``./dev bench``.

The scanner reads every module under tests/ with :mod:`ast`. It follows values measured on
a wall clock (``time.monotonic()``, ``time.perf_counter()``, ``time.time()``, an event
loop's ``loop.time()``, their ``_ns`` forms) through assignments, differences, scaling,
``max``/``min``/``sum``, list appends, ``await``/``asyncio.run`` and the returns of helper
functions, also across ``from tests... import`` lines. It reports:

- an ``assert`` that bounds such a value from above (``<``, ``<=``, or ``>``/``>=`` the
  other way round) by a number under one second: a literal, a constant of the function,
  of the module or imported from another test module, or arithmetic on those; the unit
  follows the value (``* 1000`` makes milliseconds, ``_ns`` clocks nanoseconds);
- an ``assert`` on ``x.wait(t)`` or ``wait_for(..., timeout=t)`` with *t* under one second.

Not reported: lower bounds ("it really waited"), bounds of one second or more, ratios of
two measurements (``a / b < 0.5``), fake clocks (``clock.monotonic()`` of a FakeClock is not
``time.monotonic()``) and anything not measured on a wall clock.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: functions of the ``time`` module that read a wall clock, and how many units make a second
WALL_CLOCKS = {
    "time": 1.0,
    "monotonic": 1.0,
    "perf_counter": 1.0,
    "time_ns": 1e9,
    "monotonic_ns": 1e9,
    "perf_counter_ns": 1e9,
}
#: calls whose result carries the measurement of their (first measured) argument
PASS_THROUGH = {"run", "max", "min", "sum", "abs", "float", "round", "sorted", "median", "mean", "fmean"}
#: methods that put a measurement into a container
ADDERS = {"append", "extend", "add", "insert"}
LOOP_GETTERS = {"get_running_loop", "get_event_loop"}


@dataclass
class Module:
    """What one module offers to the others: constants and helpers that return measurements."""

    name: str
    tree: ast.Module
    constants: dict[str, float] = field(default_factory=dict)
    timed: dict[str, float] = field(default_factory=dict)  # helper name -> units per second
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    time_module: set[str] = field(default_factory=set)  # names bound to the time module
    clock_functions: dict[str, float] = field(default_factory=dict)  # `from time import monotonic`


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join([*base, node.module] if node.module else base)


def _read_imports(mod: Module) -> None:
    for node in mod.tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    mod.time_module.add(alias.asname or "time")
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(mod.name, node)
            for alias in node.names:
                local = alias.asname or alias.name
                if source == "time" and alias.name in WALL_CLOCKS:
                    mod.clock_functions[local] = WALL_CLOCKS[alias.name]
                else:
                    mod.imports[local] = (source, alias.name)


class Scope:
    """The measured names of one top-level function (nested functions included: closures
    share their lists) or of a module's top level."""

    def __init__(self, modules: dict[str, Module], mod: Module, constants: dict[str, float]) -> None:
        self.modules = modules
        self.mod = mod
        self.constants = constants
        self.measured: dict[str, float] = {}

    def _lookup(self, name: str, table: str) -> float | None:
        own: dict[str, float] = getattr(self.mod, table)
        if name in own:
            return own[name]
        origin = self.mod.imports.get(name)
        if origin and origin[0] in self.modules:
            found: float | None = getattr(self.modules[origin[0]], table).get(origin[1])
            return found
        return None

    def number(self, node: ast.expr) -> float | None:
        """The value of *node* when it is arithmetic on numbers and known constants."""
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name):
            return self.constants[node.id] if node.id in self.constants else self._lookup(node.id, "constants")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.number(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp):
            left, right = self.number(node.left), self.number(node.right)
            if left is None or right is None:
                return None
            operations = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__}
            if type(node.op) in operations:
                return operations[type(node.op)](left, right)
            if isinstance(node.op, ast.Div) and right:
                return left / right
        return None

    def _clock(self, call: ast.Call) -> float | None:
        func = call.func
        if isinstance(func, ast.Name):
            return self.mod.clock_functions.get(func.id) or self._lookup(func.id, "timed")
        if not isinstance(func, ast.Attribute):
            return None
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in self.mod.time_module:
            return WALL_CLOCKS.get(func.attr)
        if func.attr == "time":  # an event loop's clock
            if isinstance(owner, ast.Name | ast.Attribute):
                return 1.0 if (owner.id if isinstance(owner, ast.Name) else owner.attr).endswith("loop") else None
            if isinstance(owner, ast.Call):
                getter = owner.func
                name = getter.attr if isinstance(getter, ast.Attribute) else getattr(getter, "id", "")
                return 1.0 if name in LOOP_GETTERS else None
        return None

    def units(self, node: ast.expr | None) -> float | None:
        """Units per second of the wall-clock measurement *node* carries, or None."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return self.measured.get(node.id)
        if isinstance(node, ast.Await | ast.Starred):
            return self.units(node.value)
        if isinstance(node, ast.Subscript):
            return self.units(node.value)
        if isinstance(node, ast.Call):
            clock = self._clock(node)
            if clock is not None:
                return clock
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in PASS_THROUGH:
                return next((u for u in map(self.units, node.args) if u is not None), None)
            return None
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.ListComp | ast.GeneratorExp):
            return self.units(node.elt)
        return None

    def _binop(self, node: ast.BinOp) -> float | None:
        left, right = self.units(node.left), self.units(node.right)
        if isinstance(node.op, ast.Add | ast.Sub):
            return left if left is not None else right
        if isinstance(node.op, ast.Mult):
            factor = self.number(node.right if left is not None else node.left)
            unit = left if left is not None else right
            return None if unit is None or factor is None or factor <= 0 else unit * factor
        if isinstance(node.op, ast.Div) and left is not None and right is None:
            divisor = self.number(node.right)
            return None if divisor is None or divisor <= 0 else left / divisor
        return None  # a ratio of two measurements, or a rate: no unit of time

    def _bind(self, target: ast.expr, value: ast.expr) -> bool:
        """Record what assigning *value* to *target* measures; True when something changed."""
        if isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                return any([self._bind(t, v) for t, v in zip(target.elts, value.elts, strict=True)])
            return any([self._bind(t, value) for t in target.elts])  # a helper's tuple: all of it
        if isinstance(target, ast.Name):
            unit = self.units(value)
            if unit is not None and self.measured.get(target.id) != unit:
                self.measured[target.id] = unit
                return True
            constant = self.number(value)
            if unit is None and constant is not None and target.id not in self.constants:
                self.constants[target.id] = constant
        return False

    def _step(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Assign):
            return any([self._bind(target, node.value) for target in node.targets])
        if isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            return self._bind(node.target, node.value)
        if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            return self._bind(node.target, node.iter)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ADDERS:
            owner = node.func.value
            unit = next((u for u in map(self.units, node.args) if u is not None), None)
            if isinstance(owner, ast.Name) and unit is not None and self.measured.get(owner.id) != unit:
                self.measured[owner.id] = unit
                return True
        return False

    def follow(self, root: ast.AST) -> None:
        """Find every measured name of *root*, to a fixed point."""
        nodes = list(ast.walk(root))
        while any([self._step(node) for node in nodes]):
            pass

    def returns(self, root: ast.AST) -> float | None:
        """Units per second of a measurement that *root* (a function) returns, or None."""
        for node in ast.walk(root):
            if isinstance(node, ast.Return) and node.value is not None:
                parts = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                unit = next((u for u in map(self.units, parts) if u is not None), None)
                if unit is not None:
                    return unit
        return None

    def offences(self, root: ast.AST) -> list[tuple[int, str]]:
        """(line, reason) of every assert under *root* that bounds real time under 1 s."""
        found = []
        for node in ast.walk(root):
            if isinstance(node, ast.Assert):
                found += [(node.lineno, reason) for reason in self._check(node.test)]
        return found

    def _check(self, test: ast.expr) -> list[str]:
        reasons = []
        for node in ast.walk(test):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
                    if isinstance(op, ast.Lt | ast.LtE):
                        value, bound = left, right
                    elif isinstance(op, ast.Gt | ast.GtE):
                        value, bound = right, left
                    else:
                        continue
                    unit, limit = self.units(value), self.number(bound)
                    if unit is not None and limit is not None and limit < unit:
                        reasons.append(f"a wall-clock measurement bounded by {limit / unit:g} s")
            elif isinstance(node, ast.Call):
                reasons += self._wait(node)
        return reasons

    def _wait(self, call: ast.Call) -> list[str]:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        timeout = next((kw.value for kw in call.keywords if kw.arg == "timeout"), None)
        if timeout is None and name == "wait" and call.args:
            timeout = call.args[0]
        seconds = self.number(timeout) if timeout is not None and name in ("wait", "wait_for") else None
        return [f"asserts that a wait of {seconds:g} s succeeds"] if seconds is not None and seconds < 1 else []


def _functions(tree: ast.Module, *, classes: bool = False) -> list[ast.stmt]:
    kinds = (
        (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef) if classes else (ast.FunctionDef, ast.AsyncFunctionDef)
    )
    return [node for node in tree.body if isinstance(node, kinds)]


def timed_assertions(sources: dict[str, str]) -> list[str]:
    """``module:line: reason`` for every wall-clock bound under 1 s in *sources* (module name
    -> source text)."""
    modules = {name: Module(name, ast.parse(text)) for name, text in sources.items()}
    for mod in modules.values():
        _read_imports(mod)
        top = Scope(modules, mod, mod.constants)
        for node in mod.tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                top.follow(node)
    changed = True
    while changed:  # helpers that return measurements, also through other helpers and imports
        changed = False
        for mod in modules.values():
            for function in _functions(mod.tree):
                scope = Scope(modules, mod, {})
                scope.follow(function)
                unit = scope.returns(function)
                if unit is not None and mod.timed.get(function.name) != unit:
                    mod.timed[function.name] = unit
                    changed = True
    found = []
    for mod in modules.values():
        for function in _functions(mod.tree, classes=True):
            scope = Scope(modules, mod, {})
            scope.follow(function)
            found += [f"{mod.name}:{line}: {reason}" for line, reason in scope.offences(function)]
    return found


def _suite() -> dict[str, str]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path.read_text(encoding="utf-8")
        for path in sorted(TESTS.rglob("*.py"))
    }


def test_no_test_asserts_a_wall_clock_bound_under_one_second():
    """The suite has no timed test (a bound under 1 s on real time)."""
    sources = _suite()
    assert "tests.test_no_timed_tests" in sources and len(sources) > 100
    assert timed_assertions(sources) == []


OLD_HELPER = """
import asyncio

TIMEOUT = 0.25


async def _beat_while(awaitable, period=0.005):
    loop = asyncio.get_running_loop()
    gaps = []
    done = asyncio.Event()

    async def heartbeat():
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(period)
            now = loop.time()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    started = loop.time()
    try:
        result = await awaitable
    finally:
        duration = loop.time() - started
        done.set()
        await beat
    return max(gaps), result, duration


def test_local(call):
    gap, result, duration = asyncio.run(_beat_while(call()))
    assert duration >= TIMEOUT * 0.8
    assert gap < 0.05, f"the event loop stalled {gap * 1000:.0f} ms on store I/O"
"""

OLD_IMPORTER = """
import asyncio

from tests.old.helper import TIMEOUT, _beat_while

STALL_LIMIT = 0.05


def test_imported(call):
    gap, statuses, duration = asyncio.run(_beat_while(call()))
    assert duration >= TIMEOUT * 0.8
    assert gap < STALL_LIMIT, f"the event loop stalled {gap * 1000:.0f} ms on store I/O"
"""

OTHER_FORMS = """
import time
from time import perf_counter as pc


def test_forms(done, helper):
    started = time.monotonic()
    helper()
    assert time.monotonic() - started < 0.5
    t0 = pc()
    helper()
    elapsed_ms = (pc() - t0) * 1000
    assert elapsed_ms <= 50
    limit = 0.2
    took = time.perf_counter() - t0
    assert 2 * limit > took
    assert done.wait(0.1)
    begin = time.monotonic_ns()
    assert time.monotonic_ns() - begin < 500_000_000
"""

ALLOWED_FORMS = """
import random
import time


def test_allowed(clock, helper, done, CALLS):
    started = time.monotonic()
    helper()
    consult = time.monotonic() - started
    assert 0.15 <= consult < 1.5
    assert consult >= 0.2
    quick = time.monotonic() - started
    assert quick / consult < 0.5
    assert clock.monotonic() < 0.5
    assert random.random() < 0.5
    assert helper() / CALLS < 0.01
    assert done.wait(10)
    assert clock.sleeps[0] <= 0.11
"""


def test_the_scanner_finds_the_old_loop_stall_tests():
    """Meta-test: the 50 ms loop-stall assertions the suite had (a helper returning the
    largest gap between ticks, used in its own module and imported with a module constant
    as the limit) are reported, one per module, at their assert lines."""
    found = timed_assertions(
        {"tests.old.helper": textwrap.dedent(OLD_HELPER), "tests.old.importer": textwrap.dedent(OLD_IMPORTER)}
    )
    assert found == [
        "tests.old.helper:34: a wall-clock measurement bounded by 0.05 s",
        "tests.old.importer:12: a wall-clock measurement bounded by 0.05 s",
    ]


def test_the_scanner_finds_other_forms_of_a_timed_assert():
    """Meta-test: a bound on a difference of monotonic reads, one in milliseconds, one with
    the bound on the left, a short successful wait and a nanosecond clock are reported."""
    assert timed_assertions({"tests.forms": textwrap.dedent(OTHER_FORMS)}) == [
        "tests.forms:9: a wall-clock measurement bounded by 0.5 s",
        "tests.forms:13: a wall-clock measurement bounded by 0.05 s",
        "tests.forms:16: a wall-clock measurement bounded by 0.4 s",
        "tests.forms:17: asserts that a wait of 0.1 s succeeds",
        "tests.forms:19: a wall-clock measurement bounded by 0.5 s",
    ]


def test_the_scanner_allows_lower_bounds_ratios_long_bounds_and_fake_clocks():
    """Meta-test: no false positives: an upper bound of 1.5 s, lower bounds, a ratio of two
    measurements, a FakeClock's reading, a random number, a count per call and a 10 s wait."""
    assert timed_assertions({"tests.allowed": textwrap.dedent(ALLOWED_FORMS)}) == []
