"""Postgres store: tables, tenant scoping, sessions and repositories."""

from shared.store.engine import Store

__all__ = ["Store"]
