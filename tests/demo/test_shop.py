"""The test project's shop views, through Django's test client, against a real upstream
server (``testproject.upstream`` in a thread). Time moves with the FakeClock only."""

from __future__ import annotations

import importlib
import json

import pytest

pytestmark = pytest.mark.django_db

REQUIRED_SNAPSHOT_KEYS = {
    "service",
    "state",
    "consecutive_failures",
    "window_calls",
    "window_failures",
    "opened_at",
    "forced",
    "force_expires_at",
    "dry_run_rejections",
    "backend",
}


def make_order(shop_app, amount_cents=1999, **fields):
    return shop_app.objects.create(amount_cents=amount_cents, **fields)


def charge(client, order, unprotected=False, method="post"):
    path = f"/orders/{order.pk}/charge{'-unprotected' if unprotected else ''}/"
    return getattr(client, method)(path)


def breakers(client, since=0):
    response = client.get(f"/breakers/?since={since}")
    assert response.status_code == 200
    return response.json()


def trip(client, shop_app, upstream):
    """Three failing charges: the third opens the breaker (failure_threshold 3)."""
    upstream.state.set_mode("fail")
    replies = [charge(client, make_order(shop_app)).json() for _ in range(3)]
    assert [r["breaker"] for r in replies] == ["closed", "closed", "open"]
    return replies


def test_fac4_charge_success_pays_the_order(shop, shop_app, client, upstream):
    """FAC-4, CB-1: a healthy upstream answers; no fallback; the order is paid."""
    order = make_order(shop_app)
    response = charge(client, order)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "paid"
    assert body["served_by"] == "upstream"
    assert body["rejected"] is False
    assert body["breaker"] == "closed"
    assert body["charge_id"] == "ch_1"
    order.refresh_from_db()
    assert (order.status, order.charge_id, order.attempts) == ("paid", "ch_1", 1)
    assert upstream.state.charge_requests == 1


def test_fac4_upstream_503_is_answered_by_the_fallback(shop, shop_app, client, upstream):
    """FAC-4, CB-2: a 503 raises in the protected call (raise_for_status), counts one
    failure, and the fallback queues the order."""
    upstream.state.set_mode("fail")
    order = make_order(shop_app)
    response = charge(client, order)
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert body["served_by"] == "fallback"
    assert body["rejected"] is False  # the call reached the upstream
    assert body["reason"] == "payments answered HTTP 503"
    order.refresh_from_db()
    assert order.status == "queued"
    assert order.last_error == "payments answered HTTP 503"
    snap = breakers(client)["breakers"]["payments"]
    assert snap["consecutive_failures"] == 1
    assert snap["state"] == "closed"


def test_cb2_cb4_open_breaker_answers_without_calling_upstream(shop, shop_app, client, upstream):
    """CB-2, CB-4, FAC-4: three failures in a row open the breaker; the next charge is
    answered by the fallback and the upstream never sees it."""
    trip(client, shop_app, upstream)
    assert upstream.state.charge_requests == 3
    order = make_order(shop_app)
    response = charge(client, order)
    assert response.status_code == 202
    body = response.json()
    assert body["served_by"] == "fallback"
    assert body["rejected"] is True
    assert body["breaker"] == "open"
    assert "not called" in body["reason"]
    assert upstream.state.charge_requests == 3  # unchanged
    order.refresh_from_db()
    assert order.status == "queued"
    data = breakers(client)
    assert data["breakers"]["payments"]["state"] == "open"
    assert [(t["from"], t["to"], t["trigger"]) for t in data["transitions"]] == [
        ("closed", "open", "consecutive_failures")
    ]
    assert data["rejections"] == {"payments": {"open": 1}}


def test_cb5_cb6_recovery_timeout_then_two_good_probes_close(shop, shop_app, client, upstream, clock):
    """CB-5, CB-6: 2 s after opening, the breaker admits probes; two successes close it."""
    trip(client, shop_app, upstream)
    upstream.state.set_mode("recover")
    clock.advance(1.9)
    assert charge(client, make_order(shop_app)).json()["rejected"] is True
    clock.advance(0.1)
    assert breakers(client)["breakers"]["payments"]["state"] == "half_open"
    first = charge(client, make_order(shop_app)).json()
    assert (first["served_by"], first["breaker"]) == ("upstream", "half_open")
    second = charge(client, make_order(shop_app)).json()
    assert (second["served_by"], second["breaker"]) == ("upstream", "closed")
    assert upstream.state.charge_requests == 5
    data = breakers(client)
    assert [(t["from"], t["to"]) for t in data["transitions"]] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_cb6_failed_probe_reopens(shop, shop_app, client, upstream, clock):
    """CB-6: a probe that meets the failing upstream reopens the breaker (half_open_failure)."""
    trip(client, shop_app, upstream)
    clock.advance(2.0)
    body = charge(client, make_order(shop_app)).json()
    assert body["served_by"] == "fallback"
    assert body["rejected"] is False  # the probe did reach the upstream
    assert body["breaker"] == "open"
    assert upstream.state.charge_requests == 4
    data = breakers(client)
    assert data["transitions"][-1]["trigger"] == "half_open_failure"
    assert data["breakers"]["payments"]["last_trigger"] == "half_open_failure"


def test_fac4_timeout_counts_as_failure_and_upstream_sees_client_leave(shop, shop_app, client, upstream, settings):
    """FAC-4, CB-10: a read timeout is a counted failure answered by the fallback; the
    upstream's hang ends when the client gives up."""
    settings.PAYMENTS_TIMEOUT = 0.3
    upstream.state.set_mode("hang")
    body = charge(client, make_order(shop_app)).json()
    assert body["served_by"] == "fallback"
    assert body["reason"] == "payments did not answer within 0.3 s"
    assert breakers(client)["breakers"]["payments"]["consecutive_failures"] == 1
    assert upstream.state.wait_for(lambda s: s.by_outcome["hang_abandoned"] == 1, timeout=5)


def test_unprotected_view_fails_with_502_and_leaves_breaker_alone(shop, shop_app, client, upstream):
    """FAC-4 (contrast): without the breaker every failure reaches the caller as a 502,
    every request reaches the upstream, and the breaker records nothing."""
    upstream.state.set_mode("fail")
    for _ in range(4):
        response = charge(client, make_order(shop_app), unprotected=True)
        assert response.status_code == 502
        assert response.json()["served_by"] == "error"
        assert response.json()["error"] == "payments answered HTTP 503"
    assert upstream.state.charge_requests == 4
    snap = breakers(client)["breakers"]["payments"]
    assert (snap["state"], snap["consecutive_failures"], snap["window_calls"]) == ("closed", 0, 0)


def test_unprotected_view_success(shop, shop_app, client, upstream):
    """CB-1 (contrast): the unprotected view pays the order when the upstream is healthy."""
    order = make_order(shop_app)
    response = charge(client, order, unprotected=True, method="get")
    assert response.status_code == 200
    assert response.json()["served_by"] == "upstream"
    order.refresh_from_db()
    assert order.status == "paid"


def test_charge_unknown_or_paid_order_never_calls_upstream(shop, shop_app, client, upstream):
    """404 for an unknown order, 409 for a paid one; neither touches the upstream or the breaker."""
    assert client.post("/orders/999999/charge/").status_code == 404
    paid = make_order(shop_app, status="paid")
    response = charge(client, paid)
    assert response.status_code == 409
    assert "already paid" in response.json()["error"]
    assert upstream.state.charge_requests == 0
    assert breakers(client)["breakers"]["payments"]["window_calls"] == 0


def test_charge_get_is_allowed_other_methods_are_not(shop, shop_app, client):
    """GET charges too (for clicking on the home page); PUT is refused with 405."""
    order = make_order(shop_app)
    assert client.put(f"/orders/{order.pk}/charge/").status_code == 405
    assert charge(client, order, method="get").json()["status"] == "paid"


def test_orders_endpoint_creates_and_validates(shop, shop_app, client):
    """POST /orders/ creates orders (JSON 201, form redirect); bad input is a 400 naming the field."""
    response = client.post(
        "/orders/", data=json.dumps({"count": 3, "amount_cents": 500}), content_type="application/json"
    )
    assert response.status_code == 201
    ids = response.json()["ids"]
    assert len(ids) == 3
    assert set(shop_app.objects.filter(pk__in=ids).values_list("amount_cents", flat=True)) == {500}
    for bad, field in (
        ({"count": 0}, "count"),
        ({"count": "x"}, "count"),
        ({"amount_cents": -1}, "amount_cents"),
        ({"count": 1.5}, "count"),
    ):
        response = client.post("/orders/", data=json.dumps(bad), content_type="application/json")
        assert response.status_code == 400, bad
        assert response.json()["error"].startswith(f"{field}="), bad
    assert client.post("/orders/", data="{nope", content_type="application/json").status_code == 400
    response = client.post("/orders/", data={"amount_cents": "750"})
    assert response.status_code == 302 and response["Location"] == "/"
    listed = client.get("/orders/").json()["orders"]
    assert listed[0]["amount_cents"] == 750
    assert len(listed) == 4


def test_home_page_lists_what_to_visit(shop, shop_app, client):
    """The front page links the JSON views, the admin and each unpaid order's charge links."""
    order = make_order(shop_app)
    html = client.get("/").content.decode()
    for needle in (
        "/breakers/",
        "/emergency/",
        "/orders/",
        "/admin/",
        f"/orders/{order.pk}/charge/",
        f"/orders/{order.pk}/charge-unprotected/",
    ):
        assert needle in html
    assert "closed" in html


def test_breakers_endpoint_serves_snapshots_and_filters_transitions(shop, shop_app, client, upstream):
    """/breakers/ returns get_breaker(name).snapshot() per known breaker; ?since=SEQ filters the log."""
    data = breakers(client)
    snap = data["breakers"]["payments"]
    assert set(snap) >= REQUIRED_SNAPSHOT_KEYS
    assert snap["config"]["failure_threshold"] == 3
    assert snap["config"]["recovery_timeout"] == 2.0
    assert snap["config"]["half_open_max_calls"] == 2
    trip(client, shop_app, upstream)
    log = breakers(client)["transitions"]
    assert len(log) == 1
    assert breakers(client, since=log[-1]["seq"])["transitions"] == []
    assert client.get("/breakers/?since=x").status_code == 400


def test_em1_emergency_endpoint_reports_the_level_this_process_sees(shop, client):
    """EM-1: /emergency/ answers the level through the process cache (0 with no level set,
    then the level set in this process at once), and /breakers/ carries it too."""
    from baldur_django import emergency

    assert client.get("/emergency/").json() == {"level": 0, "frozen": False}
    emergency.set_level(2, minutes=5, reason="test")
    assert client.get("/emergency/").json() == {"level": 2, "frozen": False}
    emergency.set_level(3, minutes=5, reason="test")
    assert client.get("/emergency/").json() == {"level": 3, "frozen": True}
    assert breakers(client)["emergency_level"] == 3
    assert client.post("/emergency/").status_code == 405


def test_em2_em3_level_3_holds_the_open_breaker_and_step_down_lets_it_probe(shop, shop_app, client, upstream, clock):
    """EM-2, EM-3: with Level 3 set after the trip, a charge past the 2 s recovery timeout
    gets the fallback without reaching the (healthy) upstream, the breaker stays OPEN and
    /breakers/ counts the rejection under ``frozen``; after one step-down (level 2) the
    next charges probe and close the breaker."""
    from baldur_django import emergency

    trip(client, shop_app, upstream)
    emergency.set_level(3, minutes=5, reason="test")
    upstream.state.set_mode("recover")
    clock.advance(1.0)
    assert charge(client, make_order(shop_app)).json()["rejected"] is True  # before the timeout: "open"
    clock.advance(1.5)
    for _ in range(2):
        body = charge(client, make_order(shop_app)).json()
        assert (body["served_by"], body["rejected"], body["breaker"]) == ("fallback", True, "open")
    assert upstream.state.charge_requests == 3  # the three failures of the trip, no probe
    data = breakers(client)
    assert data["breakers"]["payments"]["state"] == "open"
    assert data["rejections"] == {"payments": {"open": 1, "frozen": 2}}
    assert emergency.step_down() == 2
    first = charge(client, make_order(shop_app)).json()
    assert (first["served_by"], first["breaker"]) == ("upstream", "half_open")
    second = charge(client, make_order(shop_app)).json()
    assert (second["served_by"], second["breaker"]) == ("upstream", "closed")
    assert [(t["from"], t["to"]) for t in breakers(client)["transitions"]] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


@pytest.fixture
def carriers(shop, settings):
    """Two carriers, each its own real stand-in server (its own port, so its own host
    breaker), and a freshly imported ``shipping`` module (a fresh per-host adapter)."""
    import importlib

    from testproject import upstream as upstream_module
    from testproject.shop import shipping

    servers = {name: upstream_module.start_in_thread() for name in ("parcelpost", "swiftship")}
    settings.SHIPPING_CARRIERS = {name: server.url for name, server in servers.items()}
    settings.SHIPPING_TIMEOUT = 5.0
    importlib.reload(shipping)
    yield servers
    for server in servers.values():
        server.stop()


def test_hc1_shipping_quotes_get_one_breaker_per_host_and_a_failing_carrier_trips_only_its_own(
    shop, shop_app, client, carriers
):
    """HC-1: the quotes view reaches each carrier through ``BreakerAdapter()`` with no
    service name, so each host has a breaker named "127.0.0.1:PORT". One carrier answering
    503 opens its host's breaker after 5 failures in a row (the package default); from then
    on that carrier's server counts no request, while the other host's breaker stays CLOSED
    and every one of its quotes comes back."""
    bad, good = carriers["parcelpost"], carriers["swiftship"]
    bad.state.set_mode("fail")
    hosts = {name: server.url.removeprefix("http://") for name, server in carriers.items()}
    order = make_order(shop_app, amount_cents=5000)
    replies = [client.get(f"/orders/{order.pk}/shipping-quotes/") for _ in range(8)]
    assert {r.status_code for r in replies} == {200}
    bodies = [r.json() for r in replies]
    assert all(b["best"] == "swiftship" for b in bodies)
    failing = [b["quotes"]["parcelpost"] for b in bodies]
    healthy = [b["quotes"]["swiftship"] for b in bodies]
    assert {q["breaker"] for q in failing} == {hosts["parcelpost"]}
    assert {q["breaker"] for q in healthy} == {hosts["swiftship"]}
    assert [q["breaker_state"] for q in failing] == ["closed"] * 4 + ["open"] * 4
    assert [q["rejected"] for q in failing] == [False] * 5 + [True] * 3
    assert failing[0]["reason"] == "parcelpost answered HTTP 503"
    assert bad.state.stats()["quote_requests"] == 5  # none after the breaker opened
    assert [q["status"] for q in healthy] == ["quoted"] * 8 and {q["breaker_state"] for q in healthy} == {"closed"}
    assert healthy[0]["price_cents"] == 490 + 5000 // 50
    assert good.state.stats()["quote_requests"] == 8
    snapshots = breakers(client)["breakers"]
    assert snapshots[hosts["parcelpost"]]["state"] == "open"
    assert snapshots[hosts["swiftship"]]["state"] == "closed"
    assert snapshots["payments"]["state"] == "closed"  # the payments breaker is another one


def test_shipping_quotes_with_every_carrier_down_answer_503_and_unknown_order_404(shop, shop_app, client, carriers):
    """With no carrier answering, the view says so with 503 (``best`` None); an unknown
    order is 404 and calls no carrier."""
    for server in carriers.values():
        server.state.set_mode("fail")
    order = make_order(shop_app)
    response = client.get(f"/orders/{order.pk}/shipping-quotes/")
    assert response.status_code == 503
    body = response.json()
    assert body["best"] is None and {q["status"] for q in body["quotes"].values()} == {"unavailable"}
    assert client.get("/orders/999999/shipping-quotes/").status_code == 404
    assert sum(server.state.stats()["quote_requests"] for server in carriers.values()) == 2


def test_rs3_rate_lookup_through_the_guarded_service_is_refused_after_a_429(shop, shop_app, client, upstream):
    """RS-3, RS-1 in the shop: ``/orders/<id>/rate/<client>/`` answers from the fallback when
    the rates API answers 429; on the service with honor_retry_after on, the next lookup is
    refused before it is sent (reason retry_after), while the service without it sends every
    lookup; an unknown client is a 404."""
    from testproject.shop import rates

    importlib.reload(rates)
    order = make_order(shop_app)
    assert client.get(f"/orders/{order.pk}/rate/plain/").json()["status"] == "rated"
    upstream.state.set_mode("limit", retry_after=20)
    replies = [client.get(f"/orders/{order.pk}/rate/{name}/") for name in ("plain", "plain")]
    assert [r.status_code for r in replies] == [202, 202]
    assert [(r.json()["rejected"], r.json()["reason"]) for r in replies] == [(False, "HTTP 429")] * 2
    assert upstream.state.rate_requests == 3
    guarded = [client.get(f"/orders/{order.pk}/rate/guarded_plain/").json() for _ in range(3)]
    assert [(g["rejected"], g["reason"]) for g in guarded] == [(False, "HTTP 429")] + [(True, "retry_after")] * 2
    assert upstream.state.rate_requests == 4
    assert client.get(f"/orders/{order.pk}/rate/nope/").status_code == 404
