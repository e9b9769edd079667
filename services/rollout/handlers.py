"""Handlers of the rollout service: one async function per consumed contract."""

from __future__ import annotations

from shared.bus.delivery import Handler
from shared.messages import Contract

HANDLERS: dict[type[Contract], Handler] = {}
"""Contract -> handler; the service creates one durable consumer per entry."""
