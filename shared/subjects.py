"""Subject names: `<prefix>.<tenant>.<stage>.<event>`, built and parsed in one place."""

from __future__ import annotations

import re
from typing import NamedTuple

from shared.errors import ContractError

TENANT_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
"""Tenant ids are DNS-label-like so they are safe as one subject token and in URLs."""
_TOKEN_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class Subject(NamedTuple):
    prefix: str
    tenant: str
    stage: str
    event: str

    def __str__(self) -> str:
        return f"{self.prefix}.{self.tenant}.{self.stage}.{self.event}"


def validate_tenant(tenant: str) -> str:
    if not TENANT_RE.match(tenant):
        raise ContractError(
            f"invalid tenant id {tenant!r}: use 1-63 lowercase letters, digits and inner dashes"
        )
    return tenant


def build(prefix: str, tenant: str, stage: str, event: str) -> str:
    validate_tenant(tenant)
    for name, token in (("stage", stage), ("event", event)):
        if not _TOKEN_RE.match(token):
            raise ContractError(f"invalid {name} token {token!r}")
    return f"{prefix}.{tenant}.{stage}.{event}"


def parse(subject: str, prefix: str) -> Subject:
    """Split a subject; anything that is not exactly four valid tokens is a ContractError."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != prefix:
        raise ContractError(f"subject {subject!r} is not {prefix}.<tenant>.<stage>.<event>")
    _, tenant, stage, event = parts
    validate_tenant(tenant)
    for token in (stage, event):
        if not _TOKEN_RE.match(token):
            raise ContractError(f"subject {subject!r} has an invalid token {token!r}")
    return Subject(prefix, tenant, stage, event)


def dead_letter(prefix: str, subject: str) -> str:
    """Where a failed message from `subject` is kept: `<prefix>_dlq.<rest of subject>`."""
    return f"{prefix}_dlq.{subject.split('.', 1)[1]}"
