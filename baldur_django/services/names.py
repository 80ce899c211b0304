"""Which breaker names exist: this process's, the shared store's registry and the settings'."""

from __future__ import annotations

import difflib
import logging

from ..core import registry as registry_module
from ..core.config import settings
from ..core.errors import StoreError
from .common import UnknownServiceError, check_service

_log = logging.getLogger("baldur.audit")


def store_names(strict: bool = False) -> list[str]:
    """Names in the shared store's registry; [] on the memory backend or when it cannot
    answer (with *strict*: a :class:`StoreError` then)."""
    store = getattr(registry_module.registry, "store", None)
    if store is None:
        return []
    try:
        return [name for name in store.names() if isinstance(name, str) and name]
    except Exception as exc:  # show what this process knows rather than fail
        if strict:
            raise StoreError(
                f"the shared registry of breakers could not be read ({type(exc).__name__}: {exc}); nothing was changed"
            ) from exc
        _log.warning(
            "baldur.status_store_unavailable: the shared registry could not be read (%s); "
            "showing this process's breakers only",
            type(exc).__name__,
        )
        return []


def known_services(*, strict: bool = False) -> set[str]:
    """Every breaker name that a process or a setting knows.

    That is the breakers of this process, the names in the shared store's registry (every
    process registers the breakers it uses there), the keys of ``BALDUR_SERVICES`` and the
    breaker names of ``BALDUR_DOMAIN_MAPPING``.

    Args:
        strict: raise when the shared registry cannot be read instead of leaving its
            names out (the answer would be incomplete).

    Returns:
        set[str]: the names.

    Raises:
        ConfigError: ``BALDUR_SERVICES`` or ``BALDUR_DOMAIN_MAPPING`` is invalid.
        StoreError: only with *strict*, when the shared registry could not be read.
    """
    names = set(registry_module.registry.names()) | set(store_names(strict=strict))
    names.update(settings.get("BALDUR_SERVICES"))
    names.update(settings.get("BALDUR_DOMAIN_MAPPING").values())
    return names


def closest_services(service: str, known: set[str] | None = None) -> list[str]:
    """The known names closest to *service*, best first, at most three (``difflib``).

    Args:
        service: the name asked for.
        known: the names to choose from; None reads :func:`known_services`.

    Returns:
        list[str]: possibly empty.
    """
    pool = known_services() if known is None else known
    return difflib.get_close_matches(service, sorted(pool), n=3, cutoff=0.6)


def check_known(service: str) -> str:
    """Make sure a process or a setting knows breaker *service* before acting on it.

    Args:
        service: the breaker name.

    Returns:
        str: *service*, unchanged.

    Raises:
        ConfigError: *service* is not a non-empty string, or a setting it is checked
            against is invalid.
        UnknownServiceError: nobody knows the name; ``suggestions`` holds the closest
            known names.
        StoreError: the shared registry could not be read.
    """
    service = check_service(service)
    known = known_services(strict=True)
    if service not in known:
        raise UnknownServiceError(service, closest_services(service, known))
    return service


def unknown_here(service: str) -> None:
    """Memory backend: only this process's breakers can be acted on."""
    raise UnknownServiceError(service, closest_services(service, set(registry_module.registry.names())))
