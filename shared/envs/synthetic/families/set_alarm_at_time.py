"""set_alarm_at_time: set a labelled alarm, turning the user's spoken time into 24-hour HH:MM.

Serves `valid_tool_arguments`. With `invalid_format_rate`, the user says the time in a form
`set_alarm` rejects as-is ("7:30 pm", "7.30pm", "19h30"); otherwise in HH:MM. `distractors`
places other labelled alarms, which must survive.
"""

from __future__ import annotations

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab
from shared.envs.toolbox.clock import spoken_clock

MINUTES = (0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55)


def rejected_forms(time: str) -> list[str]:
    """Ways people say `time` that the tool's HH:MM parser refuses."""
    hours, minutes = (int(p) for p in time.split(":"))
    twelve, suffix = hours % 12 or 12, "am" if hours < 12 else "pm"
    forms = [f"{twelve}:{minutes:02d} {suffix}", f"{twelve}.{minutes:02d}{suffix}"]
    forms.append(f"{hours}h{minutes:02d}")
    if minutes == 0:
        forms.append(f"{twelve} {suffix}")
    return forms


def generate(s: Scenario) -> None:
    b = s.b
    labels = list(vocab.TASK_ALARM_LABELS)
    s.rng.shuffle(labels)
    label = labels.pop()
    time = f"{s.rng.randint(5, 22):02d}:{s.rng.choice(MINUTES):02d}"
    for other in labels[: s.knobs.distractors]:
        b.alarm(f"{s.rng.randint(5, 22):02d}:{s.rng.choice(MINUTES):02d}", other)
    odd = s.chance(s.knobs.invalid_format_rate)
    said = s.rng.choice(rejected_forms(time)) if odd else time
    b.request = s.rng.choice(
        (
            f"Set an alarm for {said} labelled '{label}'.",
            f"Please add an alarm at {said} called '{label}'.",
            f"I need an alarm named '{label}' at {said}.",
        )
    )
    s.act("set_alarm", time=time, label=label)
    b.say(f"Done: your '{label}' alarm is set for {time}.")
    s.expect("set_alarm", time=m.clock(time), label=m.eq(label))
    s.value("time", m.phrases(spoken_clock(time)))


FAMILY = Family(
    name="set_alarm_at_time",
    capability="valid_tool_arguments",
    action="set_alarm",
    needed=("set_alarm",),
    distractors=("list_alarms", "delete_alarm", "add_reminder", "create_event", "get_current_time"),
    expects={"set_alarm": ("label", "time")},
    values=("time",),
    reads=frozenset({"distractors", "invalid_format_rate"}),
    tunes=("invalid_format_rate", "distractor_tools", "distractors"),
    knobs=Knobs(distractors=2, distractor_tools=2, invalid_format_rate=0.75),
    checks=(
        CheckSpec(kind="called_tool", weight=0.4, tool="set_alarm", keys=["time", "label"]),
        CheckSpec(kind="no_invalid_arguments", weight=0.3),
        CheckSpec(kind="reply_mentions", weight=0.2, value="time"),
        CheckSpec(kind="no_forbidden_side_effect", weight=0.1),
    ),
    generate=generate,
)
