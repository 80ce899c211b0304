"""The scripted upstream itself: script parsing, answers, a thread-safe request count."""

from __future__ import annotations

import sys
import threading

import pytest
import requests

from .upstream import Answer, Upstream, http_date, parse_script, too_many


def test_script_parsing_and_bad_tokens():
    """RL-1..RL-9 harness: tokens, repeats and Answer objects; bad tokens name themselves."""
    answers = parse_script(["200*2,429", too_many("7"), 503])
    assert [a.status for a in answers] == [200, 200, 429, 429, 503]
    assert answers[3].retry_after == "7"
    for bad in ("abc", "200*0", "42", "200*x"):
        with pytest.raises(ValueError, match=bad.replace("*", r"\*")):
            parse_script([bad])
    with pytest.raises(ValueError, match="empty"):
        Upstream().script()


def test_answers_follow_script_then_repeat_last(upstream, session):
    """RL-2 harness: answers come in order; the last repeats; headers are sent verbatim; cycle loops."""
    date = http_date(1_700_000_120)
    upstream.script(too_many("7"), Answer(429, date), "200")
    got = [session.get(upstream.endpoint(), timeout=5) for _ in range(4)]
    assert [r.status_code for r in got] == [429, 429, 200, 200]
    assert got[0].headers["Retry-After"] == "7"
    assert got[1].headers["Retry-After"] == "Tue, 14 Nov 2023 22:15:20 GMT" == date
    assert "Retry-After" not in got[2].headers
    upstream.script("200,503", cycle=True)
    assert [session.get(upstream.endpoint(), timeout=5).status_code for _ in range(4)] == [200, 503, 200, 503]
    assert upstream.hits == 8


def test_request_count_is_thread_safe(upstream):
    """RL-1..RL-9 harness: concurrent clients (8 threads x 25 requests, start barrier) are all counted."""
    sys_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    barrier = threading.Barrier(8)
    errors = []

    def client():
        try:
            with requests.Session() as s:
                barrier.wait()
                for _ in range(25):
                    s.get(upstream.endpoint(), timeout=10)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(sys_interval)
    assert errors == []
    assert upstream.hits == 200
    assert len(upstream.paths) == 200
