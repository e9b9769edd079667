"""Tenant scoping: every ORM query and flush on a session is checked against its tenant.

A session is opened either for one tenant (`info["tenant_id"]`) or explicitly across tenants
(`info["cross_tenant"] = True`, for the control plane). A session with neither cannot touch a
tenant-owned table at all, so forgetting the scope is an error, not a leak.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import ORMExecuteState, Session, with_loader_criteria
from sqlalchemy.sql.util import find_tables

from shared.errors import CrossTenantError, UnscopedQueryError
from shared.store.models import Base, Tenant, TenantOwned

TENANT_KEY = "tenant_id"
CROSS_TENANT_KEY = "cross_tenant"


_SCOPED_TABLES = {
    str(m.persist_selectable.name)  # type: ignore[attr-defined]
    for m in Base.registry.mappers
    if issubclass(m.class_, (TenantOwned, Tenant))
}


def _scoped(cls: type) -> bool:
    return isinstance(cls, type) and (issubclass(cls, TenantOwned) or cls is Tenant)


@event.listens_for(Session, "do_orm_execute")
def _filter_by_tenant(state: ORMExecuteState) -> None:
    if not (state.is_select or state.is_update or state.is_delete or state.is_insert):
        return
    if state.is_column_load or state.is_relationship_load:
        return  # the parent query was already scoped
    info = state.session.info
    if info.get(CROSS_TENANT_KEY):
        return
    tenant = info.get(TENANT_KEY)
    if tenant is None:
        touched = _scoped_tables(state.statement)
        if touched:
            names = ", ".join(sorted(touched))
            raise UnscopedQueryError(f"query on {names} from a session without a tenant scope")
        return
    if state.is_insert:
        _check_insert_values(state, tenant)
        return
    if state.is_update:
        _check_update_values(state, tenant)
    state.statement = state.statement.options(
        with_loader_criteria(
            TenantOwned, lambda cls: cls.tenant_id == tenant, include_aliases=True
        ),
        with_loader_criteria(Tenant, Tenant.id == tenant, include_aliases=True),
    )


def _scoped_tables(statement: Any) -> set[str]:
    """Names of tenant-owned tables anywhere in a statement: FROMs, joins, subqueries, DML."""
    tables = find_tables(
        statement,
        check_columns=True,
        include_aliases=True,
        include_joins=True,
        include_selects=True,
        include_crud=True,
    )
    return {t.name for t in tables if isinstance(t, Table) and t.name in _SCOPED_TABLES}


def _check_update_values(state: ORMExecuteState, tenant: str) -> None:
    """An UPDATE may not move rows to another tenant (the filter only picks which rows)."""
    values = getattr(state.statement, "_values", None) or {}
    changed = {getattr(key, "key", str(key)) for key in values}
    table = getattr(getattr(state.statement, "table", None), "name", None)
    if TENANT_KEY in changed or (table == "tenants" and "id" in changed):
        raise CrossTenantError(f"an UPDATE may not change which tenant owns a row ({tenant!r})")


def _check_insert_values(state: ORMExecuteState, tenant: str) -> None:
    params: Any = state.parameters
    rows = params if isinstance(params, list) else [params or {}]
    compiled = getattr(state.statement, "_values", None) or {}
    for key, value in compiled.items():
        if getattr(key, "key", key) == TENANT_KEY and getattr(value, "value", value) != tenant:
            raise CrossTenantError(
                f"insert for tenant {getattr(value, 'value', value)!r} from {tenant!r}"
            )
    for row in rows:
        if isinstance(row, dict) and row.get(TENANT_KEY, tenant) != tenant:
            raise CrossTenantError(f"insert for tenant {row[TENANT_KEY]!r} from {tenant!r}")


@event.listens_for(Session, "before_flush")
def _check_writes(session: Session, _ctx: Any, _instances: Any) -> None:
    if session.info.get(CROSS_TENANT_KEY):
        return
    tenant = session.info.get(TENANT_KEY)
    for obj in [*session.new, *session.dirty, *session.deleted]:
        if not _scoped(type(obj)):
            continue
        if tenant is None:
            raise UnscopedQueryError(f"write to {type(obj).__tablename__} without a tenant scope")
        if isinstance(obj, TenantOwned) and obj in session.new and obj.tenant_id is None:
            obj.tenant_id = tenant
        owner = obj.id if isinstance(obj, Tenant) else obj.tenant_id
        if owner != tenant:
            raise CrossTenantError(
                f"{type(obj).__tablename__} row of tenant {owner!r} written from {tenant!r}"
            )
