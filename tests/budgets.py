"""Time budgets for the slow groups of the suite (a pytest plugin loaded by tests/conftest.py).

The whole suite must stay within a few minutes on a 2-core machine, so every slow kind of test
has a budget: the summed duration (setup + call + teardown) of the tests in its group. A test
belongs to the first group whose marker it carries, in the order of ``BUDGETS``. At the end of a
run the terminal summary lists each group's total against its budget, and a run in which a
group went over its budget fails (exit status 1) even when every test passed, so a group that
creeps up is seen the day it does, not when CI runs out of time.

The budgets are about twice what each group takes on a quiet 2-core machine, so load from
elsewhere does not trip them; ``BALDUR_TEST_BUDGETS=off`` switches the enforcement off (the
table is still printed) for a run on a much slower machine.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

# group marker -> budget in seconds (summed over the group's tests; with pytest-xdist the
# tests of a group may run on several workers at once, so this is work, not wall time)
BUDGETS: dict[str, float] = {
    "browser": 30.0,
    "celery": 60.0,
    "hypothesis": 60.0,
    "multiprocess": 240.0,
    "slow": 120.0,
}

#: the whole suite's wall-time target on two cores (README); shown, not enforced: a run on a
#: slower or busier machine than CI's should not fail for it
SUITE_SECONDS = 360.0

_spent: dict[str, float] = defaultdict(float)
_count: dict[str, int] = defaultdict(int)
_seen: set[tuple[str, str]] = set()


_started: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append(time.perf_counter())


def group_of(keywords) -> str | None:
    """The budget group of a test, from its markers (``report.keywords``), or None."""
    for group in BUDGETS:
        if group in keywords:
            return group
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = group_of(report.keywords)
    if group is None:
        return
    _spent[group] += report.duration
    if (report.nodeid, group) not in _seen:
        _seen.add((report.nodeid, group))
        _count[group] += 1


def over_budget() -> list[str]:
    return [group for group, budget in BUDGETS.items() if _spent[group] > budget]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller decides
        return
    if over_budget() and os.environ.get("BALDUR_TEST_BUDGETS", "on") != "off" and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _count:
        return
    terminalreporter.section("time budgets of the slow groups")
    if _started:
        wall = time.perf_counter() - _started[0]
        flag = "  OVER the suite's target" if wall > SUITE_SECONDS else ""
        terminalreporter.write_line(f"{'whole run':<13} {'':>10} {wall:>7.1f} s of {SUITE_SECONDS:>5.0f} s{flag}")
    for group, budget in BUDGETS.items():
        if _count[group]:
            flag = "  OVER BUDGET" if _spent[group] > budget else ""
            terminalreporter.write_line(
                f"{group:<13} {_count[group]:>4} tests {_spent[group]:>7.1f} s of {budget:>5.0f} s{flag}"
            )
    if over_budget():
        terminalreporter.write_line(
            "a group went over its budget: make it cheaper, or raise its budget in tests/budgets.py with the reason"
        )
