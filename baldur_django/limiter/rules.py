"""Who a request is counted as (client keys) and the compiled rules of
``BALDUR_RATE_LIMIT_RULES`` (see :mod:`baldur_django.limiter`)."""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..conf import baldur_settings
from ..core.errors import ConfigError

#: Window lengths in seconds, by the unit letter of a rate.
PERIODS = {"s": 1, "m": 60, "h": 3600}


# ----------------------------------------------------------------------- client keys
def normalise_ip(text: Any) -> str | None:
    """Return the canonical text of an IP address, or None when *text* is not one.

    Accepts the forms proxies write: surrounding spaces, ``[v6]:port``, ``v4:port`` and
    a ``%zone`` suffix. IPv6 is compressed and lower-cased; an IPv4-mapped IPv6 address
    (``::ffff:192.0.2.1``) becomes the IPv4 address, so both spellings share a counter.

    Args:
        text: a string (anything else gives None).

    Returns:
        str | None: the address as :mod:`ipaddress` writes it, or None.
    """
    if not isinstance(text, str):
        return None
    value = text.strip()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return None
        value = value[1:end]
    elif value.count(":") == 1:
        value = value.partition(":")[0]  # v4 with a port
    value = value.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.compressed


def client_ip(request: Any, *, trust_forwarded_for: bool | None = None, trusted_proxies: int | None = None) -> str:
    """The client's IP address for rate limiting.

    ``REMOTE_ADDR`` unless ``X-Forwarded-For`` is trusted; then the entry
    *trusted_proxies* places from the right (each trusted proxy appends the address it
    saw), or the leftmost entry when the header is shorter than that. A missing or
    malformed forwarded entry falls back to ``REMOTE_ADDR``.

    Args:
        request: a Django ``HttpRequest``.
        trust_forwarded_for: defaults to ``BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR``.
        trusted_proxies: defaults to ``BALDUR_RATE_LIMIT_TRUSTED_PROXIES`` (>= 1).

    Returns:
        str: the normalised address, or the raw ``REMOTE_ADDR`` text (possibly ``""``)
        when it is not an IP address (a Unix socket, a test).
    """
    if trust_forwarded_for is None:
        trust_forwarded_for = baldur_settings.get("BALDUR_RATE_LIMIT_TRUST_FORWARDED_FOR")
    meta = getattr(request, "META", {})
    if trust_forwarded_for:
        forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
        entries = [part.strip() for part in forwarded.split(",") if part.strip()]
        if entries:
            if trusted_proxies is None:
                trusted_proxies = baldur_settings.get("BALDUR_RATE_LIMIT_TRUSTED_PROXIES")
            chosen = normalise_ip(entries[max(0, len(entries) - int(trusted_proxies))])
            if chosen is not None:
                return chosen
    remote = meta.get("REMOTE_ADDR", "") or ""
    return normalise_ip(remote) or str(remote)


def ip_key(request: Any) -> str:
    return "ip:" + client_ip(request)


def user_key(request: Any) -> str:
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return ip_key(request)


def import_key(setting: str, dotted: str) -> Callable[[Any], Any]:
    module_path, _, name = dotted.rpartition(".")
    if not module_path:
        raise ConfigError(
            f"{setting}={dotted!r}: expected 'ip', 'user' or a dotted path such as 'myapp.keys.by_tenant'"
        )
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigError(f"{setting}={dotted!r}: cannot import module {module_path!r} ({exc})") from exc
    try:
        func: Callable[[Any], Any] = getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{setting}={dotted!r}: module {module_path!r} has no attribute {name!r}") from None
    if not callable(func):
        raise ConfigError(f"{setting}={dotted!r}: {dotted} is not callable")
    return func


# ----------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """One compiled entry of ``BALDUR_RATE_LIMIT_RULES``.

    Attributes:
        index (int): position in the setting.
        path (str): path substring the rule applies to (``""`` matches every path).
        limit (int): requests admitted per window.
        period (int): window length in seconds (1, 60 or 3600).
        key (str): ``"ip"``, ``"user"`` or the dotted path as written.
        key_func (callable): ``request -> str | None``; None exempts the request.
        ident (str): names the rule's counters in cache keys. Built from the path, the key
            and the period, never from the limit or the position: a rate changed
            at run time keeps counting on the same counters.
    """

    index: int
    path: str
    limit: int
    period: int
    key: str
    key_func: Callable[[Any], Any]
    ident: str

    def matches(self, path: str) -> bool:
        """Whether the rule applies to a request path (substring match)."""
        return self.path in path


def compile_rules(raw: list[dict[str, Any]], setting: str = "BALDUR_RATE_LIMIT_RULES") -> tuple[Rule, ...]:
    """Turn validated rule dicts (``{"path", "rate", "key"}``) into :class:`Rule` objects.

    Args:
        raw: the parsed value of ``BALDUR_RATE_LIMIT_RULES``.
        setting: the setting name used in error messages.

    Returns:
        tuple[Rule, ...]: in the order of the setting.

    Raises:
        ConfigError: a rate that is not ``N/s``, ``N/m`` or ``N/h``, or a ``key`` dotted
            path that cannot be imported (the message names the setting and the rule).
    """
    rules = []
    for index, entry in enumerate(raw):
        where = f"{setting}[{index}]"
        rate = str(entry.get("rate", ""))
        count, _, unit = rate.partition("/")
        if not count.isdigit() or int(count) < 1 or unit not in PERIODS:
            raise ConfigError(f"{where}['rate']={rate!r}: expected 'N/s', 'N/m' or 'N/h' with N >= 1")
        key = entry.get("key", "ip") or "ip"
        if key == "ip":
            func: Callable[[Any], Any] = ip_key
        elif key == "user":
            func = user_key
        else:
            func = import_key(f"{where}['key']", key)
        path = entry.get("path", "")
        period = PERIODS[unit]
        digest = hashlib.sha1(f"{path}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()[:12]
        rules.append(Rule(index, path, int(count), period, key, func, f"{period}s-{digest}"))
    return tuple(rules)


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused by :class:`RateLimiter`.

    Attributes:
        rule (Rule): the refusing rule whose window ends last (the one that decides when
            the client may come back).
        retry_after (int): whole seconds, at least 1, until every rule that refused the
            request has started a new window: a request made that much later is
            admitted unless other requests used the room first.
        limit (int): that rule's requests per window (as configured now).
        remaining (int): requests left in that rule's window, never negative (always 0
            for a refusal, also when the rate was lowered below the hits already counted).
    """

    rule: Rule
    retry_after: int
    limit: int
    remaining: int = 0
