"""contrast: stored trajectories are checked on read, and features describe behaviour exactly."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.contrast.deterministic import CATALOGUE, RuleLabeller
from services.contrast.features import extract, is_read_only, outcome
from services.contrast.trajectory import CallView, MalformedTrajectoryError, TrajectoryView
from shared.envs.helpdesk.tools import TRANSFER_TOOL, WRITE_TOOLS
from shared.envs.protocol import TaskSpec, ToolCall, ToolCallFunction
from shared.envs.reference import replay as replay_reference
from shared.envs.registry import get_environment
from shared.envs.tools import Tool, ToolBox, ToolError
from tests.support.planted_trajectories import Script

# -- reading stored trajectories -------------------------------------------------------------


def good() -> dict[str, Any]:
    return Script().call("get_item", {"id": 1}).say("Item 1 is blue.").stored("t1", True)


def test_a_stored_trajectory_becomes_a_typed_view() -> None:
    view = TrajectoryView.from_stored(**good())
    assert (view.id, view.task_id, view.task_kind, view.success, view.reward) == (
        "t1",
        "planted-t1",
        "planted",
        True,
        1.0,
    )
    assert [m.role for m in view.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert view.messages[2].tool_calls[0].name == "get_item"
    assert view.calls == (CallView("get_item", {"id": 1}, True, None),)


def test_uuid_ids_and_content_parts_are_accepted() -> None:
    stored = good()
    ident = uuid.uuid4()
    stored["id"] = ident
    stored["messages"][1]["content"] = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    view = TrajectoryView.from_stored(**stored)
    assert view.id == str(ident)
    assert view.messages[1].content == "a\nb"


def _set(path: list[Any], value: Any) -> dict[str, Any]:
    stored = good()
    target: Any = stored
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return stored


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (["success"], None, "success must be true or false"),
        (["reward"], 1.5, "reward must be in [0, 1]"),
        (["reward"], "1", "reward must be a number"),
        (["id"], "", "id must be a non-empty string"),
        (["task_kind"], 3, "task_kind must be a string"),
        (["messages"], [], "messages must be a non-empty list"),
        (["messages", 1], "hello", "messages[1] must be an object"),
        (["messages", 1, "role"], "robot", "messages[1].role must be one of"),
        (["messages", 2, "tool_calls", 0, "function", "arguments"], {"id": 1}, "arguments"),
        (["messages", 2, "tool_calls"], "get_item", "messages[2].tool_calls must be a list"),
        (["reward_breakdown"], [], "reward_breakdown must be an object"),
        (["reward_breakdown", "calls"], _DELETE, "reward_breakdown.calls must be a list"),
        (["reward_breakdown", "calls", 0, "ok"], "yes", "calls[0].ok must be true or false"),
        (["reward_breakdown", "calls", 0, "arguments"], [1], "calls[0].arguments must be"),
        (["reward_breakdown", "error"], 7, "reward_breakdown.error must be a string"),
        (["reward_breakdown", "opening"], 6, "reward_breakdown.opening must be a count"),
        (["reward_breakdown", "opening"], -1, "reward_breakdown.opening must be a count"),
        (["reward_breakdown", "opening"], True, "reward_breakdown.opening must be a count"),
    ],
)
def test_malformed_trajectories_raise_a_value_error_saying_where(
    path: list[Any], value: Any, says: str
) -> None:
    stored = _set(path, value)
    with pytest.raises(ValueError, match=r"^trajectory ") as caught:
        TrajectoryView.from_stored(**stored)
    assert isinstance(caught.value, MalformedTrajectoryError)
    assert says in str(caught.value)
    assert path[0] == "id" or str(caught.value).startswith("trajectory t1: ")


def test_tool_calls_on_a_user_message_are_malformed() -> None:
    stored = good()
    stored["messages"][1]["tool_calls"] = stored["messages"][2]["tool_calls"]
    with pytest.raises(ValueError, match=r"messages\[1\]: only assistant messages"):
        TrajectoryView.from_stored(**stored)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a stored trajectory."""
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    paths = [prefix] if prefix else []
    for key, child in items:
        paths += _paths(child, (*prefix, key))
    return paths


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(_paths(good())), value=_json)
def test_any_corruption_either_reads_or_raises_a_value_error(
    path: tuple[Any, ...], value: Any
) -> None:
    with contextlib.suppress(ValueError):
        TrajectoryView.from_stored(**_set(list(path), value))


# -- call outcomes and the read-only heuristic -----------------------------------------------


def test_outcomes_read_the_real_toolbox_error_texts() -> None:
    def set_item(id: int) -> str:
        if id < 0:
            raise ToolError("no such item")
        return "ok"

    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    box = ToolBox({"set_item": Tool("set_item", "Set an item.", schema, set_item)})
    for name, arguments in [
        ("set_item", '{"id": 1}'),
        ("nope", "{}"),
        ("set_item", "{oops"),
        ("set_item", "[1]"),
        ("set_item", '{"id": "x"}'),
        ("set_item", '{"id": -1}'),
    ]:
        box.call(ToolCall(id="c", function=ToolCallFunction(name=name, arguments=arguments)))
    views = [CallView(c.name, c.arguments, c.ok, c.error) for c in box.calls]
    assert [outcome(v) for v in views] == [
        "ok",
        "unknown_tool",
        "bad_json",
        "bad_json",
        "invalid_arguments",
        "tool_error",
    ]


def test_the_read_only_heuristic_matches_both_environments() -> None:
    from shared.envs.toolbox.tools import MUTATING

    for env_name, writes in (("toolbox", MUTATING), ("helpdesk", WRITE_TOOLS | {TRANSFER_TOOL})):
        env = get_environment(env_name)
        episode = env.reset(env.tasks()[0], 0)
        for schema in episode.tools:
            name = schema["function"]["name"]
            assert is_read_only(name) == (name not in writes), (env_name, name)


# -- features on hand-written trajectories ---------------------------------------------------


def test_a_clean_lookup_act_report_episode() -> None:
    view = (
        Script()
        .call("get_item", {"id": 1})
        .call("set_item", {"id": 1})
        .say("Done.")
        .view("a", True)
    )
    f = extract(view)
    assert (f.assistant_turns, f.attempted_calls, f.received_calls, f.well_formed_calls) == (
        3,
        2,
        2,
        2,
    )
    assert f.malformed_calls == f.unknown_tool_calls == f.invalid_argument_calls == 0
    assert f.tool_errors == f.recovered_failures == f.unrecovered_failures == 0
    assert f.side_effect_calls == 1
    assert f.question_before_side_effect is False
    assert f.read_only_before_side_effect is True
    assert f.reported_after_tools is True
    assert not f.ended_on_tool_call and not f.no_tool_calls


def test_errors_recovery_and_repeats_are_counted() -> None:
    view = (
        Script()
        .broken()
        .call("set_item", {"id": "x"}, "invalid")
        .call("set_item", {"id": "x"}, "invalid")
        .call("set_item", {}, "bad_json")
        .call("sett_item", {"id": 1}, "unknown")
        .call("get_item", {"id": 2}, "fail")
        .call("set_item", {"id": 1})
        .call("set_item", {"id": 1})
        .view("b", False)
    )
    f = extract(view)
    assert f.attempted_calls == 8 and f.received_calls == 7
    assert (f.unparsed_calls, f.bad_json_calls, f.malformed_calls) == (1, 1, 2)
    assert (f.unknown_tool_calls, f.invalid_argument_calls, f.tool_errors) == (1, 2, 1)
    assert f.well_formed_calls == 5  # ok x2, invalid x2, tool error
    # get_item's refusal was never followed by a success; set_item's schema rejections and
    # bad JSON are the argument skills' failures, not refusals to recover from
    assert (f.recovered_failures, f.unrecovered_failures) == (0, 1)
    assert f.repeated_rejected_calls == 1
    assert f.duplicate_side_effects == 1
    assert f.successful_calls == 2
    assert f.ended_on_tool_call is True
    assert f.reported_after_tools is False


def test_questions_and_lookups_count_only_before_the_first_side_effect() -> None:
    asked = Script().say("Which item?").user("1").call("set_item", {"id": 1}).say("Done?")
    f = extract(asked.view("c", True))
    assert f.question_before_side_effect is True
    assert f.read_only_before_side_effect is False
    late = Script().call("set_item", {"id": 1}).say("Anything else?").call("get_item", {"id": 1})
    f = extract(late.view("d", True))
    assert f.question_before_side_effect is False
    assert f.read_only_before_side_effect is False


def test_a_lookup_in_the_same_message_as_the_action_does_not_count() -> None:
    script = Script()
    script.messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": n, "arguments": "{}"}}
                for n in ("get_item", "set_item")
            ],
        }
    )
    assert extract(script.view("e", True)).read_only_before_side_effect is False


def test_a_broken_call_is_neither_a_question_nor_a_report() -> None:
    view = Script().call("get_item", {"id": 1}).broken('<tool_call>{"q": "?"').view("f", False)
    f = extract(view)
    assert f.reported_after_tools is False
    assert f.question_before_side_effect is None  # no side effect was attempted
    assert f.ended_on_tool_call is True


def test_chat_only_episode_has_no_tool_results_and_no_side_effects() -> None:
    f = extract(Script().say("I think it is blue?").view("g", False))
    assert f.no_tool_calls and f.reported_after_tools is None
    assert f.question_before_side_effect is None and f.read_only_before_side_effect is None
    labels = {
        c.name: RuleLabeller().label(c, Script().say("Hi.").view("g", False), 0) for c in CATALOGUE
    }
    assert labels["use_tools_when_needed"] == "LACKING"
    assert {n for n, label in labels.items() if label != "NA"} == {"use_tools_when_needed"}


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["get_item", "set_item", "send_note", "say", "ask", "broken"]),
            st.sampled_from(["ok", "invalid", "unknown", "bad_json", "fail"]),
            st.integers(0, 2),
        ),
        max_size=8,
    )
)
def test_feature_invariants_hold_on_any_episode(steps: list[tuple[str, Any, int]]) -> None:
    script = Script()
    for name, kind, arg in steps:
        if name == "say":
            script.say("Done.")
        elif name == "ask":
            script.say("Which one?").user("That one.")
        elif name == "broken":
            script.broken()
        else:
            script.call(name, {"id": arg}, kind)
    f = extract(script.view("h", False))
    assert f.received_calls == sum(n not in ("say", "ask", "broken") for n, _, _ in steps)
    assert f.attempted_calls == f.received_calls + f.unparsed_calls
    failed = f.received_calls - f.successful_calls
    assert failed == (
        f.bad_json_calls + f.unknown_tool_calls + f.invalid_argument_calls + f.tool_errors
    )
    assert f.recovered_failures + f.unrecovered_failures == f.tool_errors
    assert f.duplicate_side_effects <= f.successful_calls
    assert (f.question_before_side_effect is None) == (f.side_effect_calls == 0)
    assert extract(script.view("h", False)) == f


# -- features on reference solutions, replayed through the real environments -----------------


def replay(env_name: str, task: TaskSpec) -> TrajectoryView:
    """Play a task's reference solution the way the runner does and store it."""
    result = replay_reference(get_environment(env_name), task, int(task.data.get("seed", 0)))
    assert result is not None
    score = result.score
    assert score.success, (task.id, score.notes)
    return TrajectoryView.from_stored(
        id=f"ref-{task.id}",
        task_id=task.id,
        task_kind=task.kind,
        success=score.success,
        reward=score.reward,
        messages=result.messages,
        reward_breakdown={
            "checks": score.breakdown,
            "notes": score.notes,
            "calls": result.calls,
            "opening": result.opening,
        },
    )


def _toolbox_task(task_id: str) -> TaskSpec:
    return next(t for t in get_environment("toolbox").tasks() if t.id == task_id)


def test_reference_lookup_then_send_has_the_good_features() -> None:
    f = extract(replay("toolbox", _toolbox_task("multi_step-0000")))
    assert f.read_only_before_side_effect is True
    assert f.reported_after_tools is True
    assert f.well_formed_calls == f.successful_calls == 2
    assert f.malformed_calls == f.unknown_tool_calls == f.invalid_argument_calls == 0
    assert f.tool_errors == 0 and not f.ended_on_tool_call
    assert f.question_before_side_effect is False


def test_reference_retry_after_an_outage_is_a_recovery() -> None:
    f = extract(replay("toolbox", _toolbox_task("error_recovery-0000")))
    assert (f.tool_errors, f.recovered_failures, f.unrecovered_failures) == (1, 1, 0)
    assert f.duplicate_side_effects == 0 and f.reported_after_tools is True


def test_reference_clarification_asks_before_acting() -> None:
    f = extract(replay("toolbox", _toolbox_task("needs_clarification-0000")))
    assert f.question_before_side_effect is True


def test_no_reference_solution_is_labelled_lacking_on_the_error_capabilities() -> None:
    clean = {
        "well_formed_tool_calls",
        "valid_tool_arguments",
        "use_existing_tools",
        "avoid_repeating_rejected_calls",
        "report_result_to_user",
        "stop_after_completion",
    }
    capabilities = [c for c in CATALOGUE if c.name in clean]
    toolbox = get_environment("toolbox").tasks()
    helpdesk = get_environment("helpdesk").tasks()[::4]
    views = [replay("toolbox", t) for t in toolbox] + [replay("helpdesk", t) for t in helpdesk]
    for view in views:
        for capability in capabilities:
            label = RuleLabeller().label(capability, view, 0)
            assert label != "LACKING", (view.task_id, capability.name)


def test_a_refusal_the_agent_rightly_explains_still_counts_as_unrecovered() -> None:
    """A known limit of the target-agnostic rule: it cannot tell a transient outage (retry)
    from data that does not exist (explain). Successes carry such labels too, so the
    criterion's ER+ absorbs them instead of the rule guessing."""
    view = replay("toolbox", _toolbox_task("insufficient_information-0003"))
    f = extract(view)
    assert (f.tool_errors, f.unrecovered_failures, f.reported_after_tools) == (1, 1, True)
    recover = next(c for c in CATALOGUE if c.name == "recover_from_tool_errors")
    assert RuleLabeller().label(recover, view, 0) == "LACKING"


def test_a_worked_example_in_the_opening_is_not_the_agents() -> None:
    """An environment may open with an example exchange, tool call included (the codebook
    target of the promotion e2e test does): before `opening` was read, every trajectory
    counted that call as the agent's, and no trajectory ever lacked `use_tools_when_needed`."""
    script = Script().call("get_item", {"id": 0}).say("Item 0 is red.").user("And item 1?")
    script.calls.clear()  # the example's call never reached the episode's tools
    opening = len(script.messages)
    script.say("Item 1 is green, I think.")
    stored = script.stored("f", False)
    stored["reward_breakdown"]["opening"] = opening
    f = extract(TrajectoryView.from_stored(**stored))
    assert f.no_tool_calls and f.assistant_turns == 1 and f.reported_after_tools is None
    use_tools = next(c for c in CATALOGUE if c.name == "use_tools_when_needed")
    assert RuleLabeller().label(use_tools, TrajectoryView.from_stored(**stored), 0) == "LACKING"
    del stored["reward_breakdown"]["opening"]  # a row stored before the field: all the agent's
    assert not extract(TrajectoryView.from_stored(**stored)).no_tool_calls
