"""The default agent model, for real: the packaged Qwen2.5-Coder-0.5B-Instruct is verified and
converted, and behind `serve-model` it calls a tool on a synthetic task, in a form the parser
reads and records (the one thing SmolLM2 never did)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip("torch", reason="model tests need the train extra")

from services.contrast.judge import JudgeConfig, JudgeProposer
from services.contrast.labels import Capability
from shared.envs.mcptools.judge import Verdict, judged
from shared.envs.mcptools.spec import JudgeSpec
from shared.envs.runner import run_episode
from shared.envs.synthetic import SyntheticEnvironment, family_spec
from shared.envs.tools import CallRecord
from shared.llm.client import LLMClient
from shared.messages import Sampling
from shared.serving.packaged import QWEN_CODER
from shared.serving.server import ServeConfig, load
from tests.support.models import packaged_or_skip
from tests.support.planted_trajectories import planted
from tests.support.served import client_on

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]
ALIAS = "qwen2.5-coder-0.5b"


def test_the_packaged_weights_are_verified_and_converted() -> None:
    directory = packaged_or_skip(ALIAS)
    marker = json.loads((directory / "retrace-converted.json").read_text())
    assert marker["sha256"] == QWEN_CODER.sha256
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 24
    assert "tools" in (directory / "chat_template.jinja").read_text()  # its own template


@pytest.fixture(scope="module")
def served() -> Iterator[object]:
    packaged_or_skip(ALIAS)
    server, engine = load(ServeConfig(model=ALIAS, max_batch=4, threads=2))
    engine.start()
    yield server
    engine.stop()


@pytest.fixture
async def qwen(served: object) -> AsyncIterator[LLMClient]:
    async with client_on(served.app()) as client:  # type: ignore[attr-defined]
        yield client


async def test_qwen_calls_a_tool_on_a_synthetic_task(qwen: LLMClient) -> None:
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
    task = next(t for t in env.tasks() if t.split == "train")
    result = await run_episode(
        qwen,
        ALIAS,
        env,
        task,
        1,
        sampling=Sampling(temperature=0, max_tokens=96),
        max_turns=2,
    )
    assert result.error is None, result.error
    first = next(m for m in result.messages if m["role"] == "assistant")
    assert first.get("tool_calls"), first
    assert first["tool_calls"][0]["function"]["name"] == "set_alarm"
    assert first["tool_call_format"] in ("tagged", "fenced", "bare")
    assert result.calls and result.calls[0]["name"] == "set_alarm"


async def test_qwen_as_the_judge_names_capabilities_from_planted_trajectories(
    qwen: LLMClient,
) -> None:
    """The judge against the real counterpart of its fake, with the default model. Qwen
    writes JSON the judge reads (a stray closing brace is forgiven, made-up placeholder
    definitions are refused and asked again), so this asserts the one outcome that matters:
    validated capabilities, each a snake_case name with a definition in words."""
    cfg = JudgeConfig(
        model=ALIAS, max_tokens=256, max_attempts=3, max_prompt_chars=4000, examples_per_side=2
    )
    proposed = await JudgeProposer(qwen, cfg).propose(
        planted(failed=6, succeeded=6), max_candidates=3
    )
    assert 1 <= len(proposed) <= 3, proposed
    for capability in proposed:
        assert isinstance(capability, Capability)
        assert capability.name.replace("_", "").isalnum() and capability.name.islower()
        assert len(capability.definition.split()) >= 3, capability


async def test_qwen_as_the_judge_of_an_mcp_check(qwen: LLMClient) -> None:
    """The MCP `judge` check against the real counterpart of its fake: the default model
    behind serve-model gives a verdict the check reads (JSON asked for, validated)."""
    spec = JudgeSpec(model=ALIAS, url=qwen.base_url, max_tokens=96)
    verdict = await judged(
        spec,
        "The reply tells the user the wifi password.",
        "What's the wifi password? It's somewhere in my notes.",
        [CallRecord("read_note", {"note_id": 3}, True, None, '{"body": "wifi: cobalt-42"}')],
        "The wifi password is cobalt-42.",
    )
    assert isinstance(verdict, Verdict) and isinstance(verdict.passed, bool)
