"""Shared configuration objects: breakers whose effective configurations are equal hold one.

A BreakerConfig with its classifier is some 2 KB; a worker's breakers mostly share one
effective configuration. BreakerConfig is a frozen dataclass and nothing changes one after
it was built, so breakers whose configurations are equal field for field (of the same types,
the same clock object, the same overrides) can hold one object. A configuration with a
predicate is never shared: its classifier's throttle of ``circuit_breaker.predicate_failed``
lines is per breaker.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .config import BreakerConfig

__all__ = ["shared_config"]

_CONFIG_VALUES = operator.attrgetter(
    *(f.name for f in dataclasses.fields(BreakerConfig) if f.compare and f.name != "overrides")
)
_SHARED_CONFIGS: weakref.WeakValueDictionary[tuple[Any, ...], BreakerConfig] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_config(config: BreakerConfig) -> BreakerConfig:
    """The configuration object to hold for *config*: an equal one some live breaker holds
    already, else *config* itself (remembered, weakly, for the next breakers).

    Args:
        config (BreakerConfig): a resolved configuration.

    Returns:
        BreakerConfig: *config* or an equal, immutable object: every field (``clock``
        included, by identity) and every override (with its type) the same. A
        configuration with ``failure_predicate``, ``result_predicate`` or a callable in
        ``ignore_exceptions`` comes back as itself (its log throttle is its breaker's own).
    """
    if _LAST_SHARED() is config:  # the same object again (a memoised build): nothing to look up
        return config
    if config.failure_predicate is not None or config.result_predicate is not None or config.classifier.ignore_checks:
        return config
    values = _CONFIG_VALUES(config)
    try:
        key = (
            values,
            tuple(map(type, values)),
            tuple((name, type(value), value) for name, value in sorted(config.overrides.items())),
            id(config.clock),  # the config holds the clock, so the id is not reused while it lives
        )
        hash(key)
    except TypeError:  # an unhashable value (an override of a type no knob produces)
        return config
    with _SHARED_LOCK:
        known = _SHARED_CONFIGS.get(key)
        if known is None:
            known = _SHARED_CONFIGS[key] = config
        _note_shared(known)
    return known


def _no_config() -> BreakerConfig | None:
    return None


_LAST_SHARED: Callable[[], BreakerConfig | None] = _no_config  # a weak reference to the last one handed out


def _note_shared(config: BreakerConfig) -> None:
    global _LAST_SHARED
    _LAST_SHARED = weakref.ref(config)
