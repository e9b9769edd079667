"""Where the policy's completions come from while it trains.

- `LocalSampler`: transformers `generate` on the policy itself (the CPU default).
- `EndpointSampler`: an OpenAI-compatible endpoint serving the policy's current adapter: vLLM
  on a GPU (`--enable-lora`, runtime LoRA updating on); `retrace serve-model` speaks the same
  API. Before the first rollout and after every optimizer step the adapter is saved under a
  new name and loaded with `/v1/load_lora_adapter`, the previous one unloaded. Prompts go to
  `/v1/completions` as token ids and come back as token ids (`return_token_ids`, the stop
  token included), so the loss is computed on exactly the tokens the endpoint sampled.

Everything else in the loop (prompts, parsing, environments, loss, checkpoints) is the same
code whichever one samples. The endpoint must serve the very base weights the trainer loads:
the first sync checks it, by comparing the endpoint's log-probabilities of a probe reply with
the policy's (a different model or checkpoint fails the job; precision noise is logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from shared.envs.protocol import Message
from shared.errors import ConfigError
from shared.llm.client import LLMClient, LLMError, LLMRequestError
from shared.llm.openai_types import ChatRequest, CompletionRequest, CompletionResponse
from shared.logging import get_logger
from shared.serving.batch import Batch
from shared.serving.kv_store import DEFAULT_BUDGET_BYTES, KVStore
from shared.serving.sampling import SamplingParams, pick

if TYPE_CHECKING:
    from services.train.grpo import GRPOSettings, Policy

log = get_logger(__name__)
T = TypeVar("T")
MAX_SEED = 2**62
PROBE = "Say hello in one short sentence."
NEEDS = (
    "the inference endpoint must give `return_token_ids` and `logprobs` on /v1/completions to "
    "train through it (vLLM 0.10.2 or later, or retrace serve-model)"
)
DRIFT_WARN = 0.1
DRIFT_FAIL = 1.0
"""Mean absolute log-probability gap (nats per token) between endpoint and policy on the probe
reply: above the first, a warning (precision, kernels); above the second, not the same model."""


class Sampler(Protocol):
    def sync(self, policy: Policy, step: int) -> None:
        """Sample from `policy`'s current weights from now on (`step`: optimizer steps taken)."""
        ...

    def sample(self, prompts: Sequence[list[int]], s: GRPOSettings, seed: int) -> list[list[int]]:
        """One sampled completion per prompt (token ids, through `<|im_end|>` when it ended)."""
        ...

    def close(self) -> None: ...


class LocalSampler:
    """Generation by the policy in this process, every prompt prefilled from the longest
    prefix already run since the last optimizer step (an episode's earlier turn, the group's
    shared task), then decoded as one batch (`shared.serving.batch`)."""

    def __init__(self, policy: Policy, kv_budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.policy = policy
        self.store = KVStore(kv_budget_bytes)
        self.prefilled = 0
        """Prompt tokens run through the model (the rest came from the store)."""

    def sync(self, policy: Policy, step: int) -> None:
        self.policy = policy
        self.store.clear()  # other weights: the stored keys and values are stale

    @torch.no_grad()
    def sample(self, prompts: Sequence[list[int]], s: GRPOSettings, seed: int) -> list[list[int]]:
        p = self.policy
        p.model.eval()
        params = SamplingParams(temperature=s.temperature, top_p=s.top_p)
        generators = [
            torch.Generator(p.device).manual_seed((seed * 1009 + i) % MAX_SEED)
            for i in range(len(prompts))
        ]
        batch = Batch(p.model, p.pad_id, self.store, device=p.device)
        batch.add([list(x) for x in prompts])
        self.prefilled += batch.prefilled
        out: list[list[int]] = [[] for _ in prompts]
        rows = list(range(len(prompts)))  # rows[k]: the prompt batch row k continues
        while rows:
            keep, tokens = [], []
            for k, i in enumerate(rows):
                token = pick(batch.logits[k], params, generators[i])
                out[i].append(token)
                if token == p.end_id or len(out[i]) >= s.max_new_tokens:
                    batch.save(k)
                else:
                    keep.append(k)
                    tokens.append(token)
            if len(keep) < len(rows):
                batch.keep(keep)
                rows = [rows[k] for k in keep]
            if rows:
                batch.step(tokens)
        return out

    def close(self) -> None:
        self.store.clear()


class EndpointSampler:
    """Generation by an inference endpoint that is sent the policy's adapter after every step.

    Runs on the training thread; its HTTP calls run on `loop` (the service's event loop, which
    must not be this thread's). Adapters are saved under `directory` (the job's), which the
    endpoint must read at the same path (a shared volume in compose), and loaded as
    `<job>-<run>-s<step>`: `run` is this sampler's own, so whatever another run of the same
    job does (a lost worker's leftovers, a superseded run still finishing its step) never
    touches this one's adapters, and this one's first sync unloads the others'."""

    def __init__(
        self,
        client: LLMClient,
        loop: asyncio.AbstractEventLoop,
        directory: Path,
        job: str,
        end_id: int,
        *,
        timeout_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.loop = loop
        self.job = job
        self.run = uuid.uuid4().hex[:8]
        self.prefix = f"{job}-{self.run}"
        self.directory = directory
        self.end_id = end_id
        self.timeout_s = timeout_s
        """The longest one call may take (the client's retries included) before it is
        abandoned as a retryable error."""
        self.name: str | None = None
        self.path: Path | None = None
        self.drift: float | None = None
        """What the first sync's check measured (nats per token)."""
        self._reload = asyncio.Lock()

    def sync(self, policy: Policy, step: int) -> None:
        name = f"{self.prefix}-s{step}"
        path = self.directory / self.run / f"s{step}"
        shutil.rmtree(path, ignore_errors=True)
        policy.model.save_pretrained(path)
        first = self.name is None
        self._run(self._swap(name, path, others=first))
        if first:  # other runs of this job: a lost worker's leftovers
            for other in self.directory.iterdir():
                if other != path.parent:
                    shutil.rmtree(other, ignore_errors=True)
        for earlier in path.parent.iterdir():
            if earlier != path:
                shutil.rmtree(earlier, ignore_errors=True)
        self.name, self.path = name, path
        if first:
            self.drift = self.check(policy)

    def check(self, policy: Policy) -> float:
        """The mean |log p| gap per token between the endpoint (serving the adapter just
        synced) and the policy, on a greedy reply to a probe; a gap that says the endpoint
        serves another model is a `ConfigError`."""
        from services.train.grpo import Turn  # grpo imports this module

        probe = ChatRequest(model="probe", messages=[Message(role="user", content=PROBE)])
        prompt, _ = policy.builder.build(probe)
        request = CompletionRequest(
            model=self.name or "",
            prompt=prompt,
            max_tokens=16,
            temperature=0.0,
            logprobs=0,
            return_token_ids=True,
        )
        choice = self._run(self.client.complete(request)).choices[0]
        if not choice.token_ids or choice.logprobs is None:
            raise ConfigError(f"no token ids or log-probabilities: {NEEDS}")
        served = torch.tensor(choice.logprobs.token_logprobs[: len(choice.token_ids)])
        with torch.no_grad():
            ours = policy.completion_logprobs(Turn(prompt, choice.token_ids), 1.0).cpu()
        drift = float((ours[: len(served)] - served).abs().mean())
        if drift > DRIFT_FAIL:
            raise ConfigError(
                f"the inference endpoint does not serve the weights being trained: its "
                f"log-probabilities differ from the policy's by {drift:.2f} nats per token "
                f"(at most {DRIFT_FAIL} expected); point it at the same model files"
            )
        if drift > DRIFT_WARN:
            log.warning("endpoint and policy disagree beyond precision noise", drift=drift)
        else:
            log.info("endpoint serves the policy's weights", drift=round(drift, 6))
        return drift

    async def _swap(self, name: str, path: Path, *, others: bool) -> None:
        """Load `name`; unload this run's earlier adapters, and other runs' when `others`."""
        stale = await self._unload_under(self.job if others else self.prefix)
        await self._load(name, path)
        if stale:
            log.debug("training adapters swapped", loaded=name, unloaded=stale)

    async def _load(self, name: str, path: Path) -> None:
        try:
            await self.client.load_adapter(name, str(path))
        except LLMRequestError as exc:
            # a retried load whose first attempt did land: the adapter is there
            if "already" not in str(exc).lower() or name not in await self.client.models():
                raise

    async def _unload(self, name: str) -> None:
        try:
            await self.client.unload_adapter(name)
        except LLMRequestError as exc:
            if "HTTP 404" not in str(exc):  # already gone: what we wanted
                raise

    def sample(self, prompts: Sequence[list[int]], s: GRPOSettings, seed: int) -> list[list[int]]:
        if self.name is None:
            raise RuntimeError("EndpointSampler.sample before sync: no adapter is loaded")
        requests = [
            CompletionRequest(
                model=self.name,
                prompt=list(prompt),
                max_tokens=s.max_new_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                # what the local sampler does; vLLM would otherwise fill these from the
                # model's generation_config (e.g. top_k 20), sampling off-policy
                top_k=-1,
                min_p=0.0,
                repetition_penalty=1.0,
                seed=(seed * 1009 + i) % MAX_SEED,
                stop_token_ids=[self.end_id],
                return_token_ids=True,
            )
            for i, prompt in enumerate(prompts)
        ]

        async def all_of() -> list[CompletionResponse]:
            try:
                async with asyncio.TaskGroup() as group:  # one fails: the others are cancelled
                    tasks = [group.create_task(self._complete(r)) for r in requests]
            except ExceptionGroup as failed:
                raise failed.exceptions[0] from None
            return [t.result() for t in tasks]

        completions: list[list[int]] = []
        for response in self._run(all_of()):
            ids = response.choices[0].token_ids if response.choices else None
            if ids is None:
                raise ConfigError(f"no token ids: {NEEDS}")
            completions.append(_through_end(ids, self.end_id))
        return completions

    async def _complete(self, request: CompletionRequest) -> CompletionResponse:
        """One completion; an endpoint that lost the adapter (it restarted) is sent it again."""
        try:
            return await self.client.complete(request)
        except LLMRequestError as exc:
            if "HTTP 404" not in str(exc) or self.path is None:
                raise
            async with self._reload:
                if request.model not in await self.client.models():
                    log.warning("the endpoint lost the training adapter; loading it again")
                    await self._load(request.model, self.path)
            return await self.client.complete(request)

    def close(self) -> None:
        """Unload this run's adapters from the endpoint and delete their files."""
        try:
            self._run(self._unload_under(self.prefix))
        except (LLMError, LLMRequestError, OSError, RuntimeError, TimeoutError) as exc:
            log.warning("training adapters not unloaded", prefix=self.prefix, error=str(exc))
        shutil.rmtree(self.directory / self.run, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # the job's directory, once no run is left in it
        self.name = self.path = None

    async def _unload_under(self, prefix: str) -> list[str]:
        """Unload every adapter named `<prefix>-...`; their names."""
        names = [m for m in await self.client.models() if m.startswith(prefix + "-")]
        for name in names:
            await self._unload(name)
        return names

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("EndpointSampler blocks: call it from a thread, not its loop")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            future.cancel()
            raise LLMError(
                f"the inference endpoint did not answer within {self.timeout_s:.0f} s"
            ) from None


def _through_end(ids: list[int], end_id: int) -> list[int]:
    return ids[: ids.index(end_id) + 1] if end_id in ids else ids
