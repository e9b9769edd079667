"""GRPO sampling through an inference endpoint, against the real `retrace serve-model` (on a
tiny random model, so it is fast): the endpoint is sent the policy's adapter after every step
and samples from exactly the policy's weights; a job's adapters rotate, a resumed job unloads
what a lost worker left, and closing leaves nothing behind; a run through the endpoint
spends its budget, learns, and a resumed one ends where an uninterrupted one does; an
endpoint that serves other weights than the trainer's is refused before any rollout.

The same client code talks to vLLM on a GPU (`/v1/completions` with `return_token_ids`,
`/v1/load_lora_adapter`); that pairing needs a GPU and is not exercised here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="training needs the train extra")

from services.train.grpo import GRPOSettings, Policy, Turn, lora_policy  # noqa: E402
from services.train.sampling import EndpointSampler  # noqa: E402
from services.train.trainer import Budget, Checkpoints, train  # noqa: E402
from shared.envs.protocol import Message  # noqa: E402
from shared.errors import ConfigError  # noqa: E402
from shared.llm.client import LLMClient  # noqa: E402
from shared.llm.openai_types import ChatRequest, CompletionRequest  # noqa: E402
from shared.serving.engine import Engine  # noqa: E402
from shared.serving.server import ServeConfig, load  # noqa: E402
from tests.support.length_env import LengthEnvironment  # noqa: E402
from tests.support.served import client_on  # noqa: E402
from tests.support.tiny_model import save_tiny_model, smollm2_tokenizer, tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN = GRPOSettings(group_size=4, max_new_tokens=8, max_turns=1, rank=4, alpha=8, learning_rate=1e-2)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(save_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[tuple[Any, Engine]]:
    # One sequence per batch: padding a batch moves logits by float noise, and the resume test
    # compares two runs' sampled tokens exactly. Batching is tested with the serve-model tests.
    server, engine = load(ServeConfig(model=str(tiny_model), max_batch=1, batch_window_ms=1))
    engine.start()
    yield server, engine
    engine.stop()


@pytest.fixture
async def llm(served: tuple[Any, Engine]) -> AsyncIterator[LLMClient]:
    server, _ = served
    async with client_on(server.app()) as client:
        yield client


def sampler_for(llm: LLMClient, directory: Path, prefix: str, policy: Policy) -> EndpointSampler:
    return EndpointSampler(llm, asyncio.get_running_loop(), directory, prefix, policy.end_id)


def perturbed(policy: Policy, seed: int) -> Policy:
    """As if training had moved the adapter (a fresh one is the identity: B = 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return policy


def greeting(policy: Policy) -> list[int]:
    """The prompt tokens of a one-line user turn, as the training loop renders them."""
    request = ChatRequest(model="policy", messages=[Message(role="user", content="Hi there.")])
    return policy.builder.build(request)[0]


def adapter_weights(policy: Policy) -> list[Any]:
    return [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n]


async def ours(llm: LLMClient, prefix: str) -> list[str]:
    return sorted(m for m in await llm.models() if m.startswith(prefix + "-"))


async def test_the_endpoint_samples_from_the_policy_s_current_weights(
    llm: LLMClient, tiny_model: Path, tmp_path: Path
) -> None:
    policy = lora_policy(str(tiny_model), RUN)
    sampler = sampler_for(llm, tmp_path / "live", "train-a", policy)
    await asyncio.to_thread(sampler.sync, policy, 0)
    assert sampler.drift is not None and sampler.drift < 1e-4  # the first sync checks it
    perturbed(policy, seed=1)  # a step
    await asyncio.to_thread(sampler.sync, policy, 1)
    assert await ours(llm, "train-a") == [f"train-a-{sampler.run}-s1"]
    assert [p.name for p in (tmp_path / "live" / sampler.run).iterdir()] == ["s1"]

    prompt = greeting(policy)
    [first] = await asyncio.to_thread(sampler.sample, [prompt], RUN, 5)
    [again] = await asyncio.to_thread(sampler.sample, [prompt], RUN, 5)
    [other] = await asyncio.to_thread(sampler.sample, [prompt], RUN, 6)
    assert first == again != other  # seeded, as local sampling is
    assert 0 < len(first) <= RUN.max_new_tokens + 1

    response = await llm.complete(
        CompletionRequest(
            model=f"train-a-{sampler.run}-s1",
            prompt=prompt,
            max_tokens=12,
            seed=7,
            logprobs=0,
            return_token_ids=True,
        )
    )
    choice = response.choices[0]
    assert choice.token_ids is not None and choice.logprobs is not None
    served_logp = torch.tensor(choice.logprobs.token_logprobs)
    with torch.no_grad():
        policy_logp = policy.completion_logprobs(Turn(prompt, choice.token_ids), 1.0)
        with policy.model.disable_adapter():
            base_logp = policy.completion_logprobs(Turn(prompt, choice.token_ids), 1.0)
    assert torch.allclose(policy_logp, served_logp, atol=1e-4)  # the endpoint has our weights
    assert not torch.allclose(base_logp, served_logp, atol=1e-2)  # and they matter
    await asyncio.to_thread(sampler.close)
    assert await ours(llm, "train-a") == [] and not (tmp_path / "live").exists()


async def test_an_endpoint_serving_other_weights_fails_the_first_sync(
    llm: LLMClient, tmp_path: Path
) -> None:
    other = tmp_path / "other-model"
    tokenizer = smollm2_tokenizer()
    model = tiny_llama(tokenizer)  # the served weights, but a sharper output layer:
    with torch.no_grad():  # random tiny models are near uniform, so mere noise differs little
        model.lm_head.weight.mul_(50)
    model.save_pretrained(other)
    tokenizer.save_pretrained(other)
    policy = lora_policy(str(other), RUN)  # same shape and vocabulary, different weights
    sampler = sampler_for(llm, tmp_path / "live", "train-d", policy)
    with pytest.raises(ConfigError, match="does not serve the weights being trained"):
        await asyncio.to_thread(sampler.sync, policy, 0)
    await asyncio.to_thread(sampler.close)
    assert await ours(llm, "train-d") == []


async def test_runs_of_one_job_never_touch_each_other_s_adapters(
    llm: LLMClient, tiny_model: Path, tmp_path: Path
) -> None:
    """A resumed job unloads what a lost worker left; a superseded run that finishes its
    step afterwards (and closes) leaves the new run's adapter alone; so does everyone else's."""
    policy = lora_policy(str(tiny_model), RUN)
    kept = tmp_path / "kept"
    policy.model.save_pretrained(kept)
    await llm.load_adapter("someone-else", str(kept))
    lost = sampler_for(llm, tmp_path / "live", "train-b", policy)
    await asyncio.to_thread(lost.sync, policy, 3)
    await asyncio.to_thread(lost.sync, policy, 4)  # then that worker is lost
    taker = sampler_for(llm, tmp_path / "live", "train-b", policy)
    await asyncio.to_thread(taker.sync, policy, 3)  # resumes from the step-3 checkpoint
    assert await ours(llm, "train-b") == [f"train-b-{taker.run}-s3"]
    assert [p.name for p in (tmp_path / "live").iterdir()] == [taker.run]
    await asyncio.to_thread(lost.close)  # the superseded run ends after all
    assert await ours(llm, "train-b") == [f"train-b-{taker.run}-s3"]
    await asyncio.to_thread(taker.close)
    assert await ours(llm, "train-b") == [] and not (tmp_path / "live").exists()
    assert "someone-else" in await llm.models()
    await llm.unload_adapter("someone-else")


async def test_an_endpoint_that_lost_the_adapter_is_sent_it_again(
    llm: LLMClient, tiny_model: Path, tmp_path: Path
) -> None:
    policy = lora_policy(str(tiny_model), RUN)
    sampler = sampler_for(llm, tmp_path / "live", "train-e", policy)
    await asyncio.to_thread(sampler.sync, policy, 0)
    prompt = greeting(policy)
    [before] = await asyncio.to_thread(sampler.sample, [prompt], RUN, 5)
    await llm.unload_adapter(f"train-e-{sampler.run}-s0")  # as if the endpoint restarted
    completions = await asyncio.to_thread(sampler.sample, [prompt, prompt], RUN, 5)
    assert completions[0] == before
    assert await ours(llm, "train-e") == [f"train-e-{sampler.run}-s0"]
    await asyncio.to_thread(sampler.close)


async def test_a_run_through_the_endpoint_learns_and_resumes_exactly(
    llm: LLMClient, served: tuple[Any, Engine], tiny_model: Path, tmp_path: Path
) -> None:
    _, engine = served

    def run(directory: Path, **kw: Any) -> tuple[Any, Policy]:
        policy = lora_policy(str(tiny_model), RUN)
        sampler = EndpointSampler(llm, loop, tmp_path / "live", "train-c", policy.end_id)
        try:
            progress = train(
                policy,
                LengthEnvironment(),
                RUN,
                Budget(rollouts=12),
                Checkpoints(directory),
                sampler=sampler,
                **kw,
            )
        finally:
            sampler.close()
        return progress, policy

    loop = asyncio.get_running_loop()
    before = lora_policy(str(tiny_model), RUN)
    generated = engine.stats.generated_tokens
    progress, straight = await asyncio.to_thread(run, tmp_path / "a")
    assert progress.step == 3 and progress.rollouts == 12
    assert engine.stats.generated_tokens - generated >= 12  # sampled by the endpoint
    assert any(c["groups_used"] for c in progress.curve)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(adapter_weights(before), adapter_weights(straight), strict=True)
    )
    assert await ours(llm, "train-c") == []

    steps: list[int] = []
    await asyncio.to_thread(
        run,
        tmp_path / "b",
        on_step=lambda p, _: steps.append(p.step),
        should_stop=lambda: len(steps) >= 1,
    )
    resumed_progress, resumed = await asyncio.to_thread(run, tmp_path / "b")
    assert steps == [1] and resumed_progress.resumes == [1]
    assert [c["mean_reward"] for c in resumed_progress.curve] == [
        c["mean_reward"] for c in progress.curve
    ]
    for a, b in zip(adapter_weights(straight), adapter_weights(resumed), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


async def test_token_prompts_reuse_their_cached_system_turn(
    llm: LLMClient, served: tuple[Any, Engine], tiny_model: Path
) -> None:
    """GRPO's token prompts open with the environment's system turn: the endpoint prefills it
    once and reuses it, and what it samples and scores is what it would without the cache."""
    from shared.serving.sampling import SamplingParams

    policy = lora_policy(str(tiny_model), RUN)
    system = Message(role="system", content="You run a phone's alarms and reminders. " * 12)
    prompts = [
        policy.builder.build(
            ChatRequest(model="policy", messages=[system, Message(role="user", content=text)])
        )[0]
        for text in ("Wake me at 7.", "Remind me to call mum tomorrow at noon.")
    ]
    _, engine = served
    before = engine.stats.prefix_hits
    replies = [
        (
            await llm.complete(
                CompletionRequest(
                    model=engine_name(served),
                    prompt=ids,
                    max_tokens=10,
                    temperature=0,
                    logprobs=0,
                    return_token_ids=True,
                )
            )
        ).choices[0]
        for ids in prompts
    ]
    assert engine.stats.prefix_hits >= before + 1  # the second prompt reused the first's turn
    for ids, reply in zip(prompts, replies, strict=True):
        await engine.run_on_engine(engine.kv.clear)
        [cold] = await engine.generate(
            ids, SamplingParams(temperature=0, max_tokens=10, logprobs=True)
        )
        assert reply.token_ids is not None and reply.logprobs is not None
        assert reply.token_ids[: len(cold.token_ids)] == cold.token_ids
        for warm, fresh in zip(reply.logprobs.token_logprobs, cold.logprobs, strict=False):
            assert abs(warm - fresh.logprob) < 1e-4


def engine_name(served: tuple[Any, Engine]) -> str:
    return str(served[0].served_name)
