"""look_up_contact_then_message: text someone named by first name or relation; look them up.

Serves `look_up_before_acting`: the request gives no number, so the agent must search the
contacts before `send_message` (guessing a number texts a stranger, which is forbidden).
`distractors` adds contacts sharing the person's last name, each with another relation.
"""

from __future__ import annotations

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab


def generate(s: Scenario) -> None:
    b = s.b
    relations = list(vocab.TASK_RELATIONS)
    s.rng.shuffle(relations)
    relation = relations.pop()
    by_relation = s.chance(0.5)
    person = b.person(relation=relation)
    first, last = person["name"].split()
    others = [*relations, *vocab.BACKGROUND_RELATIONS]
    for index in range(s.knobs.distractors):
        other = b.person(relation=others[index % len(others)])
        other_first = other["name"].split()[0]
        other["name"] = f"{other_first} {last}"
        other["email"] = f"{other_first}.{last}@example.com".lower()
    body, words = s.rng.choice(vocab.MESSAGE_BODIES)
    if by_relation:
        b.request = s.rng.choice(
            (f"Message my {relation} saying: {body}.", f"Text my {relation}: {body}.")
        )
        b.call("search_contacts", relation=relation)
    else:
        b.request = s.rng.choice((f"Text {first} saying: {body}.", f"Send {first} a text: {body}."))
        b.call("search_contacts", query=first)
    s.act("send_message", phone_number=person["phone"], body=body)
    b.say(f'I texted {person["name"]}: "{body}".')
    s.expect("send_message", phone_number=m.phone(person["phone"]), body=m.has(words))
    s.value("recipient", m.phrases([person["name"], first]))
    b.allowed_phones.append(person["phone"])


FAMILY = Family(
    name="look_up_contact_then_message",
    capability="look_up_before_acting",
    action="send_message",
    needed=("search_contacts", "send_message"),
    distractors=("get_contact", "add_contact", "search_messages", "set_alarm"),
    expects={"send_message": ("body", "phone_number")},
    values=("recipient",),
    reads=frozenset({"distractors"}),
    tunes=("distractors", "distractor_tools"),
    knobs=Knobs(distractors=2, distractor_tools=2),
    checks=(
        CheckSpec(
            kind="looked_up_first", weight=0.3, tool="search_contacts", before="send_message"
        ),
        CheckSpec(
            kind="called_tool", weight=0.4, tool="send_message", keys=["phone_number", "body"]
        ),
        CheckSpec(kind="no_forbidden_side_effect", weight=0.2),
        CheckSpec(kind="reply_mentions", weight=0.1, value="recipient"),
    ),
    generate=generate,
)
