"""Helpers for the tests that watch the CLOSED success lane with a profile hook: the calls of
one style, warmed up until the healthy lane applies, and the functions a batch of them enters."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable
from typing import Any

import baldur_django as baldur
from baldur_django.core.breaker import core_of
from baldur_django.core.registry import registry

STYLES = ["decorated", "protect", "async"]


def profile(run: Callable[[], Any]) -> list[tuple[str, str, str]]:
    """Every function entered (Python and C) by this thread while *run* runs."""
    events: list[tuple[str, str, str]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            events.append((event, code.co_filename, code.co_name))
        elif event == "c_call":
            events.append((event, getattr(arg, "__module__", None) or "", arg.__qualname__))

    gc.collect()
    gc.disable()  # a collection would run finalizers (Python functions) in the middle of the calls
    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return events


def warm_batch(service: str, style: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(batch, close)``: *batch* makes 50 successful calls through breaker *service* in one
    of :data:`STYLES` (a decorated ``def``, inline ``protect``, a decorated ``async def``),
    already run until the healthy lane applies; *close* releases what it holds."""

    def ok() -> int:
        return 1

    async def aok() -> int:
        return 1

    breaker = registry.get(service)
    loop: asyncio.AbstractEventLoop | None = None
    if style == "decorated":
        wrapped = baldur.circuit_breaker(service)(ok)

        def batch() -> None:
            for _ in range(50):
                wrapped()
    elif style == "protect":

        def batch() -> None:
            for _ in range(50):
                baldur.protect(service, ok)
    else:
        awrapped = baldur.circuit_breaker(service)(aok)
        loop = asyncio.new_event_loop()

        async def many() -> None:
            for _ in range(50):
                await awrapped()

        def batch() -> None:
            assert loop is not None
            loop.run_until_complete(many())

    for _ in range(3):
        batch()  # warm up: the window is full of successes, the healthy lane applies
    assert core_of(breaker).healthy_permit is not None
    return batch, (loop.close if loop is not None else (lambda: None))
