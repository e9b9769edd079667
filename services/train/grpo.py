"""GRPO with LoRA over our environment protocol: multi-turn episodes, one group per task.

TRL's GRPOTrainer wants single completions (or an experimental rollout hook that leaves
multi-turn tokenisation, masking and generation to the caller), and its tool loop cannot
give a scripted user a turn. Our loop is short, so it is ours:

1. Rollout: the group's G episodes of one task run in lockstep; each turn renders every
   active conversation with the serving prompt builder (the same template the endpoint
   uses), samples the replies (one batched `generate` in process, or an inference endpoint
   serving the current adapter: `sampling.py`), parses them into assistant messages exactly
   as the server would, and steps the episodes. The exact prompt and
   completion token ids of every assistant turn are kept: the loss is computed on the
   tokens that were sampled, never on a re-tokenisation.
2. Advantages: reward minus the group mean, divided by the group's standard deviation
   (`scale_rewards`); a group whose rewards are all equal teaches nothing and is dropped.
3. Loss: minus the advantage times the log-probability of the sampled completion tokens
   (at the sampling temperature), summed over a rollout's turns and divided by the number
   of completion tokens in the step (token-level normalisation); no KL term (beta = 0, as
   the paper). Being on-policy (one update per batch) the importance ratio is 1, so this is
   the clipped objective's gradient.

Hints (the paper's hint injection): when the episodes carry one (`shared/envs/guidance.py`),
the first `hint_share` of each group's rollouts see it in their system turn. Each of their
turns keeps two prompts: the hinted one it was sampled from, and the same conversation
without the hint (`Turn.train_prompt_ids`), which is the only one the loss ever reads. As in
the paper that makes hinted rollouts off-policy data trained as if on-policy; with
`hint_correction="tis"` each of their tokens is weighted by the truncated ratio
min(cap, p(token | unhinted) / p(token | hinted)) under the current weights, detached.

Everything here is synchronous torch work; the train service runs it in a thread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import torch
from transformers import DynamicCache

from services.train.sampling import LocalSampler, Sampler
from shared.envs.guidance import hint_of, hinted_count, with_guidance
from shared.envs.protocol import Environment, Message, TaskSpec, ToolCall, ToolCallFunction
from shared.llm.openai_types import ChatRequest
from shared.llm.tool_format import parse_reply, tool_names
from shared.serving.prompts import TURN_END, PromptBuilder, first_turn_length


@dataclass(frozen=True)
class GRPOSettings:
    rank: int = 16
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    learning_rate: float = 1e-5
    group_size: int = 16
    """Episodes per task: one GRPO group."""
    groups_per_step: int = 1
    """Groups (tasks) per optimizer step."""
    max_new_tokens: int = 256
    """Tokens per assistant turn."""
    max_turns: int = 8
    """Assistant turns per episode."""
    max_prompt_tokens: int = 4096
    """An episode whose conversation outgrows this ends (and is scored as it stands)."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_grad_norm: float = 1.0
    scale_rewards: bool = True
    """Divide advantages by the group's standard deviation."""
    seed: int = 0
    hint_share: float = 0.0
    """Share of each group's rollouts whose system turn carries the episode's hint (paper:
    0.25 to 0.5); 0 turns hints off. Episodes without a hint are never hinted."""
    hint_correction: Literal["none", "tis"] = "none"
    """`none`: hinted rollouts trained as if sampled without the hint (the paper); `tis`:
    their tokens weighted by the truncated importance ratio unhinted / hinted."""
    tis_cap: float = 2.0
    """Upper bound of that ratio."""
    format_bonus: float = 0.0
    """Added to a rollout's reward for the advantage, times the share of its tool-calling
    turns written in the canonical tagged form (0: the environment's reward alone)."""
    sample_ahead: int = 0
    """Later steps whose groups are sampled together with this step's, from the same
    weights, as one lockstep batch: a CPU decodes 8 rows for about 1.2 times the cost of 4
    (docs/benchmarks.md, the raw forward pass). Those steps then train on rollouts one to
    `sample_ahead` updates old (off-policy, uncorrected, like the hinted rollouts); 0 samples
    every step from its own weights (the paper)."""
    share_prefix: bool = True
    """Run the prompt prefix the step's turns share (the system turn and, within a group, the
    task) forward and backward once per step instead of once per turn; the gradient is the
    same (`SharedPrefix`)."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2, got {self.group_size}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        for name in ("rank", "alpha", "groups_per_step", "max_new_tokens", "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.sample_ahead < 0:
            raise ValueError(f"sample_ahead must be at least 0, got {self.sample_ahead}")
        if not 0.0 <= self.hint_share <= 1.0:
            raise ValueError(f"hint_share must be in [0, 1], got {self.hint_share}")
        if self.hint_correction not in ("none", "tis"):
            raise ValueError(f"hint_correction must be none or tis, got {self.hint_correction!r}")
        if not self.tis_cap >= 1.0:
            raise ValueError(f"tis_cap must be at least 1, got {self.tis_cap}")
        if not 0.0 <= self.format_bonus <= 1.0:
            raise ValueError(f"format_bonus must be in [0, 1], got {self.format_bonus}")


@dataclass
class Turn:
    prompt_ids: list[int]
    """What the completion was sampled from (with the hint, in a hinted rollout)."""
    completion_ids: list[int]
    train_prompt_ids: list[int] | None = None
    """A hinted rollout's prompt rebuilt without the hint: the loss reads this one."""

    @property
    def loss_prompt_ids(self) -> list[int]:
        """The prompt the gradient is computed on: never one that holds the hint."""
        return self.train_prompt_ids if self.train_prompt_ids is not None else self.prompt_ids


@dataclass
class Rollout:
    task_id: str
    seed: int
    reward: float
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    ended: str = "done"
    """Why the episode ended: done, max_turns, too_long, environment_error."""
    hinted: bool = False
    """Its system turn carried the episode's hint while it was sampled."""
    forms: list[str | None] = field(default_factory=list)
    """Per turn, how its tool calls were written (tagged, fenced, bare), None for text."""

    def trained_reward(self, s: GRPOSettings) -> float:
        """The reward its advantage is computed from: the environment's, plus the format
        bonus for the share of its tool-calling turns written in the canonical form."""
        calling = [form for form in self.forms if form is not None]
        if not calling or not s.format_bonus:
            return self.reward
        return self.reward + s.format_bonus * calling.count("tagged") / len(calling)


@dataclass(frozen=True)
class StepStats:
    groups: int
    """Groups rolled out this step."""
    used: int
    """Groups with reward variance (the others were dropped)."""
    rollouts: int
    mean_reward: float
    loss: float
    completion_tokens: int
    grad_norm: float
    hinted_reward: float | None = None
    """Mean reward of the hinted rollouts (None when none was hinted)."""
    unhinted_reward: float | None = None


class Policy:
    """The model being trained (a peft LoRA model), its tokenizer and the prompt template."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.builder = PromptBuilder(tokenizer)
        self.end_id = tokenizer.convert_tokens_to_ids(TURN_END)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def completion_logprobs(
        self,
        turn: Turn,
        temperature: float,
        prompt_ids: list[int] | None = None,
        prefix: SharedPrefix | None = None,
    ) -> torch.Tensor:
        """Log-probabilities of the turn's completion tokens under the current weights, after
        `prompt_ids` (default: the prompt the loss reads, never a hinted one). With `prefix`
        (which the prompt must open with) only the rest of the prompt is run, on its keys
        and values."""
        prompt = turn.loss_prompt_ids if prompt_ids is None else prompt_ids
        start = 0
        past = None
        if prefix is not None:
            start = len(prefix.ids)
            if prompt[:start] != prefix.ids or len(prompt) <= start:
                raise ValueError("the prompt does not extend the shared prefix")
            past = prefix.cache()
        ids = torch.tensor([prompt[start:] + turn.completion_ids], device=self.device)
        out = self.model(input_ids=ids, past_key_values=past, use_cache=past is not None)
        logits = out.logits[0, len(prompt) - start - 1 : -1]
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        target = torch.tensor(turn.completion_ids, device=self.device)
        return logp.gather(1, target[:, None])[:, 0]

    def to_message(
        self, completion: list[int], tools: Collection[str] = ()
    ) -> tuple[Message, str | None]:
        """The assistant message the server would return for this completion, when the
        request offered the functions named in `tools`, and the form its calls took."""
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        parsed = parse_reply(text, tools)
        calls = [
            ToolCall(id=f"call_{i}", function=ToolCallFunction(name=c.name, arguments=c.arguments))
            for i, c in enumerate(parsed.calls)
        ]
        message = Message(role="assistant", content=parsed.content, tool_calls=calls or None)
        return message, parsed.form


def rollout_group(
    policy: Policy,
    env: Environment,
    task: TaskSpec,
    seeds: Sequence[int],
    s: GRPOSettings,
    *,
    system_prompt: str = "",
    sample_seed: int = 0,
    sampler: Sampler | None = None,
) -> list[Rollout]:
    """One episode per seed of `task`, run in lockstep; scored, with their exact tokens.
    The first `hint_share` of them see the episode's hint. Completions come from `sampler`
    (default: the policy itself, in process)."""
    hinted = hinted_count(len(seeds), s.hint_share)
    return rollout_episodes(
        policy,
        env,
        [(task, seed) for seed in seeds],
        s,
        hinted=[i < hinted for i in range(len(seeds))],
        system_prompt=system_prompt,
        sample_seed=sample_seed,
        sampler=sampler,
    )


def rollout_episodes(
    policy: Policy,
    env: Environment,
    pairs: Sequence[tuple[TaskSpec, int]],
    s: GRPOSettings,
    *,
    hinted: Sequence[bool] = (),
    system_prompt: str = "",
    sample_seed: int = 0,
    sampler: Sampler | None = None,
) -> list[Rollout]:
    """One episode per (task, seed), run in lockstep; those flagged in `hinted` see their
    episode's hint (when it has one)."""
    sampler = sampler or LocalSampler(policy)
    episodes = [env.reset(task, seed) for task, seed in pairs]
    histories: list[list[Message]] = []
    plain: list[Message] = []
    """Each rollout's system turn without the hint: what the loss sees."""
    rollouts = [Rollout(task.id, seed, 0.0) for task, seed in pairs]
    for i, episode in enumerate(episodes):
        system = "\n\n".join(p for p in (system_prompt.strip(), episode.system_prompt) if p)
        hint = hint_of(episode) if i < len(hinted) and hinted[i] else ""
        rollouts[i].hinted = bool(hint)
        plain.append(Message(role="system", content=system))
        shown = Message(role="system", content=with_guidance(system, hint))
        histories.append([shown, *episode.messages])
    active = list(range(len(episodes)))
    for turn in range(s.max_turns):
        prompts: dict[int, list[int]] = {}
        for i in active:
            request = ChatRequest(
                model="policy", messages=histories[i], tools=episodes[i].tools or None
            )
            ids, _ = policy.builder.build(request)
            if len(ids) + s.max_new_tokens > s.max_prompt_tokens:
                rollouts[i].ended = "too_long"
            else:
                prompts[i] = ids
        active = list(prompts)
        if not active:
            break
        completions = sampler.sample(
            [prompts[i] for i in active], s, seed=sample_seed * 1000 + turn
        )
        still: list[int] = []
        for i, completion in zip(active, completions, strict=True):
            unhinted = None
            if rollouts[i].hinted:
                request = ChatRequest(
                    model="policy",
                    messages=[plain[i], *histories[i][1:]],
                    tools=episodes[i].tools or None,
                )
                unhinted, _ = policy.builder.build(request)
            rollouts[i].turns.append(Turn(prompts[i], completion, unhinted))
            message, form = policy.to_message(completion, tool_names(episodes[i].tools))
            rollouts[i].forms.append(form)
            histories[i].append(message)
            try:
                result = episodes[i].step(message)
            except Exception:  # noqa: BLE001  a broken step ends the episode; it is still scored
                rollouts[i].ended = "environment_error"
                continue
            histories[i].extend(result.messages)
            if not result.done:
                still.append(i)
        active = still
    for i in active:
        rollouts[i].ended = "max_turns"
    for rollout, episode, history, opening in zip(
        rollouts, episodes, histories, plain, strict=True
    ):
        rollout.reward = float(episode.score().reward)
        # Stored as the policy should learn to act: without the hint.
        rollout.messages = [msgspec.to_builtins(m) for m in [opening, *history[1:]]]
    return rollouts


def advantages(rewards: Sequence[float], scale: bool, eps: float = 1e-4) -> list[float] | None:
    """Group-relative advantages; None for a group whose rewards are all equal."""
    mean = statistics.fmean(rewards)
    spread = statistics.pstdev(rewards)
    if spread < 1e-9:
        return None
    return [(r - mean) / (spread + eps) if scale else r - mean for r in rewards]


def policy_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: Sequence[Sequence[Rollout]],
    s: GRPOSettings,
) -> StepStats:
    """One optimizer step on the groups' rollouts (constant groups dropped)."""
    weighted: list[tuple[Rollout, float]] = []
    used = 0
    for group in groups:
        group_adv = advantages([r.trained_reward(s) for r in group], s.scale_rewards)
        if group_adv is not None:
            used += 1
            weighted += [(r, a) for r, a in zip(group, group_adv, strict=True) if a != 0.0]
    tokens = sum(len(t.completion_ids) for r, _ in weighted for t in r.turns)
    rewards = [r.reward for g in groups for r in g]
    loss_total = 0.0
    grad_norm = 0.0
    optimizer.zero_grad(set_to_none=True)
    if weighted and tokens:
        policy.model.train()
        items = [(t, adv) for rollout, adv in weighted for t in rollout.turns if t.completion_ids]
        for length, members in _prefix_groups([t for t, _ in items], s, policy.end_id):
            prefix = None
            if length:
                prefix = SharedPrefix(policy, items[members[0]][0].loss_prompt_ids[:length])
            for i in members:
                turn, adv = items[i]
                logp = policy.completion_logprobs(turn, s.temperature, prefix=prefix)
                weights = _hint_weights(policy, turn, logp, s)
                loss = -adv * (logp * weights).sum() / tokens
                loss.backward()  # one turn at a time: memory stays one sequence deep
                loss_total += float(loss.detach())
            if prefix is not None:
                prefix.backward()
        params = [p for p in policy.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm))
        if math.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    hinted = [r.reward for g in groups for r in g if r.hinted]
    unhinted = [r.reward for g in groups for r in g if not r.hinted]
    return StepStats(
        groups=len(groups),
        used=used,
        rollouts=len(rewards),
        mean_reward=statistics.fmean(rewards) if rewards else 0.0,
        loss=loss_total,
        completion_tokens=tokens,
        grad_norm=grad_norm,
        hinted_reward=statistics.fmean(hinted) if hinted else None,
        unhinted_reward=statistics.fmean(unhinted) if unhinted else None,
    )


MIN_SHARED_PREFIX = 16
"""Fewest shared prompt tokens worth a separate prefix pass."""


class SharedPrefix:
    """A prompt prefix that several turns of a step open with, run forward once with its
    graph. Each turn runs only the rest of its prompt and its completion, on detached copies
    of the prefix's keys and values (leaves whose gradients add up over the turns); `backward`
    then sends that sum into the prefix's graph once. The chain rule makes the gradient the
    one the turns give run whole, at the cost of the prefix run once per step instead of once
    per turn: on the toolbox, a 3k-token system turn against turns of ~100 tokens."""

    def __init__(self, policy: Policy, ids: list[int]) -> None:
        self.ids = ids
        out = policy.model(input_ids=torch.tensor([ids], device=policy.device), use_cache=True)
        layers = out.past_key_values.layers
        self._graph = [t for layer in layers for t in (layer.keys, layer.values)]
        self._leaves = [t.detach().requires_grad_() for t in self._graph]

    def cache(self) -> DynamicCache:
        """A fresh cache over the leaves (a forward appends to the cache it is given)."""
        cache = DynamicCache()
        for layer in range(len(self._leaves) // 2):
            cache.update(self._leaves[2 * layer], self._leaves[2 * layer + 1], layer)
        return cache

    def backward(self) -> None:
        pairs = [
            (t, leaf.grad)
            for t, leaf in zip(self._graph, self._leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self._graph, self._leaves = [], []


def _prefix_groups(
    turns: Sequence[Turn], s: GRPOSettings, end_id: int
) -> list[tuple[int, list[int]]]:
    """The turns (by index) grouped by the system turn their loss prompt opens with, each
    group with the length of the prefix all its prompts share (0: run each turn whole). The
    prefix stops a token short of the shortest prompt: that token's logits predict the first
    completion token."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, turn in enumerate(turns):
        ids = turn.loss_prompt_ids
        groups.setdefault(tuple(ids[: first_turn_length(ids, end_id)]), []).append(i)
    out = []
    for members in groups.values():
        prompts = [turns[i].loss_prompt_ids for i in members]
        length = min(_common_prefix(prompts), min(map(len, prompts)) - 1)
        shared = s.share_prefix and len(members) > 1 and length >= MIN_SHARED_PREFIX
        out.append((length if shared else 0, members))
    return out


def _common_prefix(prompts: Sequence[list[int]]) -> int:
    """How many leading tokens every prompt has in common."""
    length = min(map(len, prompts))
    for column in range(length):
        if any(p[column] != prompts[0][column] for p in prompts):
            return column
    return length


def _hint_weights(
    policy: Policy, turn: Turn, logp: torch.Tensor, s: GRPOSettings
) -> torch.Tensor | float:
    """Per-token weights of a turn's log-probabilities: 1, or for a hinted turn under
    `hint_correction="tis"` the truncated ratio p(token | unhinted) / p(token | hinted)."""
    if turn.train_prompt_ids is None or s.hint_correction == "none":
        return 1.0
    with torch.no_grad():
        behaviour = policy.completion_logprobs(turn, s.temperature, turn.prompt_ids)
    return torch.exp(logp.detach() - behaviour).clamp(max=s.tis_cap)


def lora_policy(model_dir: str, s: GRPOSettings, device: str = "cpu") -> Policy:
    """The base model from a local directory with a fresh LoRA adapter of the settings' shape,
    on `device`: fp32 on a CPU (its bf16 matmuls are far slower), bf16 on a GPU (peft keeps
    the adapter's own weights in fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    base: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return lora_on(base.to(device), tokenizer, s)


def lora_on(base: Any, tokenizer: Any, s: GRPOSettings) -> Policy:
    """`base` with a fresh LoRA adapter (seeded), as a `Policy`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(s.seed)
    config = LoraConfig(
        r=s.rank,
        lora_alpha=s.alpha,
        lora_dropout=s.dropout,
        target_modules=list(s.target_modules),
        task_type="CAUSAL_LM",
    )
    return Policy(get_peft_model(base, config), tokenizer)


def optimizer_for(policy: Policy, s: GRPOSettings) -> torch.optim.Optimizer:
    params = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=s.learning_rate, weight_decay=0.0)
