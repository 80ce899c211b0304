"""Shared-state stores: the protocol (``base``), the transition rules (``logic``), and
the memory and Redis implementations. The database store lives in the Django layer."""

from .base import ALREADY, BLOCKED, TRIPPED, Answer, Record, StateStore, StoreUnavailable

__all__ = ["Answer", "Record", "StateStore", "StoreUnavailable", "TRIPPED", "BLOCKED", "ALREADY"]
