"""Subjects `<prefix>.<tenant>.<stage>.<event>`: build and parse agree; anything else is refused."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shared.errors import ContractError
from shared.subjects import Subject, build, dead_letter, parse, validate_tenant

TENANT_CHARS = string.ascii_lowercase + string.digits + "-"


def is_tenant(text: str) -> bool:
    """The documented rule, written independently of the module's regex."""
    return (
        1 <= len(text) <= 63
        and all(c in TENANT_CHARS for c in text)
        and not text.startswith("-")
        and not text.endswith("-")
    )


tenants = st.text(TENANT_CHARS, min_size=1, max_size=63).filter(is_tenant)
tokens = st.builds(
    str.__add__,
    st.sampled_from(string.ascii_lowercase),
    st.text(string.ascii_lowercase + string.digits + "_", max_size=20),
)
subject_parts = st.tuples(tokens, tenants, tokens, tokens)


def in_namespace(prefix: str, subject: str) -> bool:
    """Whether NATS would match `subject` against `<prefix>.>`."""
    head, *rest = subject.split(".")
    return head == prefix and len(rest) >= 1 and all(rest)


# -- build and parse -------------------------------------------------------------------------


@given(subject_parts)
def test_parse_inverts_build(parts: tuple[str, str, str, str]) -> None:
    prefix, tenant, stage, event = parts
    subject = build(prefix, tenant, stage, event)
    assert subject == ".".join(parts)
    assert parse(subject, prefix) == Subject(prefix, tenant, stage, event)
    assert str(parse(subject, prefix)) == subject


def _variants(subject: str, prefix: str, tenant: str) -> list[str]:
    """Ways to spoil a valid subject, each of which parse must refuse."""
    parts = subject.split(".")
    spoiled = [
        subject + ".extra",
        "x." + subject,
        ".".join(parts[:3]),
        ".".join(parts[1:]),
        subject + ".",
        "." + subject,
        subject.replace(".", "..", 1),
        subject + "\n",
        " " + subject,
        "other" + subject,
        ".".join(["other_" + prefix, *parts[1:]]),
    ]
    for i in range(1, 4):
        for bad in ("*", ">", "", " ", parts[i] + " ", parts[i] + "\n", parts[i] + "*"):
            spoiled.append(".".join([*parts[:i], bad, *parts[i + 1 :]]))
    if tenant.upper() != tenant:
        spoiled.append(".".join([prefix, tenant.upper(), *parts[2:]]))
    return spoiled


@given(subject_parts, st.data())
def test_parse_refuses_every_spoiled_subject(
    parts: tuple[str, str, str, str], data: st.DataObject
) -> None:
    prefix, tenant, stage, event = parts
    subject = build(prefix, tenant, stage, event)
    bad = data.draw(st.sampled_from(_variants(subject, prefix, tenant)))
    with pytest.raises(ContractError):
        parse(bad, prefix)


@pytest.mark.parametrize(
    "subject",
    [
        "retrace.acme.rollout.*",
        "retrace.acme.>",
        "retrace.*.rollout.requested",
        "retrace.acme.rollout.requested.v2",
        "retrace.acme.rollout",
        "retrace..rollout.requested",
        "retrace.acme.rollout.requested\n",
        "retrace.acme\n.rollout.requested",
        "retrace.Acme.rollout.requested",
        "retrace.ac me.rollout.requested",
        "retrace.-acme.rollout.requested",
        "retrace.acme.Rollout.requested",
        "retrace.acme.1rollout.requested",
        "retrace.acme.roll-out.requested",
        "other.acme.rollout.requested",
        "Retrace.acme.rollout.requested",
        "",
    ],
)
def test_parse_refuses(subject: str) -> None:
    with pytest.raises(ContractError):
        parse(subject, "retrace")


@given(st.text(max_size=80), tokens, tokens, tokens)
def test_parse_accepts_exactly_the_valid_subjects(
    tenant: str, prefix: str, stage: str, event: str
) -> None:
    subject = f"{prefix}.{tenant}.{stage}.{event}"
    if is_tenant(tenant):
        assert parse(subject, prefix).tenant == tenant
    else:
        with pytest.raises(ContractError):
            parse(subject, prefix)


@pytest.mark.parametrize(
    ("prefix", "tenant", "stage", "event"),
    [
        ("retrace", "Acme", "rollout", "requested"),
        ("retrace", "acme.eu", "rollout", "requested"),
        ("retrace", "*", "rollout", "requested"),
        ("retrace", "acme", "roll.out", "requested"),
        ("retrace", "acme", "rollout", ">"),
        ("retrace", "acme", "", "requested"),
        ("retrace", "acme", "rollout", "requested\n"),
        ("retrace.prod", "acme", "rollout", "requested"),
        ("re*", "acme", "rollout", "requested"),
        ("", "acme", "rollout", "requested"),
    ],
)
def test_build_refuses_what_parse_would(prefix: str, tenant: str, stage: str, event: str) -> None:
    with pytest.raises(ContractError):
        build(prefix, tenant, stage, event)


@given(st.text(max_size=12), tenants, tokens, tokens)
def test_whatever_build_returns_parses_back(
    prefix: str, tenant: str, stage: str, event: str
) -> None:
    try:
        subject = build(prefix, tenant, stage, event)
    except ContractError:
        return
    assert parse(subject, prefix) == (prefix, tenant, stage, event)


# -- tenants ---------------------------------------------------------------------------------


@given(st.text(TENANT_CHARS + "A_. \n*>", max_size=70) | st.text(max_size=70))
@example("a" * 63)
@example("a" * 64)
@example("acme\n")
@example("é")
def test_validate_tenant_follows_the_documented_rule(text: str) -> None:
    if is_tenant(text):
        assert validate_tenant(text) == text
    else:
        with pytest.raises(ContractError, match="tenant"):
            validate_tenant(text)


# -- dead letters ----------------------------------------------------------------------------


@given(subject_parts)
def test_dead_letter_leaves_the_event_namespace(parts: tuple[str, str, str, str]) -> None:
    prefix = parts[0]
    subject = build(*parts)
    letter = dead_letter(prefix, subject)
    assert not in_namespace(prefix, letter)
    assert in_namespace(f"{prefix}_dlq", letter)  # the dead-letter stream's filter
    assert letter.split(".")[1:] == subject.split(".")[1:]


@given(tokens, st.text(max_size=30))
def test_dead_letter_files_any_subject_under_the_prefix(prefix: str, rest: str) -> None:
    """Malformed subjects are dead-lettered too, so only the prefix is required."""
    subject = f"{prefix}.{rest}"
    if not rest:
        with pytest.raises(ContractError):
            dead_letter(prefix, subject)
        return
    letter = dead_letter(prefix, subject)
    assert letter == f"{prefix}_dlq.{rest}"
    assert letter.split(".", 1)[0] != prefix


@pytest.mark.parametrize("subject", ["retrace", "other.acme.rollout.requested", "retrace_x.a.b.c"])
def test_dead_letter_refuses_a_subject_from_elsewhere(subject: str) -> None:
    with pytest.raises(ContractError):
        dead_letter("retrace", subject)
