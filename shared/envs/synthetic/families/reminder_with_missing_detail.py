"""reminder_with_missing_detail: a reminder request that may leave out when, or what.

Serves `ask_for_missing_information`. With `withhold_rate`, the request omits the due time or
the chore and the scripted user supplies it only when asked; the other tasks are complete, so
the agent must tell the two apart (asking needlessly ends the conversation). `distractors`
places other open reminders; `invalid_format_rate` says times on the 12-hour clock.
"""

from __future__ import annotations

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import spoken_date
from shared.envs.toolbox.clock import fmt_moment, spoken_clock


def generate(s: Scenario) -> None:
    b = s.b
    chores = list(vocab.TASK_CHORES)
    s.rng.shuffle(chores)
    chore, keyword = chores.pop()
    due = b.slot(s.rng.randint(1, 14))
    for other, _ in chores[: s.knobs.distractors]:
        b.reminder(other, b.slot(s.rng.randint(1, 14)))
    s.withheld = s.chance(s.knobs.withhold_rate)
    missing = s.rng.choice(("when", "what"))
    twelve = s.chance(s.knobs.invalid_format_rate)
    clock = f"{due:%H:%M}"
    said = f"{spoken_date(due, year=True)} at {spoken_clock(clock)[1] if twelve else clock}"
    if not s.withheld:
        b.request = f"Remind me to {chore} on {said}."
    elif missing == "when":
        b.request = s.rng.choice((f"Remind me to {chore}.", f"Set a reminder to {chore}."))
        b.ask("When should I remind you?", f"On {said}.")
    else:
        b.request = s.rng.choice((f"Set a reminder for {said}.", f"Remind me on {said}."))
        b.ask("What should I remind you about?", f"To {chore}.")
    s.act("add_reminder", text=chore, due=fmt_moment(due))
    b.say(f"I'll remind you to {chore} on {spoken_date(due)} at {clock}.")
    s.expect("add_reminder", text=m.has([keyword]), due=m.moment(fmt_moment(due)))
    s.value("due_time", m.phrases(spoken_clock(clock)))


FAMILY = Family(
    name="reminder_with_missing_detail",
    capability="ask_for_missing_information",
    action="add_reminder",
    needed=("add_reminder",),
    distractors=("list_reminders", "get_current_time", "set_alarm", "create_event", "create_note"),
    expects={"add_reminder": ("due", "text")},
    values=("due_time",),
    reads=frozenset({"distractors", "withhold_rate", "invalid_format_rate"}),
    tunes=("withhold_rate", "distractor_tools", "distractors"),
    knobs=Knobs(distractors=2, distractor_tools=2, withhold_rate=0.75),
    checks=(
        CheckSpec(kind="asked_before_acting", weight=0.4),
        CheckSpec(kind="called_tool", weight=0.3, tool="add_reminder", keys=["text", "due"]),
        CheckSpec(kind="reply_mentions", weight=0.2, value="due_time"),
        CheckSpec(kind="no_invalid_arguments", weight=0.1),
    ),
    generate=generate,
)
