"""send_message_to_contact: text a number the user dictates, in the tool's international format.

Serves `valid_tool_arguments`. With `invalid_format_rate`, the user dictates a US number
without its country code ("(415) 555-0134", "415.555.0134"), which `send_message` rejects;
otherwise in a form it accepts. The person is a saved contact, and `distractors` adds saved
contacts sharing their first name; no one else may be texted.
"""

from __future__ import annotations

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab


def local_forms(phone: str) -> list[str]:
    """`+14155550134` without its country code, as people write it (the tool refuses these)."""
    area, exchange, line = phone[2:5], phone[5:8], phone[8:]
    return [f"({area}) {exchange}-{line}", f"{area}-{exchange}-{line}", f"{area}.{exchange}.{line}"]


def accepted_forms(phone: str) -> list[str]:
    area, exchange, line = phone[2:5], phone[5:8], phone[8:]
    return [phone, f"+1 {area} {exchange} {line}", f"+1 ({area}) {exchange}-{line}"]


def generate(s: Scenario) -> None:
    b = s.b
    person = b.person()
    first = person["name"].split()[0]
    for _ in range(s.knobs.distractors):
        b.person(first=first)
    body, words = s.rng.choice(vocab.MESSAGE_BODIES)
    phone = person["phone"]
    odd = s.chance(s.knobs.invalid_format_rate)
    said = s.rng.choice(local_forms(phone) if odd else accepted_forms(phone))
    where = " (a US number)" if odd else ""
    b.request = s.rng.choice(
        (
            f"Text {person['name']} at {said}{where} saying: {body}.",
            f"Send '{body}' to {person['name']}, {said}{where}.",
        )
    )
    s.act("send_message", phone_number=phone, body=body)
    b.say(f"Sent to {person['name']} at {phone}.")
    s.expect("send_message", phone_number=m.phone(phone), body=m.has(words))
    s.value("recipient", m.phrases([person["name"], first]))
    b.allowed_phones.append(phone)


FAMILY = Family(
    name="send_message_to_contact",
    capability="valid_tool_arguments",
    action="send_message",
    needed=("send_message",),
    distractors=("search_contacts", "get_contact", "add_contact", "search_messages"),
    expects={"send_message": ("body", "phone_number")},
    values=("recipient",),
    reads=frozenset({"distractors", "invalid_format_rate"}),
    tunes=("invalid_format_rate", "distractor_tools", "distractors"),
    knobs=Knobs(distractors=2, distractor_tools=2, invalid_format_rate=0.75),
    checks=(
        CheckSpec(
            kind="called_tool", weight=0.4, tool="send_message", keys=["phone_number", "body"]
        ),
        CheckSpec(kind="no_invalid_arguments", weight=0.3),
        CheckSpec(kind="reply_mentions", weight=0.2, value="recipient"),
        CheckSpec(kind="no_forbidden_side_effect", weight=0.1),
    ),
    generate=generate,
)
