"""CB-11: returned responses, including through the fast lane for plain int statuses."""

from __future__ import annotations

from http import HTTPStatus

import baldur_django as baldur


class Response:
    def __init__(self, status_code):
        self.status_code = status_code
        self.headers = {}


class Exploding:
    @property
    def status_code(self):
        raise RuntimeError("lazy attribute failed")


def test_cb11_int_success_statuses_take_the_fast_lane_and_failures_still_count(clock):
    """CB-11: a run of 200s fills the window as successes; a returned 503 (plain int or
    HTTPStatus) is a failure; a returned 429 is a failure and a 429 sighting; each value is
    returned unchanged."""
    answers = []

    @baldur.circuit_breaker("fast-lane", failure_threshold=100, failure_rate_threshold=0)
    def call():
        return answers.pop(0)

    ok = Response(200)
    answers.extend([ok] * 150)
    assert all(call() is ok for _ in range(150))
    snap = baldur.get_breaker("fast-lane").snapshot()
    assert (snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]) == (100, 0, 0)

    down, enum_down, limited = Response(503), Response(HTTPStatus.SERVICE_UNAVAILABLE), Response(429)
    answers.extend([down, enum_down, limited])
    assert call() is down and call() is enum_down and call() is limited
    breaker = baldur.get_breaker("fast-lane")
    snap = breaker.snapshot()
    assert (snap["window_failures"], snap["consecutive_failures"]) == (3, 3)
    assert breaker.cooldown_remaining() > 0  # the 429 started a cooldown

    answers.extend([Response(404), Response(True), Exploding()])
    for _ in range(3):
        call()
    snap = breaker.snapshot()
    assert (snap["window_failures"], snap["consecutive_failures"]) == (3, 0)  # none of them failed
