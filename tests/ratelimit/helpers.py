"""Call-style drivers and small readings shared by the rate-limit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import requests

import baldur_django as baldur
from baldur_django.core.breaker import core_of

SYNC_STYLES = ("protected-def", "protect", "circuit_breaker-def")
ASYNC_STYLES = ("protected-async", "aprotected", "aprotect", "circuit_breaker-async")
RETRY_SYNC_STYLES = ("protected-def", "protect")
RETRY_ASYNC_STYLES = ("protected-async", "aprotected", "aprotect")


def cascade_totals(breaker) -> tuple[int, int]:
    """``(calls, sightings)`` in the breaker's cascade window right now.

    Reads a private attribute on purpose: RL-5/RL-6/RL-9 make claims about what the
    window counts that no public reading exposes.
    """
    return core_of(breaker).cascade.totals(core_of(breaker).mono())


def sync_call(kind: str, url: str, session: requests.Session, client: httpx.Client, seen: list) -> Callable[[], Any]:
    """A zero-argument HTTP call; *kind* is ``requests-raise``, ``requests-return``,
    ``httpx-raise`` or ``httpx-return``. Every response is appended to *seen*."""

    def call() -> Any:
        if kind.startswith("requests"):
            response = session.get(url, timeout=5)
        else:
            response = client.get(url)
        seen.append(response)
        if kind.endswith("raise"):
            response.raise_for_status()
        return response

    return call


def run_sync_style(style: str, service: str, call: Callable[[], Any], **options: Any) -> Any:
    """Run *call* once through the named sync call style with *options* (retry, fallback,
    overrides); ``circuit_breaker`` takes overrides only."""
    if style == "protect":
        return baldur.protect(service, call, **options)

    def target() -> Any:
        return call()

    if style == "protected-def":
        return baldur.protected(service, **options)(target)()
    if style == "circuit_breaker-def":
        return baldur.circuit_breaker(service, **options)(target)()
    raise AssertionError(f"unknown sync style {style!r}")


def run_async_style(style: str, service: str, kind: str, url: str, seen: list, **options: Any) -> Any:
    """Run one ``httpx.AsyncClient`` GET through the named async call style under
    ``asyncio.run``; *kind* is ``httpx-raise`` or ``httpx-return``."""

    async def main() -> Any:
        async with httpx.AsyncClient(timeout=5) as client:

            async def acall() -> Any:
                response = await client.get(url)
                seen.append(response)
                if kind.endswith("raise"):
                    response.raise_for_status()
                return response

            return await drive_async(style, service, acall, **options)

    return asyncio.run(main())


async def drive_async(style: str, service: str, acall: Callable[[], Any], **options: Any) -> Any:
    """Await *acall* once through the named async call style."""
    if style == "aprotect":
        return await baldur.aprotect(service, acall, **options)

    async def target() -> Any:
        return await acall()

    if style == "protected-async":
        return await baldur.protected(service, **options)(target)()
    if style == "aprotected":
        return await baldur.aprotected(service, **options)(target)()
    if style == "circuit_breaker-async":
        return await baldur.circuit_breaker(service, **options)(target)()
    raise AssertionError(f"unknown async style {style!r}")


def raised_type(kind: str) -> type[BaseException]:
    """The exception a ``*-raise`` client raises for an error status."""
    return requests.HTTPError if kind.startswith("requests") else httpx.HTTPStatusError
