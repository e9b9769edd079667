"""multi_step tasks: look something up (a contact, an id, today's date), then act on it."""

from __future__ import annotations

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder
from shared.envs.toolbox.clock import clock_minus, fmt_date, fmt_moment


def text_by_name(b: TaskBuilder) -> None:
    person, _ = b.person(), b.person()
    first = person["name"].split()[0]
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = b.rng.choice((f"Text {first} saying: {body}.", f"Send {first} a text: {body}."))
    b.call("search_contacts", query=first)
    b.call("send_message", phone_number=person["phone"], body=body)
    b.done(f'I texted {person["name"]}: "{body}".')
    b.milestone("message_sent", "message_sent", phone=person["phone"], contains=list(words))
    b.allowed_phones.append(person["phone"])


def text_by_relation(b: TaskBuilder) -> None:
    relation, other = b.rng.sample(vocab.TASK_RELATIONS, 2)
    person = b.person(relation=relation)
    b.person(relation=other)
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = f"Message my {relation} saying: {body}."
    b.call("search_contacts", relation=relation)
    b.call("send_message", phone_number=person["phone"], body=body)
    b.done(f"I sent your {relation}, {person['name']}, the message.")
    b.milestone("message_sent", "message_sent", phone=person["phone"], contains=list(words))
    b.allowed_phones.append(person["phone"])


def delete_alarm_by_label(b: TaskBuilder) -> None:
    labels = b.rng.sample(vocab.TASK_ALARM_LABELS, b.rng.randint(2, 4))
    alarms = [
        b.alarm(f"{b.rng.randint(5, 21):02d}:{b.rng.choice((0, 30)):02d}", lb) for lb in labels
    ]
    target = alarms[0]
    b.request = b.rng.choice(
        (
            f"Delete my '{target['label']}' alarm.",
            f"I don't need the {target['label']} alarm anymore, remove it.",
        )
    )
    b.call("list_alarms")
    b.call("delete_alarm", alarm_id=target["id"])
    b.done(f"I deleted the '{target['label']}' alarm ({target['time']}).")
    b.milestone("alarm_removed", "alarm_deleted", alarm_id=target["id"])
    b.allowed_deletions.append(target["id"])


def alarm_before_first_event(b: TaskBuilder) -> None:
    first_title, second_title = b.rng.sample(vocab.TASK_EVENT_TITLES, 2)
    first = b.slot(1, earliest=7, latest=11)
    b.event(first_title, first, 60)
    b.event(second_title, b.slot(1, earliest=13, latest=19), 60)
    lead = b.rng.choice((10, 15, 20, 25, 30, 40, 45, 60, 75, 90))
    alarm_time = clock_minus(f"{first:%H:%M}", lead)
    thing = b.rng.choice(("event", "appointment"))
    b.request = f"Set an alarm {lead} minutes before my first {thing} tomorrow."
    b.call("get_current_time")
    b.call("list_events", date=fmt_date(first))
    b.call("set_alarm", time=alarm_time, label=first_title)
    b.done(
        f"Your first {thing} tomorrow is {first_title} at {first:%H:%M}, "
        f"so the alarm is set for {alarm_time}."
    )
    b.milestone("alarm_set", "alarm_created", time=alarm_time)


def complete_reminder(b: TaskBuilder) -> None:
    chores = b.rng.sample(vocab.TASK_CHORES, b.rng.randint(2, 3))
    rows = [b.reminder(chore, b.slot(b.rng.randint(1, 6))) for chore, _ in chores]
    target = rows[0]
    b.request = f"Mark my reminder to {target['text']} as done."
    b.call("list_reminders")
    b.call("complete_reminder", reminder_id=target["id"])
    b.done(f"Marked '{target['text']}' as done.")
    b.milestone("reminder_done", "reminder_completed", reminder_id=target["id"])
    b.allowed_completions.append(target["id"])


def invite_contact(b: TaskBuilder) -> None:
    person, _ = b.person(), b.person()
    first = person["name"].split()[0]
    title = b.rng.choice(vocab.TASK_EVENT_TITLES)
    start = b.slot(1)
    minutes = b.rng.choice((30, 45, 60))
    b.request = f"Schedule '{title}' with {first} tomorrow at {start:%H:%M} for {minutes} minutes."
    b.call("get_current_time")
    b.call("search_contacts", query=first)
    b.call(
        "create_event",
        title=title,
        start=fmt_moment(start),
        duration_minutes=minutes,
        attendees=[person["id"]],
    )
    b.done(f"'{title}' with {person['name']} is booked for tomorrow at {start:%H:%M}.")
    b.milestone(
        "event_with_contact",
        "event_created",
        title=title,
        start=fmt_moment(start),
        duration_minutes=minutes,
        attendees=[person["id"]],
    )


def update_email(b: TaskBuilder) -> None:
    person, _ = b.person(), b.person()
    first, last = person["name"].split()
    email = f"{first}.{last}.{b.rng.randint(10, 99)}@newmail.example.net".lower()
    b.request = f"{person['name']} has a new email address, {email}. Please update the contact."
    b.call("search_contacts", query=person["name"])
    b.call("update_contact", contact_id=person["id"], email=email)
    b.done(f"Updated {person['name']}'s email to {email}.")
    b.milestone(
        "email_updated", "contact_field", contact_id=person["id"], field="email", value=email
    )


def cancel_event(b: TaskBuilder) -> None:
    title, other = b.rng.sample(vocab.TASK_EVENT_TITLES, 2)
    target = b.event(title, b.slot(1, latest=12), 60)
    b.event(other, b.slot(1, earliest=14), 60)
    b.request = b.rng.choice(
        (f"Cancel my {title} tomorrow.", f"Please remove tomorrow's {title} from my calendar.")
    )
    b.call("get_current_time")
    b.call("list_events", date=target["start"][:10])
    b.call("delete_event", event_id=target["id"])
    b.done(f"I cancelled {title} ({target['start']}).")
    b.milestone("event_cancelled", "event_deleted", event_id=target["id"])
    b.allowed_deletions.append(target["id"])


TEMPLATES = (
    text_by_name,
    text_by_relation,
    delete_alarm_by_label,
    alarm_before_first_event,
    complete_reminder,
    invite_contact,
    update_email,
    cancel_event,
)
