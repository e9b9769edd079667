"""Subject names: `<prefix>.<tenant>.<stage>.<event>`, built and parsed in one place."""

from __future__ import annotations

import re
from typing import NamedTuple

from shared.errors import ContractError

# `\A...\Z`, not `^...$`: `$` also matches before a trailing newline, which would let
# "acme\n" through as a tenant id or subject token.
TENANT_RE = re.compile(r"\A[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
"""Tenant ids are DNS-label-like so they are safe as one subject token and in URLs."""
TOKEN_RE = re.compile(r"\A[a-z][a-z0-9_]*\Z")
"""A subject prefix, stage or event."""


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
    """Join the tokens; anything `parse` would reject is a ContractError here already."""
    validate_tenant(tenant)
    for name, token in (("prefix", prefix), ("stage", stage), ("event", event)):
        if not TOKEN_RE.match(token):
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
        if not TOKEN_RE.match(token):
            raise ContractError(f"subject {subject!r} has an invalid token {token!r}")
    return Subject(prefix, tenant, stage, event)


def dead_letter(prefix: str, subject: str) -> str:
    """Where a failed message from `subject` is kept: `<prefix>_dlq.<rest of subject>`.

    Only the tokens are kept, not checked: a message with a malformed tenant must still reach
    the dead-letter stream. A subject outside `<prefix>.` would be filed under the wrong origin.
    """
    head, dot, rest = subject.partition(".")
    if head != prefix or not dot or not rest:
        raise ContractError(f"subject {subject!r} is not under {prefix}.")
    return f"{prefix}_dlq.{rest}"
