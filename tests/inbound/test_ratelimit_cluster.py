"""IN-4 on a Redis Cluster: the limiter's script on a django-redis cache whose connection is a
``RedisCluster`` (tests/inbound/cluster_cache.py), on the session's three-master cluster
(tests/redis_cluster.py).

The counters of one client share a hash tag, so the rules of a request that key by the same
client are one atomic ``EVALSHA`` on one master; rules keyed by different clients live in
different slots and are counted slot after slot, a refusal giving back what the earlier
slots took. Budget: under 1 s (the cluster is shared with tests/stores/test_cluster.py).
"""

from __future__ import annotations

import logging
import uuid

import pytest
from django.core.cache import caches

from tests.inbound.test_ratelimit_django_redis import MINUTE, Now, Site, _caches

pytestmark = [pytest.mark.timeout(60)]

CLIENT_CLASS = "tests.inbound.cluster_cache.ClusterCacheClient"


def by_tenant(request):
    """Rule key: the X-Tenant header."""
    return request.headers.get("X-Tenant")


@pytest.fixture
def cluster_site(configure, redis_cluster):
    """``build(rules, now)`` -> a limiter Site counting in a django-redis cache on the cluster."""

    def build(rules, now):
        prefix = f"rl-{uuid.uuid4().hex[:12]}"
        configure(CACHES=_caches(redis_cluster.url, prefix, options={"CLIENT_CLASS": CLIENT_CLASS}))
        site = Site(configure, rules, now)
        site.cluster = redis_cluster
        return site

    return build


def evalsha_calls(cluster) -> int:
    total = 0
    for port in cluster.ports:
        with cluster.node(port) as node:
            total += int((node.info("commandstats").get("cmdstat_evalsha") or {}).get("calls", 0))
    return total


def test_in4_cluster_rules_of_one_client_are_one_atomic_script(cluster_site, caplog):
    """IN-4 on a cluster: two rules keyed by ip put their counters in the client's slot; each
    request is one EVALSHA; a refusal keeps no hit; nothing fails open."""
    site = cluster_site(
        [{"path": "/api/", "rate": "2/m", "key": "ip"}, {"path": "/api/", "rate": "4/h", "key": "ip"}], Now(MINUTE)
    )
    cache = caches["limits"]
    keys = [cache.make_key(site.key(i)) for i in (0, 1)]
    assert len({site.cluster.keyslot(k) for k in keys}) == 1
    with caplog.at_level(logging.WARNING, logger="baldur.inbound"):
        assert site.get().status_code == 200  # loads the script on the first call
        before = evalsha_calls(site.cluster)
        assert site.statuses(3) == [200, 429, 429]
        assert evalsha_calls(site.cluster) - before == 3
    assert [cache.get(site.key(i)) for i in (0, 1)] == [2, 2]
    assert caplog.records == []


def test_in4_cluster_rules_of_different_clients_span_slots_and_refusals_give_back(cluster_site, caplog):
    """IN-4 on a cluster: an ip rule and a tenant rule count in two slots (two masters' worth of
    keys); a request refused by the first slot leaves the second uncounted, one refused by the
    second gives back the first slot's hit: a refused request keeps no hit anywhere."""
    rules = [
        {"path": "/api/", "rate": "2/m", "key": "ip"},
        {"path": "/api/", "rate": "3/m", "key": "tests.inbound.test_ratelimit_cluster.by_tenant"},
    ]
    site = cluster_site(rules, Now(MINUTE + 5))
    cache = caches["limits"]

    def hits(ip, tenant="acme"):
        return cache.get(site.key(0, f"ip:{ip}")), cache.get(site.key(1, tenant))

    slots = {site.cluster.keyslot(cache.make_key(k)) for k in (site.key(0, "ip:198.51.100.7"), site.key(1, "acme"))}
    assert len(slots) == 2
    tenant = {"HTTP_X_TENANT": "acme"}
    with caplog.at_level(logging.WARNING, logger="baldur.inbound"):
        assert site.statuses(2, REMOTE_ADDR="198.51.100.7", **tenant) == [200, 200]
        assert hits("198.51.100.7") == (2, 2)
        assert site.get(REMOTE_ADDR="198.51.100.7", **tenant).status_code == 429  # the ip slot refuses
        assert hits("198.51.100.7") == (2, 2)
        assert site.get(REMOTE_ADDR="198.51.100.8", **tenant).status_code == 200
        assert hits("198.51.100.8") == (1, 3)
        refused = site.get(REMOTE_ADDR="198.51.100.9", **tenant)  # the tenant slot refuses
        assert refused.status_code == 429 and refused.headers["X-RateLimit-Limit"] == "3"
        assert hits("198.51.100.9") == (0, 3)  # the ip slot gave its hit back
    assert caplog.records == []
