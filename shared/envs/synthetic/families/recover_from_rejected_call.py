"""recover_from_rejected_call: book an event whose first-choice slot is taken; read the error.

Serves `recover_from_tool_errors`. `create_event` always rejects the first-choice slot (an
event already sits there) and the request names a fallback; `transient_failure_rate` and
`failure_repeats` add outages before that. Deleting the event in the way is forbidden.
`distractors` adds other events the same day, clear of both slots.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import spoken_date
from shared.envs.toolbox.clock import fmt_moment, spoken_clock

CONFLICT = "conflicts with"
"""How `create_event` starts its rejection of a taken slot."""


def _free_slots(
    day: datetime, taken: list[tuple[datetime, datetime]], minutes: int
) -> list[datetime]:
    """Quarter-hour starts between 07:00 and 22:00 on `day` whose `minutes` stay 15 minutes
    clear of everything in `taken`."""
    gap, length = timedelta(minutes=15), timedelta(minutes=minutes)
    morning = day.replace(hour=7, minute=0)
    starts = [morning + timedelta(minutes=15 * i) for i in range(15 * 4)]
    return [
        start
        for start in starts
        if all(start + length + gap <= begin or end + gap <= start for begin, end in taken)
    ]


def generate(s: Scenario) -> None:
    b = s.b
    titles = list(vocab.TASK_EVENT_TITLES)
    s.rng.shuffle(titles)
    title, busy = titles.pop(), titles.pop()
    start = b.slot(s.rng.randint(1, 3), earliest=9, latest=14)
    minutes = s.rng.choice((30, 45, 60))
    busy_start = start - timedelta(minutes=s.rng.choice((0, 15, 30)))
    b.event(busy, busy_start, 60)
    backup = start + timedelta(hours=s.rng.randint(2, 4))
    taken = [
        (busy_start, busy_start + timedelta(minutes=60)),
        (start, start + timedelta(minutes=minutes)),
        (backup, backup + timedelta(minutes=minutes)),
    ]
    for other in titles[: s.knobs.distractors]:
        slot = s.rng.choice(_free_slots(start, taken, 30))
        b.event(other, slot, 30)
        taken.append((slot, slot + timedelta(minutes=30)))
    b.request = (
        f"Book '{title}' on {spoken_date(start, year=True)} at {start:%H:%M} for {minutes} "
        f"minutes. If that time is taken, make it {backup:%H:%M} instead."
    )
    s.act("create_event", title=title, start=fmt_moment(start), duration_minutes=minutes)
    b.call("create_event", title=title, start=fmt_moment(backup), duration_minutes=minutes)
    b.say(f"{start:%H:%M} clashed with '{busy}', so I booked '{title}' at {backup:%H:%M}.")
    s.expect(
        "create_event",
        title=m.has([title]),
        start=m.moment(fmt_moment(backup)),
        duration_minutes=m.number(minutes),
    )
    s.value("booked_time", m.phrases(spoken_clock(f"{backup:%H:%M}")))
    s.excused.append(CONFLICT)


FAMILY = Family(
    name="recover_from_rejected_call",
    capability="recover_from_tool_errors",
    action="create_event",
    needed=("create_event",),
    distractors=("list_events", "delete_event", "get_current_time", "add_reminder"),
    expects={"create_event": ("duration_minutes", "start", "title")},
    values=("booked_time",),
    reads=frozenset({"distractors"}),
    tunes=("transient_failure_rate", "failure_repeats", "distractor_tools", "distractors"),
    knobs=Knobs(distractors=2, distractor_tools=2, transient_failure_rate=0.5),
    checks=(
        CheckSpec(kind="retried_after_error", weight=0.3, tool="create_event"),
        CheckSpec(
            kind="called_tool",
            weight=0.3,
            tool="create_event",
            keys=["title", "start", "duration_minutes"],
        ),
        CheckSpec(kind="no_forbidden_side_effect", weight=0.2),
        CheckSpec(kind="reply_mentions", weight=0.2, value="booked_time"),
    ),
    generate=generate,
)
