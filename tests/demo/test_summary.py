"""The demo's console summary (``testproject.demo.summary_table``) on made-up results,
without servers: its figures agree with each other and say what they count."""

from __future__ import annotations

import re

from testproject import demo


def per_host_result() -> demo.PhaseResult:
    """The per-host phase as a real run ends it: 20 requests, each asking both carriers;
    parcelpost answered 503 five times and its breaker then refused its 15 other calls;
    swiftship answered all 20."""
    return demo.PhaseResult(
        "per_host",
        "one carrier down: a breaker per host",
        sent=20,
        ok=20,
        rejected=15,
        upstream_counted=25,
        per_host={
            "failing": "parcelpost",
            "healthy": "swiftship",
            "breakers": {"parcelpost": "127.0.0.1:37161", "swiftship": "127.0.0.1:42321"},
            "upstream_counted": {"parcelpost": 5, "swiftship": 20},
            "calls": {
                "parcelpost": {"quoted": 0, "failed": 5, "rejected": 15, "error": 0},
                "swiftship": {"quoted": 20, "failed": 0, "rejected": 0, "error": 0},
            },
        },
    )


def test_hc1_per_host_row_counts_each_carrier_and_says_each_request_asks_both():
    """HC-1: the per-host phase's row showed ``upstream 25`` for ``sent 20`` with no word
    why. Each request asks both carriers, so its upstream cell gives each carrier's own
    count (``5+20``, none above the requests sent), and a note under the table names the
    carriers with their counts and says what the row's paid and rej.fast count there."""
    healthy = demo.PhaseResult("healthy", "healthy traffic", sent=30, ok=30, upstream_counted=30)
    lines = demo.summary_table([healthy, per_host_result()])
    header = lines[0]
    column = header.index("upstream") + len("upstream")  # the column's right edge
    rows = {line.split(".")[0].strip(): line for line in lines if re.match(r"\s+\d+\. ", line)}
    assert rows["1"][:column].split()[-1] == "30"
    cell = rows["2"][:column].split()[-1]
    assert cell == "5+20", rows["2"]
    assert all(int(n) <= 20 for n in cell.split("+"))
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total[:column].split()[-1] == "55"
    note = " ".join(" ".join(lines[lines.index(total) + 1 :]).split())
    assert "phase 2: each of the 20 requests asks both carriers" in note
    assert "parcelpost (127.0.0.1:37161) counted 5" in note and "swiftship (127.0.0.1:42321) 20" in note
    assert "paid: requests answered with a quote" in note
    assert "rej.fast: the 15 calls to a carrier its host's open breaker refused" in note


def test_a_summary_without_the_per_host_phase_has_no_note():
    healthy = demo.PhaseResult("healthy", "healthy traffic", sent=30, ok=30, upstream_counted=30)
    lines = demo.summary_table([healthy])
    assert lines[-1].strip().startswith("total")
