"""Bus contracts: payloads round-trip, malformed ones are ContractErrors, the registry is sound."""

from __future__ import annotations

import types
import uuid
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared import messages
from shared.errors import ContractError
from shared.messages import (
    Contract,
    CycleCompleted,
    RolloutRequested,
    contract_for,
    contracts,
    decode,
    encode,
    register,
)
from shared.subjects import build

BUILT_IN = [
    value
    for name, value in vars(messages).items()
    if isinstance(value, type)
    and issubclass(value, Contract)
    and value is not Contract
    and not name.startswith("_")
]

# -- strategies ------------------------------------------------------------------------------

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)


def bounded(tp: Any) -> st.SearchStrategy[Any]:
    """A value of `Annotated[int | float, msgspec.Meta(...)]` inside its bounds."""
    base, *metas = get_args(tp)
    meta = next(m for m in metas if isinstance(m, msgspec.Meta))
    if base is int:
        low = meta.ge if meta.ge is not None else (meta.gt + 1 if meta.gt is not None else None)
        high = meta.le if meta.le is not None else (meta.lt - 1 if meta.lt is not None else None)
        return st.integers(min_value=low, max_value=high)
    return st.floats(
        min_value=meta.ge if meta.ge is not None else meta.gt,
        max_value=meta.le if meta.le is not None else meta.lt,
        exclude_min=meta.gt is not None,
        exclude_max=meta.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def values(tp: Any) -> st.SearchStrategy[Any]:
    """Any valid value of a contract field's type (finite floats: JSON has no NaN)."""
    if get_origin(tp) is Annotated:
        return bounded(tp)
    if tp is uuid.UUID:
        return st.uuids()
    if tp is str:
        return st.text()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return int64
    if tp is float:
        return finite
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return instances(tp)
    origin = get_origin(tp)
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if origin is list:
        return st.lists(values(get_args(tp)[0]), max_size=5)
    if origin in (Union, types.UnionType):
        return st.one_of([values(arg) for arg in get_args(tp)])
    raise TypeError(f"no strategy for {tp!r}")


def instances(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    """`cls` with every field, defaulted or not, drawn from its type."""
    fields = {f.name: values(f.type) for f in msgspec.structs.fields(cls)}
    return st.fixed_dictionaries(fields).map(lambda kwargs: cls(**kwargs))


json_values = st.recursive(
    st.none() | st.booleans() | int64 | finite | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
contract_classes = st.sampled_from(BUILT_IN)


def payloads(contract: type[Contract]) -> st.SearchStrategy[dict[str, Any]]:
    """Valid payloads, as the JSON objects a writer would send."""
    return instances(contract).map(msgspec.to_builtins)


# -- round trips -----------------------------------------------------------------------------


@given(instances(RolloutRequested))
def test_rollout_requested_round_trips(message: RolloutRequested) -> None:
    assert decode(encode(message), RolloutRequested) == message


@given(contract_classes.flatmap(instances))
def test_every_contract_round_trips(message: Contract) -> None:
    assert decode(encode(message), type(message)) == message


def test_defaults_fill_absent_optional_fields() -> None:
    request, agent = uuid.uuid4(), uuid.uuid4()
    payload = msgspec.json.encode(
        {"request_id": str(request), "agent_id": str(agent), "environment": "wordle"}
    )
    assert decode(payload, RolloutRequested) == RolloutRequested(
        request_id=request, agent_id=agent, environment="wordle"
    )


# -- malformed input -------------------------------------------------------------------------


@given(contract_classes, st.binary())
def test_any_bytes_decode_or_raise_contract_error(contract: type[Contract], data: bytes) -> None:
    try:
        message = decode(data, contract)
    except ContractError:
        return
    assert type(message) is contract


@given(contract_classes, st.data())
def test_any_json_decodes_or_raises_contract_error(
    contract: type[Contract], data: st.DataObject
) -> None:
    """Valid payloads with some fields replaced (or alone) by arbitrary JSON."""
    base = data.draw(payloads(contract))
    mutated = data.draw(st.dictionaries(st.sampled_from([*base, "extra"]), json_values))
    payload = msgspec.json.encode(data.draw(st.sampled_from([{**base, **mutated}, mutated])))
    try:
        message = decode(payload, contract)
    except ContractError:
        return
    assert type(message) is contract


NOT_UTF8 = (
    st.binary(min_size=1, max_size=8)
    .map(lambda b: b.replace(b'"', b"").replace(b"\\", b""))
    .filter(lambda b: not _utf8(b))
)
"""Bytes that are not UTF-8 and cannot end the JSON string they are put in."""


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@given(contract_classes, st.data())
def test_bytes_that_are_not_utf8_in_a_field_are_contract_errors(
    contract: type[Contract], data: st.DataObject
) -> None:
    """A valid payload with one of its fields a string holding bytes that are not UTF-8
    (arbitrary bytes alone are never JSON with a string in it, so the tests above did not
    reach this: msgspec raises UnicodeDecodeError there, not its DecodeError). A field the
    contract does not have is skipped unread, like any unknown field."""
    base = data.draw(payloads(contract))
    key = data.draw(st.sampled_from(sorted(base)))
    mark = "\u2603placeholder\u2603"
    payload = msgspec.json.encode({**base, key: mark}).replace(mark.encode(), data.draw(NOT_UTF8))
    with pytest.raises(ContractError):
        decode(payload, contract)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"null",
        b"[]",
        b'"rollout"',
        b"{",
        b"\xff\xfe",
        b'{"request_id": "\xff"}',  # not UTF-8 inside a string: msgspec's UnicodeDecodeError
        b'{"\xc3": 1}',  # a key cut mid-character
        b"[" * 100_000,
        b'{"x":' * 100_000,
        b'{"sampling":' * 100_000,
        b'{"task_ids": ["a", ' + b"[" * 100_000,
        b'{"request_id": "not-a-uuid"}',
    ],
)
def test_malformed_payloads_are_contract_errors(payload: bytes) -> None:
    with pytest.raises(ContractError, match=r"rollout\.requested v1"):
        decode(payload, RolloutRequested)


@given(contract_classes, st.data())
def test_unknown_fields_are_ignored(contract: type[Contract], data: st.DataObject) -> None:
    base = data.draw(payloads(contract))
    extra = data.draw(
        st.dictionaries(st.text().filter(lambda key: key not in base), json_values, min_size=1)
    )
    assert decode(msgspec.json.encode({**extra, **base}), contract) == decode(
        msgspec.json.encode(base), contract
    )


@pytest.mark.parametrize(
    ("contract", "field"),
    [
        (contract, field.name)
        for contract in BUILT_IN
        for field in msgspec.structs.fields(contract)
        if field.required
    ],
)
@settings(max_examples=10)
@given(data=st.data())
def test_a_missing_required_field_is_named(
    contract: type[Contract], field: str, data: st.DataObject
) -> None:
    payload = data.draw(payloads(contract))
    del payload[field]
    with pytest.raises(ContractError, match=f"`{field}`"):
        decode(msgspec.json.encode(payload), contract)


@given(payloads(RolloutRequested))
def test_a_wrong_type_names_its_path(payload: dict[str, Any]) -> None:
    payload["sampling"] = {"max_tokens": "many"}
    with pytest.raises(ContractError, match=r"\$\.sampling\.max_tokens"):
        decode(msgspec.json.encode(payload), RolloutRequested)


def test_a_literal_outside_its_values_is_refused() -> None:
    payload = {"cycle_id": str(uuid.uuid4()), "outcome": "postponed"}
    with pytest.raises(ContractError, match="outcome"):
        decode(msgspec.json.encode(payload), CycleCompleted)


# -- registry --------------------------------------------------------------------------------


def test_every_built_in_contract_is_registered_under_its_own_kind() -> None:
    assert len(BUILT_IN) >= 8
    for contract in BUILT_IN:
        assert contract_for(contract.STAGE, contract.EVENT) is contract
    assert set(contracts()) >= set(BUILT_IN)


def test_built_in_kinds_are_unique() -> None:
    kinds = [(c.STAGE, c.EVENT) for c in BUILT_IN]
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("contract", BUILT_IN, ids=lambda c: c.__name__)
def test_built_in_kinds_are_valid_subject_tokens(contract: type[Contract]) -> None:
    build("retrace", "acme", contract.STAGE, contract.EVENT)
    assert contract.STREAM in ("events", "work")
    assert contract.VERSION >= 1


@given(st.text(max_size=20), st.text(max_size=20))
@example("rollout", "started")
@example("rollout.requested", "")
@example("", "")
def test_contract_for_an_unknown_kind_is_a_contract_error(stage: str, event: str) -> None:
    if f"{stage}.{event}" in {c.kind() for c in contracts()}:
        return
    with pytest.raises(ContractError, match="no contract"):
        contract_for(stage, event)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test stay in that test."""
    monkeypatch.setattr(messages, "_REGISTRY", dict(messages._REGISTRY))


@pytest.mark.usefixtures("registry")
def test_a_second_contract_for_a_kind_is_refused() -> None:
    class Impostor(Contract, frozen=True):
        STAGE = "rollout"
        EVENT = "requested"

    with pytest.raises(ValueError, match=r"rollout\.requested"):
        register(Impostor)
    assert contract_for("rollout", "requested") is RolloutRequested


@pytest.mark.usefixtures("registry")
def test_registering_is_idempotent_and_adds_new_kinds() -> None:
    class Probe(Contract, frozen=True):
        STAGE = "probe"
        EVENT = "sent"

    assert register(RolloutRequested) is RolloutRequested
    assert register(Probe) is Probe
    assert register(Probe) is Probe
    assert contract_for("probe", "sent") is Probe
