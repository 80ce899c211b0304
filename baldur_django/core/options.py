"""The per-breaker options a call site may pass, as a type an editor and mypy check.

``protect()``, ``aprotect()``, ``circuit_breaker()`` and the HTTP client adapters take these
as keyword arguments (``**options: Unpack[BreakerOptions]``), so a misspelt option such as
``failure_treshold=3`` is flagged before the code runs. Each option overrides the
``BALDUR_CB_*`` setting of the same meaning for that breaker; the values are validated at
run time as well (a bad one raises ``ConfigError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypedDict

#: What ``ignore_exceptions`` accepts: exception classes (ignored with their subclasses) and
#: functions ``f(exc) -> bool`` (True: ignored).
Ignorable = type[BaseException] | Callable[[BaseException], bool]


class BreakerOptions(TypedDict, total=False):
    """Breaker options; every key is optional and defaults to its ``BALDUR_CB_*`` setting.

    Keys:
        failure_threshold (int): consecutive failures that open the breaker (at least 1).
        failure_rate_threshold (float): failure percentage of the sliding window that opens
            it, 0 to 100; 0 switches the rate trigger off.
        sliding_window_size (int): calls kept by the count-based window.
        sliding_window_type (str): ``"count"`` or ``"time"``.
        sliding_window_seconds (int): length of the time-based window, in seconds.
        minimum_calls (int): calls the window needs before its rate can open the breaker.
        recovery_timeout (float): seconds an automatic open lasts before trial calls.
        half_open_max_calls (int): trial calls of one HALF_OPEN round.
        recovery_backoff_factor (float): how much longer each consecutive open lasts (1: no growth).
        recovery_timeout_max (float): the longest open, in seconds, however often it reopens.
        slow_call_duration (float): seconds from which a call counts as slow; 0 switches it off.
        slow_call_rate_threshold (float): slow-call percentage that opens the breaker.
        ignore_exceptions (tuple): exception classes and ``f(exc) -> bool`` functions whose
            exceptions are neither a success nor a failure.
        failure_predicate (Callable[[BaseException], bool]): True counts an exception as a failure.
        result_predicate (Callable[[Any], bool]): True records a returned value as a failure.
        deadline (float | None): seconds the whole protected call may take (attempts, retry
            and cooldown waits); an attempt that would start after it is refused.
        honor_retry_after (bool): refuse every call until a 429/503's Retry-After has passed.
        max_concurrent_calls (int | None): bulkhead: calls in flight at most.
        max_wait (float): seconds a call may wait for a free bulkhead slot.
        bulkhead_scope (str): ``"worker"`` or ``"fleet"``.
        retry_budget_ratio (float | None): retries at most this share of the calls.
        retry_budget_min_per_second (float): retries per second on top of the ratio.
        retry_budget_scope (str): ``"worker"`` or ``"fleet"``.
        adaptive_throttling_k (float | None): adaptive throttling's K (None: off).
        adaptive_throttling_window (float): seconds adaptive throttling counts over.
    """

    failure_threshold: int
    failure_rate_threshold: float
    sliding_window_size: int
    sliding_window_type: Literal["count", "time"]
    sliding_window_seconds: int
    minimum_calls: int
    recovery_timeout: float
    half_open_max_calls: int
    recovery_backoff_factor: float
    recovery_timeout_max: float
    slow_call_duration: float
    slow_call_rate_threshold: float
    ignore_exceptions: tuple[Ignorable, ...] | None
    failure_predicate: Callable[[BaseException], bool] | None
    result_predicate: Callable[[Any], bool] | None
    deadline: float | None
    honor_retry_after: bool
    max_concurrent_calls: int | None
    max_wait: float
    bulkhead_scope: Literal["worker", "fleet"]
    retry_budget_ratio: float | None
    retry_budget_min_per_second: float
    retry_budget_scope: Literal["worker", "fleet"]
    adaptive_throttling_k: float | None
    adaptive_throttling_window: float
