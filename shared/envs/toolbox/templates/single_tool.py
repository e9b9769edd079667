"""single_tool tasks: everything the call needs is in the request; one call solves it."""

from __future__ import annotations

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder, spoken_date
from shared.envs.toolbox.clock import fmt_moment, spoken_clock
from shared.envs.toolbox.world import random_phone


def alarm(b: TaskBuilder) -> None:
    time = f"{b.rng.randint(5, 22):02d}:{b.rng.choice((0, 10, 15, 20, 30, 40, 45, 50)):02d}"
    label = b.rng.choice(vocab.TASK_ALARM_LABELS)
    said = b.rng.choice(spoken_clock(time)[:2])
    b.request = b.rng.choice(
        (
            f"Set an alarm for {said} labelled '{label}'.",
            f"Please add an alarm at {said} called '{label}'.",
            f"I need an alarm named '{label}' at {said}.",
        )
    )
    b.call("set_alarm", time=time, label=label)
    b.done(f"Done: your '{label}' alarm is set for {time}.")
    b.milestone("alarm_set", "alarm_created", time=time, label=label)


def toggle_setting(b: TaskBuilder) -> None:
    name = b.rng.choice(vocab.BOOL_SETTINGS)
    on = b.rng.random() < 0.5
    b.setting(name, not on)
    word = "on" if on else "off"
    phrase = vocab.SETTINGS[name]["phrase"]
    b.request = b.rng.choice((f"Turn {word} {phrase}.", f"Can you switch {phrase} {word}?"))
    b.call("set_setting", name=name, value=on)
    b.done(f"{phrase} is now {word}.")
    b.milestone(f"{name}_{word}", "setting_equals", name=name, value=on)
    b.allowed_settings.append(name)


def level_setting(b: TaskBuilder) -> None:
    name = b.rng.choice(vocab.LEVEL_SETTINGS)
    current, wanted = b.rng.sample(range(0, 101, 5), 2)
    b.setting(name, current)
    phrase = vocab.SETTINGS[name]["phrase"]
    b.request = b.rng.choice(
        (f"Set the {phrase} to {wanted}%.", f"Change my {phrase} to {wanted}.")
    )
    b.call("set_setting", name=name, value=wanted)
    b.done(f"Your {phrase} is now {wanted}%.")
    b.milestone(f"{name}_{wanted}", "setting_equals", name=name, value=wanted)
    b.allowed_settings.append(name)


def reminder(b: TaskBuilder) -> None:
    chore, keyword = b.rng.choice(vocab.TASK_CHORES)
    due = b.slot(b.rng.randint(1, 30))
    b.request = f"Remind me to {chore} on {spoken_date(due, year=True)} at {due:%H:%M}."
    b.call("add_reminder", text=chore, due=fmt_moment(due))
    b.done(f"I'll remind you to {chore} on {spoken_date(due)} at {due:%H:%M}.")
    b.milestone("reminder_added", "reminder_created", due=fmt_moment(due), contains=[keyword])


def new_contact(b: TaskBuilder) -> None:
    first, last = b.first_name(), b.rng.choice(vocab.LAST_NAMES)
    name, phone = f"{first} {last}", random_phone(b.rng)
    email = f"{first[0]}{last}@mail.example.org".lower()
    shown = f"{phone[:2]} {phone[2:5]} {phone[5:8]} {phone[8:]}"
    b.request = f"Save {name} as a new contact: phone {shown}, email {email}."
    b.call("add_contact", name=name, phone=phone, email=email)
    b.done(f"{name} is saved in your contacts.")
    b.milestone("contact_added", "contact_created", name=name, phone=phone, email=email)


def text_number(b: TaskBuilder) -> None:
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    phone = random_phone(b.rng)
    b.request = b.rng.choice((f"Text {phone} saying: {body}.", f"Send '{body}' to {phone}."))
    b.call("send_message", phone_number=phone, body=body)
    b.done(f"Sent to {phone}.")
    b.milestone("message_sent", "message_sent", phone=phone, contains=list(words))
    b.allowed_phones.append(phone)


def note(b: TaskBuilder) -> None:
    title, body = b.rng.choice(vocab.TASK_NOTE_TOPICS)
    title = f"{title} {b.rng.randint(2, 99)}"
    keyword = max(body.replace(",", " ").split(), key=len)
    b.request = f"Make a note titled '{title}' that says: {body}."
    b.call("create_note", title=title, body=body)
    b.done(f"Your note '{title}' is saved.")
    b.milestone("note_saved", "note_created", title=title, contains=[keyword])


def event(b: TaskBuilder) -> None:
    title = b.rng.choice(vocab.TASK_EVENT_TITLES)
    start = b.slot(b.rng.randint(1, 2))
    minutes = b.rng.choice((30, 45, 60, 90))
    b.request = (
        f"Put '{title}' on my calendar on {spoken_date(start, year=True)} at "
        f"{start:%H:%M} for {minutes} minutes."
    )
    b.call("create_event", title=title, start=fmt_moment(start), duration_minutes=minutes)
    b.done(f"'{title}' is on your calendar for {spoken_date(start)} at {start:%H:%M}.")
    b.milestone(
        "event_added",
        "event_created",
        title=title,
        start=fmt_moment(start),
        duration_minutes=minutes,
    )


TEMPLATES = (alarm, toggle_setting, level_setting, reminder, new_contact, text_number, note, event)
