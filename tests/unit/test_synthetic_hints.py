"""A synthetic task's deterministic hint names the forms of the needed tools' arguments and
their optional arguments (small models fill those with invented values), never the values."""

from __future__ import annotations

from shared.envs.synthetic import SyntheticEnvironment, family_spec


def hints(family: str) -> list[str]:
    env = SyntheticEnvironment(family_spec(family, f"hints_{family}"))
    return [env.reset(task, 0).hint for task in env.tasks()[:3]]


def test_optional_arguments_of_needed_tools_are_named_as_ones_to_leave_out() -> None:
    for hint in hints("recover_from_rejected_call"):
        assert "`create_event` takes `start` as: Date and time, YYYY-MM-DD HH:MM" in hint
        line = next(li for li in hint.splitlines() if "leave out optional" in li)
        assert "`create_event`: `attendees`, `location`" in line
        assert "`title`" not in line and "`start`" not in line  # required ones are not


def test_a_hint_never_carries_the_task_s_values() -> None:
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "hints_values"))
    for task in env.tasks()[:5]:
        hint = env.reset(task, 0).hint
        assert task.data["request"] not in hint
        assert "<tool_call>" in hint
