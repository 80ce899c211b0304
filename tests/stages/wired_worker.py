"""Process bodies for the wired-stage fleet tests (multiprocessing, spawn): a decorated
function whose breaker shares its state, and its stages, through Redis."""

from __future__ import annotations

from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/5"  # the wired-stage tests' own DB


def share(prefix: str) -> None:
    """Share this process's breakers through the Redis store under *prefix*."""
    from baldur_django.core.registry import registry
    from baldur_django.core.stores.redis import RedisStore, connect

    registry.set_store(RedisStore(connect(REDIS_URL, socket_timeout=5.0), prefix=prefix))


def hold_a_slot(prefix: str, inside: Any, release: Any, out: Any) -> None:
    """Call a function protected by a fleet bulkhead of one slot; inside it, set *inside*
    and wait for *release*; put what the call answered on *out*."""
    import baldur_django as baldur

    share(prefix)

    @baldur.protected("pay", max_concurrent_calls=1, bulkhead_scope="fleet")
    def pay() -> str:
        inside.set()
        release.wait(60)
        return "held"

    out.put(("holder", pay()))


def try_a_call(prefix: str, out: Any) -> None:
    """Call the same protected function once (no wait for a slot); put the answer on *out*."""
    import baldur_django as baldur

    share(prefix)

    @baldur.protected("pay", max_concurrent_calls=1, bulkhead_scope="fleet", fallback=lambda: "refused")
    def pay() -> str:
        return "ran"

    out.put(("caller", pay()))
