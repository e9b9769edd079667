"""toolbox: task set and split, oracle and do-nothing agents, scoring, determinism, bad calls."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.envs.protocol import Message, TaskSpec, ToolCall, ToolCallFunction
from shared.envs.toolbox import ToolboxEnvironment, vocab
from shared.envs.toolbox.env import ToolboxEpisode, reference_messages
from shared.envs.toolbox.tasks import KINDS, split_of
from shared.envs.toolbox.tools import MUTATING
from shared.envs.toolbox.user import ScriptedUser

ENV = ToolboxEnvironment()
TASKS = ENV.tasks()
BY_ID = {t.id: t for t in TASKS}
NOTHING = Message(role="assistant", content="Sorry, I cannot help with that.")


def call(name: str, arguments: str | dict[str, Any], call_id: str = "c1") -> Message:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    function = ToolCallFunction(name=name, arguments=text)
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def first(template: str, kind: str | None = None) -> TaskSpec:
    return next(
        t for t in TASKS if t.data["template"] == template and (kind is None or t.kind == kind)
    )


def replay(task: TaskSpec, seed: int, extra: list[Message] | None = None) -> ToolboxEpisode:
    """Play the reference solution, inserting `extra` just before its final reply."""
    episode = ENV.reset(task, seed)
    messages = reference_messages(task)
    for message in [*messages[:-1], *(extra or []), messages[-1]]:
        episode.step(message)
    return episode


def assert_error(message: Message) -> str:
    assert message.role == "tool"
    body = json.loads(message.content or "")
    assert isinstance(body, dict) and "error" in body, body
    return str(body["error"])


# -- the task set ----------------------------------------------------------------------------


def test_at_least_300_tasks_with_unique_well_formed_ids_and_balanced_kinds() -> None:
    assert len(TASKS) >= 300
    assert len(BY_ID) == len(TASKS)
    for task in TASKS:
        assert re.fullmatch(rf"{task.kind}-\d{{4}}", task.id)
    counts = collections.Counter(t.kind for t in TASKS)
    assert set(counts) == set(KINDS) and len(KINDS) == 6
    assert max(counts.values()) - min(counts.values()) <= len(TASKS) // 20


def test_split_is_70_30_per_kind_and_comes_from_the_id() -> None:
    for kind in KINDS:
        tasks = [t for t in TASKS if t.kind == kind]
        train = sum(t.split == "train" for t in tasks) / len(tasks)
        assert 0.65 <= train <= 0.75, (kind, train)
    for task in TASKS:
        assert task.split == split_of(task.kind, int(task.id.rsplit("-", 1)[1]))
    assert ENV.tasks() == TASKS
    assert ToolboxEnvironment().tasks() == TASKS


def test_split_is_pinned() -> None:
    """Moving a task between train and test leaks evaluation data: this must never change."""
    test_ids = ",".join(t.id for t in TASKS if t.split == "test")
    assert hashlib.sha256(test_ids.encode()).hexdigest()[:16] == "4542375a49f11e43"
    assert [t.id for t in TASKS if t.split == "test"][:3] == [
        "single_tool-0000",
        "single_tool-0004",
        "single_tool-0006",
    ]


def test_tasks_are_identical_in_a_fresh_process_with_another_hash_seed() -> None:
    code = (
        "import json, msgspec; from shared.envs.toolbox import ToolboxEnvironment;"
        "print(msgspec.json.encode(ToolboxEnvironment().tasks()).decode())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, check=True
    )
    assert out.stdout.strip() == msgspec.json.encode(TASKS)


def test_requests_are_distinct_within_a_kind() -> None:
    for kind in KINDS:
        requests = [t.data["request"] for t in TASKS if t.kind == kind]
        assert len(set(requests)) == len(requests), kind


def test_task_data_is_complete_and_survives_a_json_round_trip() -> None:
    for task in TASKS:
        for key in ("seed", "request", "user_replies", "world", "milestones", "forbidden"):
            assert key in task.data, (task.id, key)
        assert task.data["reference"] and task.data["milestones"]
    stored = msgspec.json.decode(msgspec.json.encode(TASKS), type=list[TaskSpec])
    assert stored == TASKS
    task = BY_ID["multi_step-0003"]
    restored = msgspec.json.decode(msgspec.json.encode(task), type=TaskSpec)
    assert ENV.reset(restored, 5).world.snapshot() == ENV.reset(task, 5).world.snapshot()


def test_clarification_tasks_script_a_reply_and_the_others_do_not() -> None:
    for task in TASKS:
        assert bool(task.data["user_replies"]) == (task.kind == "needs_clarification"), task.id


def test_task_names_cannot_collide_with_background_names() -> None:
    assert not set(vocab.TASK_FIRST_NAMES) & set(vocab.BACKGROUND_FIRST_NAMES)
    assert not set(vocab.TASK_RELATIONS) & set(vocab.BACKGROUND_RELATIONS)
    assert not set(vocab.TASK_CITIES) & set(vocab.BACKGROUND_CITIES)
    every = [*vocab.TASK_FIRST_NAMES, *vocab.BACKGROUND_FIRST_NAMES, *vocab.LAST_NAMES]
    for name in vocab.TASK_FIRST_NAMES:
        assert [w for w in every if name.lower() in w.lower()] == [name]
    for pool in (vocab.TASK_EVENT_TITLES, vocab.TASK_ALARM_LABELS):
        for title in pool:
            assert [t for t in pool if title.lower() in t.lower()] == [title]


# -- oracle and do-nothing agents ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_every_reference_solution_scores_one(seed: int) -> None:
    for task in TASKS:
        episode = ENV.reset(task, seed)
        results = [episode.step(m) for m in reference_messages(task)]
        score = episode.score()
        assert score.reward == 1.0 and score.success, (task.id, score)
        assert results[-1].done and not any(r.done for r in results[:-1]), task.id
        assert sum(score.breakdown.values()) == pytest.approx(1.0)


@given(index=st.integers(0, len(TASKS) - 1), seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_reference_solutions_hold_for_any_episode_seed(index: int, seed: int) -> None:
    task = TASKS[index]
    episode = ENV.reset(task, seed)
    for message in reference_messages(task):
        episode.step(message)
    assert episode.score().success, task.id


def test_doing_nothing_scores_below_one_except_when_explaining_is_the_answer() -> None:
    for task in TASKS:
        episode = ENV.reset(task, 0)
        assert episode.step(NOTHING).done
        score = episode.score()
        if task.kind == "insufficient_information":
            assert score.reward == 1.0 and score.success, task.id
        else:
            assert score.reward < 1.0 and not score.success, task.id
            assert score.notes


def test_error_recovery_references_hit_exactly_one_error() -> None:
    for task in TASKS:
        if task.kind == "error_recovery":
            episode = replay(task, 3)
            assert [c.ok for c in episode.calls].count(False) == 1, task.id


# -- scoring ---------------------------------------------------------------------------------


def test_partial_credit_without_the_closing_reply() -> None:
    task = first("alarm", "single_tool")
    episode = ENV.reset(task, 0)
    episode.step(reference_messages(task)[0])
    score = episode.score()
    assert score.reward == pytest.approx(1.0 / 1.5)
    assert not score.success
    assert score.breakdown["confirmed_to_user"] == 0.0
    assert "missed: confirmed_to_user" in score.notes


def test_message_to_the_wrong_contact_zeroes_the_reward() -> None:
    task = first("which_contact")
    meant = next(m for m in task.data["milestones"] if m["check"] == "message_sent")["args"]
    other = next(c for c in task.data["world"]["contacts"] if c["phone"] != meant["phone"])
    wrong = call("send_message", {"phone_number": other["phone"], "body": meant["contains"][0]})
    score = replay(task, 0, [wrong]).score()
    assert score.reward == 0.0 and not score.success
    assert "forbidden: message_to_wrong_recipient" in score.notes
    assert sum(score.breakdown.values()) == pytest.approx(0.0)
    assert score.breakdown["forbidden:message_to_wrong_recipient"] < 0


def test_deleting_every_alarm_zeroes_the_reward() -> None:
    task = first("delete_alarm_by_label")
    episode = ENV.reset(task, 0)
    alarm_ids = list(episode.world.alarms)
    messages = reference_messages(task)
    for message in messages[:-1]:
        episode.step(message)
    for alarm_id in alarm_ids:
        episode.step(call("delete_alarm", {"alarm_id": alarm_id}))
    episode.step(messages[-1])
    score = episode.score()
    assert score.breakdown["alarm_removed"] > 0
    assert score.reward == 0.0 and "forbidden: deleted_other_alarm" in score.notes


def test_changing_an_unrelated_setting_zeroes_the_reward() -> None:
    task = first("toggle_setting")
    asked = json.loads(task.data["reference"][0]["tool_calls"][0]["function"]["arguments"])["name"]
    other = next(n for n in vocab.BOOL_SETTINGS if n != asked)
    episode = ENV.reset(task, 0)
    flip = call("set_setting", {"name": other, "value": not episode.world.settings[other]})
    assert replay(task, 0, [flip]).score().reward == 0.0


def test_any_side_effect_zeroes_an_impossible_request() -> None:
    task = first("unsupported_action")
    episode = ENV.reset(task, 0)
    episode.step(call("set_alarm", {"time": "07:00"}))
    episode.step(say("I can't do that, sorry."))
    assert episode.score().reward == 0.0


def test_a_failed_side_effect_is_not_a_side_effect() -> None:
    task = first("unknown_contact")
    episode = ENV.reset(task, 0)
    assert_error(
        episode.step(call("send_message", {"phone_number": "123", "body": "x"})).messages[0]
    )
    episode.step(say("Sorry, I can't find that contact."))
    assert episode.score().success


def test_acting_before_asking_loses_the_clarification_milestone() -> None:
    task = first("alarm_time")
    reply = task.data["user_replies"][0]
    time = reply.split(",")[0]
    label = json.loads(task.data["reference"][1]["tool_calls"][0]["function"]["arguments"])["label"]
    episode = ENV.reset(task, 0)
    episode.step(call("set_alarm", {"time": "06:00", "label": label}))
    assert episode.step(say("Which time did you want?")).messages[0].content == reply
    episode.step(call("set_alarm", {"time": time, "label": label}))
    episode.step(say("Done."))
    score = episode.score()
    assert score.breakdown["asked_for_missing_detail"] == 0.0
    assert score.breakdown["alarm_set"] > 0
    assert 0 < score.reward < 1


def test_report_accepts_other_spellings_of_the_value() -> None:
    task = first("event_time", "report_result")
    start = task.data["world"]["events"][0]["start"]
    hour, minute = int(start[11:13]), start[14:16]
    spoken = f"{hour % 12 or 12}:{minute} {'AM' if hour < 12 else 'PM'}"
    episode = ENV.reset(task, 0)
    episode.step(reference_messages(task)[0])
    episode.step(say(f"It starts at {spoken}."))
    assert episode.score().success
    wrong = ENV.reset(task, 0)
    wrong.step(say(f"It starts at 1{spoken}."))
    assert not wrong.score().success


# -- the scripted user -----------------------------------------------------------------------


def test_scripted_user_answers_questions_once_then_leaves() -> None:
    user = ScriptedUser(["At 7."])
    assert user.respond("All done.") is None
    assert user.respond("What time should it ring?") == "At 7."
    assert user.respond("Anything else?") is None
    assert ScriptedUser(["x"]).respond("Please let me know the time.") == "x"


def test_step_after_the_end_is_a_no_op() -> None:
    episode = ENV.reset(TASKS[0], 0)
    assert episode.step(NOTHING).done
    after = episode.step(call("list_alarms", {}))
    assert after.done and after.messages == []
    assert episode.calls == []


# -- determinism -----------------------------------------------------------------------------


def _actions(task: TaskSpec) -> list[Message]:
    return [
        call("search_contacts", {}),
        call("set_alarm", {"time": "06:40", "label": "x"}),
        call("add_contact", {"name": "New Person", "phone": "+15550001111"}),
        call("list_events", {}),
        *reference_messages(task),
    ]


def test_reset_and_steps_are_deterministic() -> None:
    for task in TASKS[::25]:
        a, b = ENV.reset(task, 11), ENV.reset(task, 11)
        assert (a.system_prompt, a.tools, a.messages) == (b.system_prompt, b.tools, b.messages)
        assert a.world.snapshot() == b.world.snapshot()
        for message in _actions(task):
            assert a.step(message) == b.step(message)
        assert a.world.snapshot() == b.world.snapshot()
        assert a.score() == b.score()


def test_different_seeds_give_different_worlds() -> None:
    for task in TASKS[::30]:
        worlds = [ENV.reset(task, seed).world.snapshot() for seed in range(4)]
        assert all(w["contacts"] != worlds[0]["contacts"] for w in worlds[1:]), task.id
        assert len({json.dumps(w, sort_keys=True) for w in worlds}) == 4


def test_episode_opens_with_prompt_tools_and_request() -> None:
    task = TASKS[0]
    episode = ENV.reset(task, 0)
    assert "tool" in episode.system_prompt.lower() and "ask" in episode.system_prompt.lower()
    assert episode.messages == [Message(role="user", content=task.data["request"])]
    assert ENV.name == "toolbox"


# -- tools and schemas -----------------------------------------------------------------------


def test_tool_schemas_are_valid_and_strict() -> None:
    tools = ENV.reset(TASKS[0], 0).tools
    assert 15 <= len(tools) <= 25
    names = [t["function"]["name"] for t in tools]
    assert len(set(names)) == len(names) and set(names) >= MUTATING
    for tool in tools:
        assert tool["type"] == "function" and tool["function"]["description"]
        schema = tool["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("set_alarm", "{not json", "not valid JSON"),
        ("set_alarm", "[1, 2]", "JSON object"),
        ("set_alarm", "[" * 100_000, "not valid JSON"),
        ("launch_rocket", "{}", "unknown tool"),
        ("set_alarm", {"time": 730}, "invalid arguments"),
        ("set_alarm", {}, "invalid arguments"),
        ("set_alarm", {"time": "07:30", "colour": "red"}, "invalid arguments"),
        ("set_alarm", {"time": "7.30pm"}, "HH:MM"),
        ("get_contact", {"contact_id": "contact-0"}, "no contact"),
        ("send_message", {"phone_number": "555-0134", "body": "hi"}, "international format"),
        ("add_reminder", {"text": "x", "due": "1990-01-01 09:00"}, "too far"),
        ("add_reminder", {"text": "x", "due": "tomorrow"}, "YYYY-MM-DD HH:MM"),
        ("set_setting", {"name": "brightness", "value": 300}, "between 0 and 100"),
        ("set_setting", {"name": "wifi", "value": "yes"}, "true or false"),
        (
            "convert_currency",
            {"amount": -5, "from_currency": "USD", "to_currency": "EUR"},
            "invalid",
        ),
        ("get_weather", {"city": "Atlantis"}, "no weather data"),
        ("delete_alarm", {"alarm_id": "alarm-1"}, "no alarm"),
    ],
)
def test_bad_calls_come_back_as_error_tool_messages(
    name: str, arguments: str | dict[str, Any], expected: str
) -> None:
    episode = ENV.reset(TASKS[0], 0)
    before = episode.world.snapshot()
    result = episode.step(call(name, arguments, "bad-1"))
    assert not result.done and len(result.messages) == 1
    assert result.messages[0].tool_call_id == "bad-1"
    assert expected in assert_error(result.messages[0])
    assert episode.world.snapshot() == before
    assert episode.calls[-1].ok is False and episode.calls[-1].error


def test_reminder_in_the_past_is_rejected_with_the_current_time() -> None:
    episode = ENV.reset(TASKS[0], 0)
    due = (episode.world.now - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")
    error = assert_error(episode.step(call("add_reminder", {"text": "a", "due": due})).messages[0])
    assert "in the past" in error and episode.world.now.strftime("%H:%M") in error


def test_injected_fault_fails_once_then_the_tool_works() -> None:
    task = first("flaky_alarm")
    episode = ENV.reset(task, 0)
    message = reference_messages(task)[0]
    assert assert_error(episode.step(message).messages[0]) in task.data["faults"][0]["error"]
    ok = episode.step(message).messages[0]
    assert "error" not in json.loads(ok.content or "")
    assert [c.ok for c in episode.calls] == [False, True]


def test_several_calls_in_one_message_each_get_an_answer() -> None:
    episode = ENV.reset(TASKS[0], 0)
    calls = [
        ToolCall(id="a", function=ToolCallFunction(name="list_alarms", arguments="{}")),
        ToolCall(id="b", function=ToolCallFunction(name="nope", arguments="{}")),
        ToolCall(id="c", function=ToolCallFunction(name="get_current_time", arguments="")),
    ]
    result = episode.step(Message(role="assistant", tool_calls=calls))
    assert [m.tool_call_id for m in result.messages] == ["a", "b", "c"]
    assert [c.ok for c in episode.calls] == [True, False, True]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_TOOLS = ENV.reset(TASKS[0], 0).tools
_NAMES = [t["function"]["name"] for t in _TOOLS]
_VALUES = _json | st.sampled_from(
    ["07:30", "2025-06-01 09:00", "2030-01-01 00:00", "USD", "JPY", "wifi", "volume", "contact-1",
     "+14155550134", "Lisbon", "", "25:99", "9999-12-31 23:59"]
)  # fmt: skip


_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in _TOOLS}
_STRINGS = _VALUES.filter(lambda v: isinstance(v, str)) | st.text(max_size=12)
_MOMENTS = ["2026-01-15 10:00", "2026-01-15T10:30", "2025-02-30 10:00", "2026-1-5 9:00"]
_PLAUSIBLE: dict[str, list[str]] = {
    "time": ["07:30", "7:05", "23:59", "24:00", "7.30pm"],
    "due": _MOMENTS,
    "start": _MOMENTS,
    "date": ["2026-01-15", "2025-13-01", "15/01/2026"],
    "phone": ["+14155550134", "+1 (415) 555-0134", "555-0134"],
    "phone_number": ["+14155550134", "+44 20 7946 0958", "555-0134"],
    "email": ["ana@example.com", "not-an-email"],
    "name": ["Ana Lopez", " "],
    "title": ["Standup", ""],
    "body": ["hello", " "],
    "text": ["buy milk", ""],
}


def _value(key: str, spec: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value of the property's declared type (enums and bounds respected)."""
    if "enum" in spec:
        return st.sampled_from(spec["enum"])
    if key in _PLAUSIBLE and spec.get("type") == "string":
        return st.sampled_from(_PLAUSIBLE[key])
    kind = spec["type"]
    if kind == "integer":
        return st.integers(spec.get("minimum"), spec.get("maximum"))
    if kind == "number":
        return st.floats(min_value=0.01, allow_infinity=True, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(st.sampled_from(["contact-1", "x"]) | st.text(max_size=5), unique=True)
    if kind == "string":
        return _STRINGS
    return st.booleans() | st.integers(-5, 200) | _STRINGS


@st.composite
def _schema_args(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """Arguments that pass the tool's schema, so the call reaches the tool's own checks."""
    schema = _SCHEMAS[name]
    args = {}
    for key, spec in schema["properties"].items():
        if key in schema["required"] or draw(st.booleans()):
            args[key] = draw(_value(key, spec))
    return args


@st.composite
def _tool_calls(draw: st.DrawFn) -> Message:
    name = draw(st.sampled_from([*_NAMES, "", "nope", "Set_Alarm"]))
    how = draw(st.sampled_from(["schema", "schema", "schema", "keys", "junk"]))
    if name in _SCHEMAS and how == "schema":
        text = json.dumps(draw(_schema_args(name)))
    elif name in _SCHEMAS and how == "keys":
        keys = list(_SCHEMAS[name]["properties"]) or ["x"]
        text = json.dumps(draw(st.dictionaries(st.sampled_from(keys), _VALUES, max_size=3)))
    else:
        text = draw(st.text(max_size=30) | _json.map(json.dumps))
    return call(name, text, draw(st.text(min_size=1, max_size=5)))


@given(
    index=st.integers(0, len(TASKS) - 1),
    seed=st.integers(0, 1000),
    messages=st.lists(_tool_calls() | st.text(max_size=30).map(say), min_size=1, max_size=6),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_tool_calls_never_raise(index: int, seed: int, messages: list[Message]) -> None:
    episode = ENV.reset(TASKS[index], seed)
    for message in messages:
        result = episode.step(message)
        if message.tool_calls:
            assert len(result.messages) == len(message.tool_calls) or result.done
            for reply in result.messages:
                assert reply.role == "tool" and isinstance(json.loads(reply.content or ""), object)
    score = episode.score()
    assert 0.0 <= score.reward <= 1.0
    assert sum(score.breakdown.values()) == pytest.approx(score.reward, abs=1e-6)
