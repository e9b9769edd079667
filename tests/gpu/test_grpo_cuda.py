"""GRPO on a CUDA device with the default agent model: the code the train worker runs with
`RETRACE_TRAIN_DEVICE=cuda` (bf16 base, fp32 adapter) is the CPU's code, and gives the CPU's
numbers. Never in CI (no GPU there); run where torch sees one:

    pytest -m gpu tests/gpu
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need the train extra")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    Policy,
    Rollout,
    lora_policy,
    optimizer_for,
    policy_step,
    rollout_group,
)
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from tests.support.models import packaged_or_skip  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.model, pytest.mark.timeout(900)]

MODEL = "qwen2.5-coder-0.5b"
SETTINGS = GRPOSettings(
    group_size=8, max_new_tokens=96, max_turns=3, learning_rate=2e-4, hint_share=0.5
)


def _group_with_variance(policy: Policy) -> list[Rollout]:
    """The first train task (of a few) whose group's rewards differ: a step then has to move
    the adapter."""
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
    tasks = [t for t in env.tasks() if t.split == "train"][:4]
    rewards = []
    for index, task in enumerate(tasks):
        group = rollout_group(policy, env, task, list(range(8)), SETTINGS, sample_seed=index)
        rewards.append([r.reward for r in group])
        if len({r.reward for r in group}) > 1:
            return group
    pytest.fail(f"no group with reward variance in {len(tasks)} tasks: {rewards}")


def test_a_grpo_step_on_the_gpu_moves_only_the_adapter() -> None:
    policy = lora_policy(str(packaged_or_skip(MODEL)), SETTINGS, device="cuda")
    assert policy.device.type == "cuda"
    trainable = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 and p.is_cuda for p in trainable.values())
    frozen = next(p for n, p in policy.model.named_parameters() if "q_proj.base_layer" in n)
    assert frozen.dtype == torch.bfloat16 and frozen.is_cuda

    group = _group_with_variance(policy)
    assert sum(r.hinted for r in group) == 4  # half the group saw the hint
    before = {n: p.detach().clone() for n, p in trainable.items()}
    base_before = frozen.detach().clone()
    stats = policy_step(policy, optimizer_for(policy, SETTINGS), [group], SETTINGS)

    assert stats.used == 1 and stats.completion_tokens > 0
    assert torch.isfinite(torch.tensor([stats.loss, stats.grad_norm])).all(), stats
    moved = [n for n, p in trainable.items() if "lora_B" in n and not torch.equal(p, before[n])]
    assert moved, "a step on a group with reward variance left the adapter as it was"
    assert torch.equal(frozen, base_before)
    assert all(p.grad is None for p in trainable.values())  # zeroed for the next step


def test_the_gpu_scores_a_completion_as_the_cpu_does() -> None:
    """The same completion's log-probabilities from the bf16 GPU policy and the fp32 CPU one
    (both with a fresh adapter, which adds nothing until trained) agree to bf16 precision."""
    model_dir = str(packaged_or_skip(MODEL))
    gpu = lora_policy(model_dir, SETTINGS, device="cuda")
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
    task = next(t for t in env.tasks() if t.split == "train")
    group = rollout_group(gpu, env, task, [0, 1], SETTINGS, sample_seed=7)
    turn = next(t for r in group for t in r.turns if len(t.completion_ids) >= 8)
    cpu = lora_policy(model_dir, SETTINGS, device="cpu")
    with torch.no_grad():
        on_gpu = gpu.completion_logprobs(turn, SETTINGS.temperature).float().cpu()
        on_cpu = cpu.completion_logprobs(turn, SETTINGS.temperature)
    gap = (on_gpu - on_cpu).abs()
    print(f"logprob gap over {len(gap)} tokens: mean {gap.mean():.4f}, max {gap.max():.4f}")
    # bf16 keeps 8 bits of mantissa: per-token gaps of a few hundredths, not a different model
    assert float(gap.mean()) < 0.1, gap
    assert float(on_gpu.sum() - on_cpu.sum()) == pytest.approx(0.0, abs=0.1 * len(gap))
