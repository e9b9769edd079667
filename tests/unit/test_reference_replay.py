"""Reference demonstrations: every built-in task's reference replays to a success, recorded
as the runner records an episode; malformed references are refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.envs.protocol import TaskSpec
from shared.envs.reference import MalformedReferenceError, reference_of, replay
from shared.envs.registry import get_environment


@pytest.mark.parametrize("name", ["toolbox", "helpdesk"])
def test_every_reference_replays_to_a_success(name: str) -> None:
    env = get_environment(name)
    for task in env.tasks()[::7]:
        result = replay(env, task)
        assert result is not None
        assert result.score.success, (task.id, result.score.notes)
        assert result.messages[0]["role"] == "system"


def test_a_replay_records_the_calls_the_environment_received() -> None:
    env = get_environment("toolbox")
    task = next(t for t in env.tasks() if any(m.get("tool_calls") for m in t.data["reference"]))
    result = replay(env, task)
    assert result is not None
    called = [
        c["function"]["name"] for m in task.data["reference"] for c in m.get("tool_calls", [])
    ]
    assert [c["name"] for c in result.calls] == called
    assert all(c["ok"] for c in result.calls)


def test_a_task_without_a_reference_has_no_replay() -> None:
    env = get_environment("toolbox")
    task = env.tasks()[0]
    bare = TaskSpec(id=task.id, kind=task.kind, split=task.split, data={})
    assert reference_of(bare) is None
    assert replay(env, bare) is None


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        ([], "empty"),
        ([{"role": "user", "content": "hi"}], "entries [0]"),
        ([{"role": "assistant", "content": 3}], "malformed reference"),
        ("not a list", "malformed reference"),
    ],
)
def test_a_malformed_reference_is_refused_with_the_reason(reference: Any, says: str) -> None:
    task = TaskSpec(id="t-1", kind="k", split="train", data={"reference": reference})
    with pytest.raises(MalformedReferenceError, match="t-1") as caught:
        reference_of(task)
    assert says in str(caught.value)


@given(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
            optional={"content": st.one_of(st.none(), st.text(max_size=20))},
        ),
        max_size=5,
    )
)
def test_a_reference_is_accepted_only_as_assistant_messages(messages: list[dict[str, Any]]) -> None:
    task = TaskSpec(id="t", kind="k", split="train", data={"reference": messages})
    valid = bool(messages) and all(m["role"] == "assistant" for m in messages)
    if valid:
        assert reference_of(task) is not None
    else:
        with pytest.raises(MalformedReferenceError):
            reference_of(task)
