"""synthetic environments: tasks and split, reference and graded partial agents, the real
toolbox tools and schemas, seeded worlds, injected failures, and malformed calls."""

from __future__ import annotations

import collections
import json
import re
from typing import Any

import pytest

from shared.envs.protocol import Message, TaskSpec, ToolCall, ToolCallFunction
from shared.envs.synthetic import (
    SyntheticEnvironment,
    default_spec,
    family_spec,
    toolbox_schemas,
)
from shared.envs.synthetic.env import SyntheticEpisode
from shared.envs.synthetic.families import FAMILIES
from shared.envs.toolbox.env import SYSTEM_PROMPT, reference_messages

ENVS = {name: SyntheticEnvironment(family_spec(name, f"trains_{name}")) for name in FAMILIES}
NOTHING = Message(role="assistant", content="Sorry, I cannot help with that.")


def call(name: str, arguments: str | dict[str, Any], call_id: str = "c1") -> Message:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    function = ToolCallFunction(name=name, arguments=text)
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def play(family: str, task: TaskSpec, messages: list[Message], seed: int = 0) -> SyntheticEpisode:
    episode = ENVS[family].reset(task, seed)
    for message in messages:
        episode.step(message)
    return episode


def reward(family: str, task: TaskSpec, messages: list[Message], seed: int = 0) -> float:
    return play(family, task, messages, seed).score().reward


def pick(family: str, **where: Any) -> TaskSpec:
    """The first task of `family` whose data has these values (e.g. withheld=True)."""
    return next(t for t in ENVS[family].tasks() if all(t.data[k] == v for k, v in where.items()))


def sample(family: str, count: int = 6) -> list[TaskSpec]:
    tasks = ENVS[family].tasks()
    return tasks[:: len(tasks) // count][:count]


# -- the task set --------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tasks_have_stable_ids_an_80_20_split_and_differ(family: str) -> None:
    env = ENVS[family]
    tasks = env.tasks()
    assert len(tasks) == 200 and tasks == env.tasks()
    assert [t.id for t in tasks] == [f"{env.spec.name}-{i:04d}" for i in range(200)]
    assert collections.Counter(t.split for t in tasks) == {"train": 160, "test": 40}
    fresh = SyntheticEnvironment(env.spec).tasks()
    assert [(t.id, t.split, t.data) for t in fresh] == [(t.id, t.split, t.data) for t in tasks]
    opened = {json.dumps([t.data["request"], t.data["user_replies"]]) for t in tasks}
    worlds = {json.dumps(t.data["world"], sort_keys=True) for t in tasks}
    assert len(opened) >= 150 and len(worlds) == 200


def test_episode_seeds_change_the_world_around_the_task_and_repeat_exactly() -> None:
    task = ENVS["look_up_contact_then_message"].tasks()[3]
    one, again = (play("look_up_contact_then_message", task, [], seed=1) for _ in range(2))
    other = play("look_up_contact_then_message", task, [], seed=2)
    assert one.world.snapshot() == again.world.snapshot()
    assert one.world.snapshot()["contacts"] != other.world.snapshot()["contacts"]
    for row in task.data["world"]["contacts"]:  # the task's own people are always there
        assert one.world.contacts[row["id"]].phone == other.world.contacts[row["id"]].phone
    assert one.messages == other.messages and one.tools == other.tools


@pytest.mark.parametrize("family", list(FAMILIES))
def test_episodes_offer_the_toolbox_tools_with_its_exact_schemas(family: str) -> None:
    target = {s["function"]["name"]: s for s in toolbox_schemas()}
    spec = ENVS[family].spec
    sizes = set()
    for task in sample(family):
        episode = ENVS[family].reset(task, 0)
        assert episode.system_prompt == SYSTEM_PROMPT
        names = [s["function"]["name"] for s in episode.tools]
        assert names == task.data["tools"]
        assert set(spec.offered("needed")) <= set(names) <= set(spec.offered())
        assert all(schema == target[schema["function"]["name"]] for schema in episode.tools)
        sizes.add(len(names) - len(spec.offered("needed")))
    assert sizes == {spec.knobs.distractor_tools}


# -- grading -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_reference_scores_one_on_every_sampled_task_and_seed(family: str) -> None:
    for task in sample(family):
        for seed in (0, 7, 123):
            score = play(family, task, reference_messages(task), seed).score()
            assert score.reward == 1.0 and score.success, (task.id, seed, score.notes)
            assert sum(score.breakdown.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_doing_nothing_scores_zero_and_partial_work_earns_graded_rewards(family: str) -> None:
    levels: set[float] = set()
    for task in sample(family, 4):
        assert reward(family, task, [NOTHING]) == 0.0
        steps = reference_messages(task)
        for cut in range(len(steps) + 1):
            levels.add(reward(family, task, steps[:cut]))
    assert {0.0, 1.0} < levels and len(levels) >= 3, levels
    assert all(0.0 <= level <= 1.0 for level in levels)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_reply_that_claims_without_acting_earns_no_report_credit(family: str) -> None:
    """Qwen's text-only replies naming the fallback time earned `reply_mentions` in half the
    calibration episodes of an environment whose GRPO groups then scored 0 (trace_lift's
    second run): a report of nothing done is not a report."""
    claimed = 0
    for task in sample(family, 4):
        replies = [m for m in reference_messages(task) if m.content and not m.tool_calls]
        final = replies[-1]
        if "reply_mentions" not in play(family, task, reference_messages(task)).score().breakdown:
            continue
        alone = play(family, task, [final]).score()
        assert alone.breakdown["reply_mentions"] == 0.0, (task.id, final.content)
        claimed += 1
    if any(c.kind == "reply_mentions" for c in ENVS[family].spec.checks):
        assert claimed, "no sampled task exercised the check"


def test_set_alarm_grades_a_raw_time_a_wrong_time_and_a_missing_confirmation() -> None:
    family = "set_alarm_at_time"
    task = next(
        t for t in ENVS[family].tasks() if not t.data["faults"] and " pm" in t.data["request"]
    )
    label = task.data["expected"]["set_alarm"]["label"]["value"]
    time = task.data["expected"]["set_alarm"]["time"]["value"]
    said = re.search(r"\d{1,2}:\d\d pm", task.data["request"])
    assert said is not None
    morning = said.group(0).removesuffix(" pm")
    raw = call("set_alarm", {"time": said.group(0), "label": label})
    right = call("set_alarm", {"time": time, "label": label}, "c2")
    wrong = call("set_alarm", {"time": morning, "label": label})
    done = say(f"Your alarm is set for {time}.")
    assert reward(family, task, [right, done]) == 1.0
    assert reward(family, task, [right]) == pytest.approx(0.8)
    assert reward(family, task, [raw, right, done]) == pytest.approx(0.7)
    assert reward(family, task, [wrong, say(f"Set for {morning}.")]) == pytest.approx(0.4)
    assert reward(family, task, [raw, say("That time did not work, sorry.")]) == 0.0


def test_asking_is_graded_only_where_a_detail_was_withheld() -> None:
    family = "reminder_with_missing_detail"
    held, told = pick(family, withheld=True), pick(family, withheld=False)
    due = held.data["expected"]["add_reminder"]["due"]["value"]
    guess = call("add_reminder", {"text": "something", "due": due})
    episode = play(family, held, [guess, say("Done.")])
    assert episode.score().breakdown["asked_before_acting"] == 0.0
    question = say("Could you tell me the missing detail?")
    asked = play(family, held, [question])
    assert asked.transcript[-1].content == held.data["user_replies"][0]
    assert asked.score().reward == pytest.approx(0.4)
    needless = play(family, told, [question])
    assert needless.done and needless.score().reward == 0.0
    assert reward(family, told, reference_messages(told)) == 1.0


def test_recovering_by_deleting_the_event_in_the_way_is_forbidden() -> None:
    family = "recover_from_rejected_call"
    task = next(
        t
        for t in ENVS[family].tasks()
        if not t.data["faults"] and "delete_event" in t.data["tools"]
    )
    first = reference_messages(task)[0]
    episode = play(family, task, [first])
    rejection = json.loads(episode.transcript[-1].content or "")["error"]
    busy = re.search(r"id (event-\d+)", rejection)
    assert "conflicts with" in rejection and busy is not None
    assert first.tool_calls is not None
    episode.step(call("delete_event", {"event_id": busy.group(1)}, "c2"))
    episode.step(call("create_event", first.tool_calls[0].function.arguments, "c3"))
    score = episode.score()
    assert score.breakdown["no_forbidden_side_effect"] == 0.0
    assert score.breakdown["retried_after_error:create_event"] == 0.3
    assert score.reward == pytest.approx(0.3)


def test_an_injected_failure_hits_first_and_is_excused() -> None:
    family = "recover_from_rejected_call"
    task = next(t for t in ENVS[family].tasks() if t.data["faults"])
    fault = task.data["faults"][0]
    steps = reference_messages(task)
    episode = play(family, task, steps[:1])
    assert json.loads(episode.transcript[-1].content or "") == {"error": fault["error"]}
    assert play(family, task, steps).score().reward == 1.0
    gave_up = play(family, task, [*steps[:1], say("The calendar is down, sorry.")]).score()
    assert gave_up.breakdown["retried_after_error:create_event"] == 0.0
    assert gave_up.reward == 0.0


def test_looking_up_first_earns_part_and_guessing_a_number_earns_nothing() -> None:
    family = "look_up_contact_then_message"
    task = ENVS[family].tasks()[0]
    steps = reference_messages(task)
    assert reward(family, task, steps[:1]) == pytest.approx(0.3)
    assert steps[1].tool_calls is not None
    body = json.loads(steps[1].tool_calls[0].function.arguments)["body"]
    guessed = call("send_message", {"phone_number": "+15555550100", "body": body})
    assert reward(family, task, [guessed, say("Sent!")]) == 0.0


def test_repeating_a_rejected_call_and_acting_twice_are_graded_where_they_are_named() -> None:
    repeats = SyntheticEnvironment(default_spec("avoid_repeating_rejected_calls"))
    task = next(t for t in repeats.tasks() if not t.data["faults"])
    time = task.data["expected"]["set_alarm"]["time"]["value"]
    label = task.data["expected"]["set_alarm"]["label"]["value"]
    raw = call("set_alarm", {"time": "25:99", "label": label})
    right = call("set_alarm", {"time": time, "label": label})
    done = say(f"Set for {time}.")
    for messages, expected in (([raw, right, done], 1.0), ([raw, raw, right, done], 0.7)):
        episode = repeats.reset(task, 0)
        for message in messages:
            episode.step(message)
        assert episode.score().reward == pytest.approx(expected)

    stops = SyntheticEnvironment(default_spec("stop_after_completion"))
    task = next(t for t in stops.tasks() if not t.data["faults"])
    send, sent = reference_messages(task)
    for messages, expected in (([send, sent], 1.0), ([send, send, sent], 0.6), ([send], 0.4)):
        episode = stops.reset(task, 0)
        for message in messages:
            episode.step(message)
        assert episode.score().reward == pytest.approx(expected), messages


# -- robustness ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_malformed_calls_come_back_as_errors_and_cost_the_argument_check(family: str) -> None:
    task = ENVS[family].tasks()[1]
    offered = task.data["tools"]
    missing = next(
        s["function"]["name"] for s in toolbox_schemas() if s["function"]["name"] not in offered
    )
    needed = ENVS[family].spec.offered("needed")[-1]
    bad = [
        call(needed, "{not json"),
        call(needed, "[1, 2]"),
        call(needed, {"no_such_argument": 1}),
        call(missing, {}),
        call(needed, '{"a": ' * 5000),
    ]
    episode = ENVS[family].reset(task, 0)
    for message in bad:
        result = episode.step(message)
        assert not result.done
        assert [m.role for m in result.messages] == ["tool"]
        assert "error" in json.loads(result.messages[0].content or "")
    assert all(not record.ok for record in episode.calls)
    for message in reference_messages(task):
        episode.step(message)
    score = episode.score()
    assert 0.0 < score.reward <= 1.0
    if "no_invalid_arguments" in score.breakdown:  # the recovery family forgives bad tries
        assert score.breakdown["no_invalid_arguments"] == 0.0 and score.reward < 1.0
    assert episode.step(NOTHING).done
