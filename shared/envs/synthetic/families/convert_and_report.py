"""convert_and_report: convert an amount and tell the user the result.

Serves `report_result_to_user`: the reply must carry the converted amount (the world's rates
are jittered per task, so it cannot be guessed). With `invalid_format_rate`, the user writes
the amount with thousands separators and names the currencies in words, which the tool's
number and ISO-code arguments do not accept as-is.
"""

from __future__ import annotations

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox import vocab
from shared.envs.toolbox.world import convert

AMOUNTS = (15, 40, 75, 120, 250, 480, 1250, 2600, 4800, 12500, 36000)


def generate(s: Scenario) -> None:
    b = s.b
    source, target = s.rng.sample(list(vocab.CURRENCIES), 2)
    rates = b.rates(source, target)
    odd = s.chance(s.knobs.invalid_format_rate)
    amount = s.rng.choice([a for a in AMOUNTS if a >= 1000] if odd else AMOUNTS)
    result = convert(rates, amount, source, target)
    if odd:
        source_said = f"{amount:,} {vocab.CURRENCIES[source][0]}"
        target_said = vocab.CURRENCIES[target][0]
    else:
        source_said, target_said = f"{amount} {source}", target
    b.request = s.rng.choice(
        (
            f"How much is {source_said} in {target_said}?",
            f"What do I get for {source_said} in {target_said} today?",
            f"Convert {source_said} to {target_said} and tell me the amount.",
        )
    )
    s.act("convert_currency", amount=amount, from_currency=source, to_currency=target)
    b.say(f"{amount:,} {source} is {result:,.2f} {target} at today's rate.")
    s.expect(
        "convert_currency",
        amount=m.number(amount, 0.001),
        from_currency=m.eq(source),
        to_currency=m.eq(target),
    )
    s.value("result", m.number(result, max(0.01, result * 0.001)))


FAMILY = Family(
    name="convert_and_report",
    capability="report_result_to_user",
    action="convert_currency",
    needed=("convert_currency",),
    distractors=("get_exchange_rate", "get_weather", "create_note", "search_notes"),
    expects={"convert_currency": ("amount", "from_currency", "to_currency")},
    values=("result",),
    reads=frozenset({"invalid_format_rate"}),
    tunes=("invalid_format_rate", "distractor_tools"),
    knobs=Knobs(distractors=0, distractor_tools=2, invalid_format_rate=0.5),
    checks=(
        CheckSpec(kind="reply_mentions", weight=0.5, value="result"),
        CheckSpec(
            kind="called_tool",
            weight=0.3,
            tool="convert_currency",
            keys=["amount", "from_currency", "to_currency"],
        ),
        CheckSpec(kind="no_invalid_arguments", weight=0.2),
    ),
    generate=generate,
)
