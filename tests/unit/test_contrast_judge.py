"""contrast's LLM judge against a fake OpenAI-compatible endpoint: strict JSON, retries with
feedback, labels per run with their own seeds, bounded concurrency, compact transcripts, and
the criterion keeping a planted cause when the judge labels it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.contrast.criterion import CriterionConfig, evaluate
from services.contrast.judge import (
    JudgeConfig,
    JudgeLabeller,
    JudgeOutputError,
    JudgeProposer,
    criterion_runs,
)
from services.contrast.judge_prompts import compact, lines
from services.contrast.labels import Capability
from tests.support.fake_chat import FakeJudge, Serve, script, user_text
from tests.support.planted_trajectories import Script, planted

CAUSE = Capability(
    "valid_tool_arguments",
    "PRESENT: every tool call satisfied its schema. LACKING: a call was rejected as invalid "
    "arguments. NA: no tool call.",
)
NOISE = Capability(
    "ask_before_acting",
    "PRESENT: asked the user a question before acting. LACKING: acted without asking. "
    "NA: never acted.",
)

CONFIG = JudgeConfig(model="judge", max_attempts=2, max_prompt_chars=6000, seed=3)
DATA = planted(failed=6, succeeded=6, seed=1)


# -- proposer --------------------------------------------------------------------------------


async def test_proposer_parses_json_and_drops_duplicates_and_invalid_names(serve: Serve) -> None:
    reply = {
        "capabilities": [
            {"name": "valid_tool_arguments", "definition": "Schema-valid arguments."},
            {"name": "valid_tool_arguments", "definition": "A duplicate."},
            {"name": "Ask First", "definition": "Not snake_case."},
            {"name": "x" * 101, "definition": "Too long a name."},
            {"name": "no_definition", "definition": "  "},
            {"name": "report_result", "definition": "Tell the user what was done."},
            {"name": "third_one", "definition": "Over the limit of two."},
        ]
    }
    fake = FakeJudge(script("```json\n" + json.dumps(reply) + "\n```"))
    found = await JudgeProposer(await serve(fake), CONFIG).propose(DATA, max_candidates=2)
    assert [(c.name, c.definition) for c in found] == [
        ("valid_tool_arguments", "Schema-valid arguments."),
        ("report_result", "Tell the user what was done."),
    ]
    [body] = fake.requests
    assert body["response_format"]["type"] == "json_object" and body["model"] == "judge"
    prompt = user_text(body)
    assert len(prompt) <= CONFIG.max_prompt_chars and '{"capabilities": [' in prompt
    # A balanced sample: both sides shown, at most examples_per_side each.
    assert prompt.count("### FAILED episode") == 4 and prompt.count("### SUCCESSFUL episode") == 4


async def test_proposer_sample_is_seeded_and_prompt_bounded(serve: Serve) -> None:
    fake = FakeJudge(script('{"capabilities": []}'))
    client = await serve(fake)
    small = JudgeConfig(model="judge", max_prompt_chars=3000, seed=3)
    for cfg in (CONFIG, CONFIG, small):
        assert await JudgeProposer(client, cfg).propose(planted(seed=2)) == []
    first, again, bounded = (user_text(b) for b in fake.requests)
    assert first == again and len(bounded) <= 3000 and "### FAILED episode 1" in bounded
    # Nothing failed: nothing to explain, no call.
    assert await JudgeProposer(client, CONFIG).propose([t for t in DATA if t.success]) == []
    assert len(fake.requests) == 3


async def test_proposer_retries_malformed_output_with_the_error_fed_back(serve: Serve) -> None:
    good = '{"capabilities": [{"name": "recover_from_errors", "definition": "Fix and retry."}]}'
    fake = FakeJudge(script("Sure! Here are some capabilities.", good))
    found = await JudgeProposer(await serve(fake), CONFIG).propose(DATA)
    assert [c.name for c in found] == ["recover_from_errors"]
    assert len(fake.requests) == 2
    retry = fake.requests[1]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[1] == fake.requests[0]["messages"][1]
    assert retry[2]["content"] == "Sure! Here are some capabilities."
    assert "not valid JSON" in retry[3]["content"]


async def test_proposer_gives_up_after_max_attempts_saying_why(serve: Serve) -> None:
    bad_name = '{"capabilities": [{"name": "Bad Name", "definition": "x"}]}'
    fake = FakeJudge(script('{"caps": []}', bad_name))
    with pytest.raises(JudgeOutputError) as info:
        await JudgeProposer(await serve(fake), CONFIG).propose(DATA)
    message = str(info.value)
    assert len(fake.requests) == CONFIG.max_attempts == 2
    assert "no valid capabilities in 2 attempts" in message
    assert "attempt 1: wrong JSON shape" in message and "capabilities" in message
    assert "attempt 2: no valid capability" in message and "'Bad Name'" in message


# -- labeller --------------------------------------------------------------------------------


def by_seed(body: dict[str, Any]) -> str:
    """LACKING on odd seeds, PRESENT on even ones, for every capability asked about."""
    label = "LACKING" if body["seed"] % 2 else "PRESENT"
    return json.dumps({"labels": {CAUSE.name: label, NOISE.name: label}})


async def test_labeller_labels_every_trajectory_per_run_with_its_own_seed(serve: Serve) -> None:
    fake = FakeJudge(by_seed)
    labeller = JudgeLabeller(await serve(fake), CONFIG)
    data = DATA[:3]
    found = await labeller.prelabel([CAUSE, NOISE], data + data[:1], runs=[0, 1, 4])
    assert len(fake.requests) == 3 * 3  # distinct trajectories x runs
    assert len(found) == 2 * 3 * 3
    seeds = {b["seed"] for b in fake.requests}
    assert seeds == {CONFIG.seed + r for r in (0, 1, 4)}
    assert all(b["temperature"] > 0 for b in fake.requests)
    for t in data:  # seed 3 + run: run 0 odd, run 1 even, run 4 odd
        assert [labeller.label(CAUSE, t, r) for r in (0, 1, 4)] == ["LACKING", "PRESENT", "LACKING"]
    prompt = user_text(fake.requests[0])
    assert len(prompt) <= CONFIG.max_prompt_chars and CAUSE.definition in prompt
    with pytest.raises(KeyError, match="run 2: await prelabel"):
        labeller.label(CAUSE, data[0], 2)


async def test_labeller_retries_incomplete_or_invalid_labels(serve: Serve) -> None:
    missing = json.dumps({"labels": {CAUSE.name: "LACKING"}})
    invalid = json.dumps({"labels": {CAUSE.name: "LACKING", NOISE.name: "MAYBE"}})
    good = json.dumps({"labels": {CAUSE.name: "LACKING", NOISE.name: "NA"}})
    fake = FakeJudge(script(missing, invalid, good))
    cfg = JudgeConfig(model="judge", max_attempts=3)
    labeller = JudgeLabeller(await serve(fake), cfg)
    await labeller.prelabel([CAUSE, NOISE], DATA[:1], runs=[0])
    assert labeller.label(NOISE, DATA[0], 0) == "NA"
    feedback = [b["messages"][-1]["content"] for b in fake.requests[1:]]
    assert "missing labels for ['ask_before_acting']" in feedback[0]
    assert "wrong JSON shape" in feedback[1] and "'MAYBE'" in feedback[1]


async def test_labeller_gives_up_on_unknown_capabilities(serve: Serve) -> None:
    extra = {CAUSE.name: "PRESENT", NOISE.name: "NA", "made_up": "LACKING"}
    fake = FakeJudge(script(json.dumps({"labels": extra})))
    labeller = JudgeLabeller(await serve(fake), CONFIG)
    with pytest.raises(JudgeOutputError, match=r"unknown capabilities \['made_up'\]"):
        await labeller.prelabel([CAUSE, NOISE], DATA[:1], runs=[0])
    assert len(fake.requests) == CONFIG.max_attempts and labeller.labels == {}


async def test_labeller_respects_its_concurrency_bound(serve: Serve) -> None:
    fake = FakeJudge(by_seed, delay=0.02)
    cfg = JudgeConfig(model="judge", concurrency=2)
    await JudgeLabeller(await serve(fake), cfg).prelabel([CAUSE, NOISE], DATA[:4], runs=[0, 1])
    assert len(fake.requests) == 8 and fake.max_active == 2


async def test_labeller_refuses_a_budget_too_small_for_its_definitions(serve: Serve) -> None:
    fake = FakeJudge(by_seed)
    wordy = [Capability(f"skill_{i}", "a long definition " * 17) for i in range(10)]
    cfg = JudgeConfig(model="judge", max_prompt_chars=2000)
    with pytest.raises(ValueError, match="label fewer capabilities"):
        await JudgeLabeller(await serve(fake), cfg).prelabel(wordy, DATA, runs=[0])
    assert fake.requests == []


# -- end to end through the criterion --------------------------------------------------------


def planted_judge(body: dict[str, Any]) -> str:
    """Labels the planted cause from the transcript, as a competent judge would."""
    transcript = user_text(body).split("<transcript>")[1]
    invalid = "ERROR invalid arguments" in transcript
    asked = "Which item do you mean?" in transcript
    labels = {
        CAUSE.name: "LACKING" if invalid else "PRESENT",
        NOISE.name: "PRESENT" if asked else "LACKING",
    }
    return json.dumps({"labels": labels})


async def test_criterion_keeps_the_planted_cause_with_a_judge(serve: Serve) -> None:
    data = planted(failed=20, succeeded=20, seed=4)
    cfg = CriterionConfig(runs=5, min_runs=4, seed=4)
    fake = FakeJudge(planted_judge)
    labeller = JudgeLabeller(await serve(fake), JudgeConfig(model="judge", concurrency=8))
    await labeller.prelabel([CAUSE, NOISE], data, criterion_runs(cfg))
    assert len(fake.requests) == len(data) * (cfg.runs + 1)
    stats = {s.name: s for s in evaluate([CAUSE, NOISE], data, labeller, cfg)}
    cause, noise = stats[CAUSE.name], stats[NOISE.name]
    assert cause.kept and cause.runs_passed == cfg.runs
    assert len(cause.failures_covered) == 16  # 0.8 of 20 failures
    assert not noise.kept


# -- compact ---------------------------------------------------------------------------------


def test_compact_shows_calls_results_and_errors_in_full_when_they_fit() -> None:
    t = (
        Script("Set item 1.")
        .call("get_item", {"id": 1})
        .call("set_item", {"id": "x"}, "invalid")
        .broken()
        .say("Done.")
        .view("t", False)
    )
    text = compact(t, 10_000)
    assert text == "\n".join(lines(t))
    assert 'get_item({"id": 1})' in text and 'tool get_item: {"result": "ok"}' in text
    assert "tool set_item: ERROR invalid arguments" in text
    assert "ERROR unparsable call" in text and text.endswith("assistant: Done.")
    assert "success" not in text.lower() and "reward" not in text.lower()


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("say"), st.text(max_size=400)),
        st.tuples(st.just("user"), st.text(max_size=400)),
        st.tuples(st.just("call"), st.sampled_from(["ok", "invalid", "unknown", "fail"])),
        st.tuples(st.just("broken"), st.text(min_size=1, max_size=300)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, max_chars=st.integers(min_value=1, max_value=3000))
def test_compact_respects_its_budget_and_keeps_both_ends(
    steps: list[tuple[str, str]], max_chars: int
) -> None:
    s = Script("Please do the thing.")
    for kind, arg in steps:
        if kind == "say":
            s.say(arg)
        elif kind == "user":
            s.user(arg)
        elif kind == "call":
            s.call("set_item", {"id": 1, "note": "n" * 300}, arg)  # type: ignore[arg-type]
        else:
            s.broken(arg)
    t = s.view("t", False)
    rendered = lines(t)
    text = compact(t, max_chars)
    assert len(text) <= max_chars
    if len("\n".join(rendered)) <= max_chars:
        assert text == "\n".join(rendered)
    if max_chars >= 40:
        assert text.startswith(rendered[0][:8]) and text.endswith(rendered[-1][-8:])


@pytest.mark.parametrize("definition", ["...", "", "N/A", "x" * 300, "1. 2. 3."])
def test_a_capability_needs_a_definition_in_words(definition: str) -> None:
    # Qwen2.5-Coder-0.5B as the judge proposed `system`, `user` and `tool`, each defined "..."
    with pytest.raises(ValueError, match="definition in words"):
        Capability("system", definition)
    assert Capability("system", "Calls the tool the request names").definition
