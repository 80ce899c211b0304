"""A django-redis ``CLIENT_CLASS`` whose connection is redis-py's ``RedisCluster`` (tests only).

django-redis ships no cluster client; a project on a Redis Cluster writes one like this
(docs/inbound.md, "On a Redis Cluster"). ``LOCATION`` is the URL of any one node.
"""

from __future__ import annotations

from typing import Any

from django_redis.client import DefaultClient


class ClusterCacheClient(DefaultClient):
    """``DefaultClient`` with ``redis.cluster.RedisCluster`` connections (2 s timeouts)."""

    def connect(self, index: int = 0) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(self._server[index], socket_timeout=2, socket_connect_timeout=2)
