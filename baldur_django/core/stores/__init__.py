"""Shared-state stores: the protocol (``base``) and the memory and Redis implementations;
the transitions they apply are computed by ``core/steps.py`` (with the verdicts of ``core/rules.py``). The database store lives in the Django layer."""

from .base import ALREADY, BLOCKED, TRIPPED, Answer, Record, StateStore, StoreUnavailable

__all__ = ["Answer", "Record", "StateStore", "StoreUnavailable", "TRIPPED", "BLOCKED", "ALREADY"]
