"""Creating a breaker (issue 21): the default configuration is built once per settings
version and shared, and the decorators register a breaker once per decoration. CFG-1,
CFG-2, CB-12, FAC-1.

Each test could fail: a memo that outlived a settings change, served a service with a
``BALDUR_SERVICES`` entry, ignored the clock, or was stored under the version read after
a racing reset; a decorator that kept a breaker the registry dropped.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

import baldur_django as baldur
from baldur_django.core.config import MISSING, SettingsSource, build_config, settings
from baldur_django.core.errors import ConfigError
from baldur_django.core.registry import registry
from baldur_django.core.testing import FakeClock


def test_cfg2_breakers_without_overrides_share_one_configuration_per_settings_version():
    """Two services with no override and no BALDUR_SERVICES entry get the very same frozen
    configuration; after reset() a new one is built (and shared again)."""
    environ = {"BALDUR_CB_FAILURE_THRESHOLD": "7"}
    src = SettingsSource(environ=environ)
    first = build_config("a", {}, src)
    assert build_config("b", {}, src) is first
    assert first.failure_threshold == 7
    environ["BALDUR_CB_FAILURE_THRESHOLD"] = "9"
    assert build_config("c", {}, src) is first  # cached values hold until reset (CFG-1)
    src.reset()
    second = build_config("d", {}, src)
    assert second is not first
    assert second.failure_threshold == 9
    assert build_config("a", {}, src) is second


def test_cfg1_services_entry_and_overrides_are_never_served_the_shared_default():
    services = {"pay": {"failure_threshold": 2}}
    src = SettingsSource(lookup=lambda name: services if name == "BALDUR_SERVICES" else MISSING, environ={})
    default = build_config("other", {}, src)
    pay = build_config("pay", {}, src)
    assert pay.failure_threshold == 2 and default.failure_threshold == 5
    assert build_config("other", {"failure_threshold": 4}, src).failure_threshold == 4
    assert build_config("again", {}, src) is default  # the entry did not replace the memo


def test_cfg1_the_shared_default_is_per_clock():
    src = SettingsSource(environ={})
    one, two = FakeClock(), FakeClock()
    first = build_config("a", {}, src, one)
    assert first.clock is one
    other = build_config("b", {}, src, two)
    assert other.clock is two
    assert build_config("c", {}, src, two) is other


def test_cfg3_a_bad_setting_raises_on_every_build_after_a_good_one():
    environ = {"BALDUR_CB_FAILURE_THRESHOLD": "3"}
    src = SettingsSource(environ=environ)
    build_config("a", {}, src)
    environ["BALDUR_CB_FAILURE_THRESHOLD"] = "zero"
    src.reset()
    for name in ("b", "a", "b"):
        with pytest.raises(ConfigError, match="BALDUR_CB_FAILURE_THRESHOLD"):
            build_config(name, {}, src)
    environ["BALDUR_CB_FAILURE_THRESHOLD"] = "4"
    src.reset()
    assert build_config("b", {}, src).failure_threshold == 4


def test_cfg2_a_reset_racing_with_a_build_is_not_hidden_by_the_memo():
    """A setting changed (and reset) while a configuration was being built: the build in
    flight may mix values, but the next build reads the new ones: the memo was stored
    under the version read before the build."""
    values = {"BALDUR_CB_FAILURE_THRESHOLD": 3}
    src = SettingsSource(lookup=lambda name: values.get(name, MISSING), environ={})
    raced = []

    def lookup(name):
        if name == "BALDUR_DRY_RUN" and not raced:  # read after the threshold
            raced.append(name)
            values["BALDUR_CB_FAILURE_THRESHOLD"] = 8
            src.reset()
        return values.get(name, MISSING)

    src.set_lookup(lookup)
    during = build_config("a", {}, src)
    assert raced and during.failure_threshold == 3
    assert build_config("b", {}, src).failure_threshold == 8


def test_cfg2_process_settings_change_reaches_new_and_existing_breakers(monkeypatch):
    before = baldur.get_breaker("memo-old")
    assert before.config.failure_threshold == 5
    monkeypatch.setenv("BALDUR_CB_FAILURE_THRESHOLD", "2")
    settings.reset()
    assert baldur.get_breaker("memo-new").config.failure_threshold == 2
    registry.reconfigure_all()
    assert before.config.failure_threshold == 2
    assert before.config is baldur.get_breaker("memo-new").config


# ------------------------------------------------------------ one registration per decoration
@pytest.mark.parametrize("factory", ["circuit_breaker", "protected", "aprotected"])
def test_cb12_a_decorator_factory_whose_breaker_was_dropped_uses_the_registrys(factory):
    """The factory registers the breaker and the decoration reuses it, unless the registry
    dropped it meanwhile (clear, forget): then the decoration registers it again."""

    async def acall():
        return 1

    def call():
        return 1

    make = getattr(baldur, factory)
    func = acall if factory == "aprotected" else call
    kept = make("memo-kept", failure_threshold=2)
    assert kept(func).breaker is registry.get("memo-kept", create=False)
    for drop in (registry.clear, lambda: registry.forget("memo-drop")):
        decorate = make("memo-drop", failure_threshold=2)
        dropped = registry.get("memo-drop", create=False)
        drop()
        wrapped = decorate(func)
        assert wrapped.breaker is registry.get("memo-drop", create=False)
        assert wrapped.breaker is not dropped
        assert wrapped.breaker.config.failure_threshold == 2


def test_fac1_plain_function_shortcut_decides_as_inspect_does():
    def gen():
        yield 1

    async def agen():
        yield 1

    async def coro():
        return 2

    for refused in (gen, agen, lambda: (yield)):
        with pytest.raises(ConfigError, match="generator function"):
            baldur.circuit_breaker("memo-gen")(refused)
    wrapped = baldur.circuit_breaker("memo-async")(coro)
    assert asyncio.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped()) == 2
    assert asyncio.iscoroutinefunction(baldur.circuit_breaker("memo-partial")(functools.partial(coro)))
    assert baldur.circuit_breaker("memo-lambda")(lambda: 3)() == 3
    with pytest.raises(ConfigError, match="needs an async def"):
        baldur.aprotected("memo-sync")(lambda: 3)
