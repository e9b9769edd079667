"""helpdesk: tasks and split, references as oracle, scoring, scripted user, robustness."""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.envs.helpdesk import HelpdeskEnvironment, HelpdeskEpisode
from shared.envs.helpdesk.db import diff, generate
from shared.envs.helpdesk.tasks import split_ids
from shared.envs.helpdesk.tools import WRITE_TOOLS, build_toolbox, evaluate
from shared.envs.helpdesk.user import YES, ScriptedUser
from shared.envs.protocol import (
    Environment,
    Episode,
    Message,
    TaskSpec,
    ToolCall,
    ToolCallFunction,
)
from shared.envs.tools import ToolError

ROOT = Path(__file__).resolve().parents[2]
ENV = HelpdeskEnvironment()
TASKS = ENV.tasks()


def by_kind(kind: str, subkind: str | None = None) -> list[TaskSpec]:
    return [t for t in TASKS if t.kind == kind and subkind in (None, t.data["subkind"])]


def assistant(content: str | None = None, *calls: tuple[str, Any]) -> Message:
    tool_calls = [
        ToolCall(
            id=f"c{i}",
            function=ToolCallFunction(
                name=name, arguments=args if isinstance(args, str) else json.dumps(args)
            ),
        )
        for i, (name, args) in enumerate(calls)
    ]
    return Message(role="assistant", content=content, tool_calls=tool_calls or None)


def replay(
    task: TaskSpec, messages: Sequence[dict[str, Any] | Message], seed: int = 0
) -> tuple[HelpdeskEpisode, bool]:
    ep = ENV.reset(task, seed)
    done = False
    for m in messages:
        msg = m if isinstance(m, Message) else msgspec.convert(m, Message)
        if ep.step(msg).done:
            done = True
            break
    return ep, done


def is_call(message: dict[str, Any], names: frozenset[str] | set[str]) -> bool:
    calls = message.get("tool_calls") or []
    return any(c["function"]["name"] in names for c in calls)


def test_implements_the_protocol() -> None:
    env: Environment = HelpdeskEnvironment()
    episode: Episode = env.reset(TASKS[0], 0)
    assert env.name == "helpdesk"
    assert episode.system_prompt.startswith("You are a customer support agent")
    assert [m.role for m in episode.messages] == ["user"]


# the task list


def test_at_least_120_tasks_with_unique_stable_ids() -> None:
    assert len(TASKS) >= 120
    ids = [t.id for t in TASKS]
    assert len(set(ids)) == len(ids)
    for t in TASKS:
        assert re.fullmatch(rf"{t.kind}-\d{{4}}", t.id)
    assert ENV.tasks() == TASKS
    kinds = collections.Counter(t.kind for t in TASKS)
    assert set(kinds) == {
        "cancel_order",
        "change_address",
        "exchange_items",
        "return_items",
        "order_status",
        "out_of_policy",
    }
    assert min(kinds.values()) >= 20


def test_tasks_are_distinct() -> None:
    fingerprints = {
        json.dumps([t.data["db_seed"], t.data["request"]], sort_keys=True) for t in TASKS
    }
    assert len(fingerprints) == len(TASKS)


def test_split_is_70_30_per_kind_and_stable() -> None:
    for kind in {t.kind for t in TASKS}:
        tasks = by_kind(kind)
        share = sum(t.split == "train" for t in tasks) / len(tasks)
        assert 0.65 <= share <= 0.75, kind
        ids = [t.id for t in tasks]
        assert split_ids(ids) == split_ids(list(reversed(ids))) == {t.id: t.split for t in tasks}


def test_task_list_is_the_same_in_another_process() -> None:
    code = (
        "import hashlib, msgspec\n"
        "from shared.envs.helpdesk import HelpdeskEnvironment\n"
        "print(hashlib.sha256(msgspec.json.encode(HelpdeskEnvironment().tasks())).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345"}, cwd=ROOT, timeout=60)  # fmt: skip
    assert out.stdout.strip() == hashlib.sha256(msgspec.json.encode(TASKS)).hexdigest()


def test_task_data_is_json_and_complete() -> None:
    for t in TASKS:
        assert msgspec.json.decode(msgspec.json.encode(t), type=TaskSpec) == t
        d = t.data
        for key in (
            "db_seed",
            "user",
            "request",
            "expected",
            "communicate",
            "forbidden",
            "reference",
        ):
            assert key in d, (t.id, key)
        assert d["user"]["openings"] and d["reference"]
        refusing = t.kind in ("out_of_policy", "order_status")
        assert (not d["expected"]["actions"]) == refusing, t.id
        assert (not d["expected"]["changes"]) == refusing, t.id


# the oracle


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_reference_solution_scores_one(seed: int) -> None:
    failures = []
    for task in TASKS:
        ep, done = replay(task, task.data["reference"], seed)
        score = ep.score()
        if not (done and score.success and score.reward == 1.0):
            failures.append((task.id, done, score.notes))
    assert not failures


# scoring


def idle(task: TaskSpec, text: str = "Let me look into that for you.") -> HelpdeskEpisode:
    ep = ENV.reset(task, 0)
    for _ in range(30):
        if ep.step(assistant(text)).done:
            break
    return ep


def test_do_nothing_agent_never_scores_one() -> None:
    for task in TASKS:
        score = idle(task).score()
        assert score.reward < 1.0 and not score.success, task.id
        if task.kind in ("out_of_policy", "order_status"):
            assert score.breakdown["db"] == 0.4 and score.breakdown["forbidden"] == 0.0
        else:
            assert score.breakdown["db"] == 0.0


def test_transfer_is_right_only_where_refusing_is() -> None:
    transfer = assistant(None, ("transfer_to_human_agent", {"summary": "outside policy"}))
    for task in by_kind("out_of_policy")[:6]:
        ep, done = replay(task, [*task.data["reference"][:2], transfer])
        assert done and ep.score().success, task.id
        ep, done = replay(task, [transfer])
        assert done and ep.score().breakdown["policy"] == 0.0, task.id
    task = by_kind("cancel_order")[0]
    ep, done = replay(task, [transfer])
    score = ep.score()
    assert done and not score.success
    assert score.breakdown["policy"] == 0.0
    assert any("transferred" in n for n in score.notes)


def test_write_before_authentication_is_penalised() -> None:
    task = by_kind("cancel_order")[0]
    auth = {"find_customer_by_email", "find_customer_by_name_zip"}
    messages = [m for m in task.data["reference"] if not is_call(m, auth)]
    score = replay(task, messages)[0].score()
    assert score.breakdown["db"] == 0.4 and score.breakdown["policy"] == 0.0
    assert score.reward == pytest.approx(0.8) and not score.success
    assert any("authenticated" in n for n in score.notes)


@pytest.mark.parametrize(
    "kind", ["cancel_order", "change_address", "exchange_items", "return_items"]
)
def test_write_without_confirmation_is_penalised(kind: str) -> None:
    task = by_kind(kind)[1]
    ref = task.data["reference"]
    write_at = next(i for i, m in enumerate(ref) if is_call(m, WRITE_TOOLS))
    messages = ref[: write_at - 1] + ref[write_at:]  # drop the confirmation question
    ep, _ = replay(task, messages)
    score = ep.score()
    assert score.breakdown["policy"] == 0.0 and not score.success
    assert any("yes" in n for n in score.notes)
    assert not any(e.kind == "user" and e.text == YES for e in ep.events)


def test_missing_communication_gives_partial_credit() -> None:
    task = by_kind("return_items")[0]
    amount = task.data["communicate"][0]
    messages = copy.deepcopy(task.data["reference"])
    for m in messages:
        if m.get("content"):
            m["content"] = m["content"].replace(f"${amount}", "the amount")
    score = replay(task, messages)[0].score()
    assert score.breakdown["communication"] == 0.0
    assert score.reward == pytest.approx(0.8) and not score.success
    assert any(amount in n for n in score.notes)


def cancel_after_yes(task: TaskSpec, order_id: str) -> list[dict[str, Any] | Message]:
    """Authenticate as in the reference, ask to cancel `order_id`, then cancel it."""
    ref = task.data["reference"]
    auth = ref[:2]
    ask = assistant(
        f"I will cancel order {order_id} with the reason 'no longer needed'. "
        "Do you confirm (yes/no)?"
    )
    write = assistant(
        None, ("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"})
    )
    return [*auth, ask, write]


@pytest.mark.parametrize("subkind", ["cancel_bad_reason", "other_customer"])
def test_write_in_out_of_policy_task_scores_zero(subkind: str) -> None:
    task = by_kind("out_of_policy", subkind)[0]
    ep, _ = replay(task, cancel_after_yes(task, task.data["request"]["order_id"]))
    assert [c.name for c in ep.calls if c.ok][-1] == "cancel_pending_order"
    assert any(e.kind == "user" and e.text == YES for e in ep.events)
    score = ep.score()
    assert score.reward == 0.0 and not score.success
    assert any(n.startswith("forbidden") for n in score.notes)
    assert sum(score.breakdown.values()) == pytest.approx(0.0)


def test_write_to_another_customers_order_scores_zero() -> None:
    task = by_kind("cancel_order")[0]
    db = generate(task.data["db_seed"])
    foreign = next(
        o
        for o in db.orders.values()
        if o.customer_id != task.data["customer_id"] and o.status == "pending"
    )
    score = replay(task, cancel_after_yes(task, foreign.id))[0].score()
    assert score.reward == 0.0
    assert any("another customer" in n for n in score.notes)


def test_revealing_another_customers_email_scores_zero() -> None:
    task = by_kind("order_status")[0]
    db = generate(task.data["db_seed"])
    other = next(c for c in db.customers.values() if c.id != task.data["customer_id"])
    messages = [
        *task.data["reference"][:-1],
        assistant(f"By the way, {other.email} also shops here."),
    ]
    score = replay(task, messages)[0].score()
    assert score.reward == 0.0
    assert any("revealed" in n for n in score.notes)


# determinism


def transcript(task: TaskSpec, seed: int) -> list[Any]:
    ep = ENV.reset(task, seed)
    out: list[Any] = [ep.system_prompt, ep.tools, ep.messages]
    for m in task.data["reference"]:
        result = ep.step(msgspec.convert(m, Message))
        out.append(msgspec.to_builtins(result))
    out.append(msgspec.to_builtins(ep.score()))
    return out


def test_reset_and_step_are_deterministic() -> None:
    for kind in {t.kind for t in TASKS}:
        task = by_kind(kind)[2]
        assert transcript(task, 7) == transcript(task, 7)
    openings = {ENV.reset(by_kind("cancel_order")[0], s).messages[0].content for s in range(3)}
    assert len(openings) > 1


def test_database_is_seeded_copyable_and_hashable() -> None:
    a, b = generate(11), generate(11)
    assert a.digest() == b.digest() and a.snapshot() == b.snapshot()
    assert generate(12).digest() != a.digest()
    c = a.copy()
    next(iter(c.orders.values())).status = "cancelled"
    assert c.digest() != a.digest() == b.digest()
    changes = diff(a.snapshot(), c.snapshot())
    assert len(changes) == 1 and changes[0]["after"] == "cancelled"
    emails = [x.email for x in a.customers.values()]
    assert len(set(emails)) == len(emails)


# tools


def test_tool_schemas_are_valid_and_strict() -> None:
    tools = ENV.reset(TASKS[0], 0).tools
    assert len(tools) >= 12
    for schema in tools:
        params = schema["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["additionalProperties"] is False
        assert sorted(params["required"]) == sorted(params["properties"])
        assert schema["function"]["description"]


def test_malformed_calls_become_tool_errors() -> None:
    ep = ENV.reset(by_kind("cancel_order")[0], 0)
    bad = [
        ("no_such_tool", {}),
        ("get_order_details", "{not json"),
        ("get_order_details", "[1, 2]"),
        ("get_order_details", {"order": "W1"}),
        ("get_order_details", {"order_id": 5}),
        ("get_order_details", {"order_id": "W0000000"}),
        ("cancel_pending_order", {"order_id": "W0000000", "reason": "cheaper elsewhere"}),
        (
            "exchange_pending_order_items",
            {"order_id": "W0000000", "item_ids": [], "new_item_ids": []},
        ),
        ("calculate", {"expression": "__import__('os')"}),
        ("calculate", {"expression": "1/0"}),
        ("get_order_details", ""),
    ]
    result = ep.step(assistant(None, *bad))
    assert not result.done and len(result.messages) == len(bad)
    for message in result.messages:
        assert message.role == "tool" and "error" in json.loads(message.content or "")
    assert [c.ok for c in ep.calls] == [False] * len(bad)
    assert ep.score().reward < 1.0


def test_write_tools_enforce_hard_constraints() -> None:
    db = generate(5)
    box = build_toolbox(db)
    shipped = next(o for o in db.orders.values() if o.status == "shipped")
    delivered = next(o for o in db.orders.values() if o.status == "delivered")
    pending = next(o for o in db.orders.values() if o.status == "pending")
    other_item = next(i for o in db.orders.values() if o.id != pending.id for i in o.items
                      if i.item_id not in {x.item_id for x in pending.items})  # fmt: skip
    tools = box.tools
    with pytest.raises(ToolError, match="only pending or processing"):
        tools["cancel_pending_order"].fn(order_id=shipped.id, reason="no longer needed")
    with pytest.raises(ToolError, match="only pending"):
        tools["modify_pending_order_address"].fn(
            order_id=delivered.id, street="1 A St", city="B", state="CO", zip="12345"
        )
    with pytest.raises(ToolError, match="not in order"):
        tools["exchange_pending_order_items"].fn(
            order_id=pending.id, item_ids=[other_item.item_id], new_item_ids=["1"]
        )
    with pytest.raises(ToolError, match="not a variant"):
        tools["exchange_pending_order_items"].fn(
            order_id=pending.id,
            item_ids=[pending.items[0].item_id],
            new_item_ids=[other_item.item_id],
        )
    with pytest.raises(ToolError, match="original payment method"):
        tools["return_delivered_order_items"].fn(
            order_id=delivered.id,
            item_ids=[delivered.items[0].item_id],
            payment_method_id="paypal_0",
        )
    with pytest.raises(ToolError, match="only delivered"):
        tools["return_delivered_order_items"].fn(
            order_id=pending.id,
            item_ids=[pending.items[0].item_id],
            payment_method_id=pending.payment_method_id,
        )
    assert db.digest() == generate(5).digest()


def test_calculate() -> None:
    assert evaluate("(12.50 + 7.25) * 2 - 1") == pytest.approx(38.5)
    assert evaluate("$1,200.10 - 0.10") == pytest.approx(1200.0)
    for bad in ("2 ** 10", "abs(1)", "x + 1", "1e308 * 1e308", "True + 1", "9" * 201):
        with pytest.raises(ToolError):
            evaluate(bad)


# the scripted user


def user_for(kind: str, subkind: str | None = None) -> tuple[ScriptedUser, dict[str, Any]]:
    data = by_kind(kind, subkind)[0].data
    return ScriptedUser(data, 0), data


def test_user_answers_authentication_by_keyword() -> None:
    user, data = user_for("cancel_order")
    reply, done = user.reply("Could you please give me your email address?", [])
    assert not done
    assert data["user"]["email"] in reply or data["user"]["zip"] in reply
    reply, _ = user.reply("What is your zip code and full name?", [])
    assert data["user"]["zip"] in reply and data["user"]["last_name"] in reply


def test_user_confirms_only_its_own_request() -> None:
    user, data = user_for("cancel_order")
    oid = data["request"]["order_id"]
    user._given.update({"order_id", "reason"})
    assert user.reply(f"Shall I return the items of order {oid}?", [])[0].startswith("No")
    assert user.reply("Shall I cancel order W0000001 (yes/no)?", [])[0].startswith("No")
    assert user.reply(f"Shall I cancel order {oid} (yes/no)?", [])[0] == YES


def test_user_ends_when_done_or_refused() -> None:
    user, _ = user_for("out_of_policy")
    assert user.reply("Unfortunately I cannot do that.", [])[1]
    assert user.reply("Hello?", []) == ("", True)
    user, _ = user_for("cancel_order")
    for _ in range(20):
        _, done = user.reply("Okay.", [])
        if done:
            break
    assert done


# robustness

_PARAMS: dict[str, list[str]] = {
    s["function"]["name"]: list(s["function"]["parameters"]["properties"])
    for s in ENV.reset(TASKS[0], 0).tools
}
_SAMPLES = [by_kind(k)[0] for k in sorted({t.kind for t in TASKS})]
_VALUE = st.one_of(
    st.text(max_size=12),
    st.integers(),
    st.none(),
    st.floats(allow_nan=True),
    st.lists(st.text(max_size=5), max_size=3),
)
_TEXT = st.one_of(
    st.text(max_size=80),
    st.sampled_from([
        "Could you share your email?", "Shall I cancel it (yes/no)?", "Which items?",
        "I'm sorry, but I cannot do that.", "What is the reason?", "Is that correct?",
    ]),
)  # fmt: skip


def plausible_calls(task: TaskSpec) -> list[tuple[str, dict[str, Any]]]:
    """Well-formed calls on the task's database, so random agents also reach the tool bodies."""
    db = generate(task.data["db_seed"])
    out: list[tuple[str, dict[str, Any]]] = [("list_products", {}), ("get_current_date", {})]
    for c in list(db.customers.values())[:5]:
        name_zip = {"first_name": c.first_name, "last_name": c.last_name, "zip": c.zip}
        out += [
            ("find_customer_by_email", {"email": c.email}),
            ("find_customer_by_name_zip", name_zip),
            ("list_customer_orders", {"customer_id": c.id}),
        ]
    address = {"street": "1 Elm Street", "city": "Boise", "state": "ID", "zip": "83702"}
    for o in list(db.orders.values())[:30]:
        item = o.items[0]
        variants = db.products[item.product_id].variants
        new = variants[len(o.items) % len(variants)].item_id
        returned = {"item_ids": [item.item_id], "payment_method_id": o.payment_method_id}
        writes: dict[str, tuple[str, dict[str, Any]]] = {
            "pending": (
                "exchange_pending_order_items",
                {"item_ids": [item.item_id], "new_item_ids": [new]},
            ),
            "processing": ("cancel_pending_order", {"reason": "ordered by mistake"}),
            "shipped": ("modify_pending_order_address", address),
            "delivered": ("return_delivered_order_items", returned),
            "cancelled": ("cancel_pending_order", {"reason": "no longer needed"}),
        }
        write = writes[o.status]
        out += [
            ("get_order_details", {"order_id": o.id}),
            ("get_product_details", {"product_id": item.product_id}),
            (write[0], {"order_id": o.id, **write[1]}),
            ("modify_pending_order_address", {"order_id": o.id, **address}),
            ("calculate", {"expression": f"{item.price} * 2 - 1 / ({len(o.items)} - 1)"}),
        ]
    return out


def agent_steps(task: TaskSpec) -> st.SearchStrategy[list[Message]]:
    call = st.one_of(
        st.sampled_from(plausible_calls(task)),
        st.sampled_from(sorted(_PARAMS)).flatmap(
            lambda n: st.tuples(st.just(n), st.fixed_dictionaries({p: _VALUE for p in _PARAMS[n]}))
        ),
        st.tuples(st.text(max_size=20), st.text(max_size=30)),
        st.tuples(st.sampled_from(sorted(_PARAMS)), st.dictionaries(st.text(max_size=8), _VALUE)),
    )
    step = st.one_of(
        st.lists(call, min_size=1, max_size=3).map(lambda cs: assistant(None, *cs)),
        _TEXT.map(assistant),
    )
    return st.lists(step, max_size=10)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_SAMPLES).flatmap(lambda t: st.tuples(st.just(t), agent_steps(t))))
def test_random_agents_never_raise(case: tuple[TaskSpec, list[Message]]) -> None:
    task, steps = case
    ep = ENV.reset(task, 0)
    for message in steps:
        result = ep.step(message)
        assert all(m.role in ("tool", "user") for m in result.messages)
        if result.done:
            break
    score = ep.score()
    assert 0.0 <= score.reward <= 1.0
    assert score.success == (score.reward == 1.0)
