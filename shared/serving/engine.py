"""The generation engine: one thread that owns the model and serves batches.

Requests that arrive within `batch_window` of each other (up to `max_batch` sequences, all on
the same adapter) are generated together: one left-padded prefill, then one forward pass per
step for the whole batch, each row sampled with its own settings and stopped on its own; rows
that finish leave the KV cache so the rest run on a smaller batch. Adapter loads and unloads
run on the same thread between batches, so a batch never sees its adapter change.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from shared.logging import get_logger
from shared.serving.prompts import TURN_END
from shared.serving.sampling import SamplingParams, pick

log = get_logger(__name__)


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class Output:
    text: str
    token_ids: list[int]
    finish_reason: str
    """stop | length"""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_token: int | None = None
    """The token generation stopped on (not in `token_ids` or `text`), if it stopped on one."""


Delta = tuple[int, str]
"""(sequence index within the request, new text)"""


@dataclass
class Request:
    prompt_ids: list[int]
    adapter: str | None
    params: SamplingParams
    n: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Output]]
    on_delta: Callable[[Delta], None] | None = None
    outputs: list[Output | None] = field(default_factory=list)
    prefix_len: int = 0
    """Leading prompt tokens shared with other requests (the system turn with the tools)."""

    @property
    def group(self) -> tuple[str | None, tuple[int, ...]]:
        """Requests of one group can share a batch: same adapter, same cached prefix."""
        prefix = tuple(self.prompt_ids[: self.prefix_len]) if self.prefix_len >= MIN_PREFIX else ()
        return self.adapter, prefix


@dataclass
class _Row:
    request: Request
    index: int
    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_token: int | None = None
    done: bool = False


@dataclass
class EngineStats:
    batches: int = 0
    sequences: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    """Prompt tokens actually run through the model (the rest came from the prefix cache)."""
    prefix_hits: int = 0
    busy_seconds: float = 0.0


MIN_PREFIX = 32
"""Shorter shared prefixes are not worth caching."""
PREFIX_CACHE_SIZE = 8


class PrefixCache:
    """Key/value tensors of recently seen prompt prefixes, per adapter, least recently used out.
    Every episode of an environment starts with the same system turn (policy and tools): it is
    computed once instead of once per request."""

    def __init__(self, capacity: int = PREFIX_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._items: OrderedDict[
            tuple[str | None, tuple[int, ...]], list[tuple[torch.Tensor, torch.Tensor]]
        ] = OrderedDict()

    def get(
        self, key: tuple[str | None, tuple[int, ...]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(
        self, key: tuple[str | None, tuple[int, ...]], kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        self._items[key] = kv
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()


class Engine:
    def __init__(
        self, model: Any, tokenizer: Any, *, max_batch: int = 32, batch_window: float = 0.01
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window = batch_window
        self.stats = EngineStats()
        self.adapters: dict[str, str] = {}
        """Loaded adapter name -> path."""
        self._pending: deque[Request] = deque()
        self._commands: queue.Queue[
            tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]
        ] = queue.Queue()
        self._wake = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None
        self._stop_ids = _stop_token_ids(model, tokenizer)
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._stop_ids[0]
        )
        self._rng = random.Random()
        self.prefixes = PrefixCache()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- API for the event loop ---------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        adapter: str | None = None,
        n: int = 1,
        on_delta: Callable[[Delta], None] | None = None,
        prefix_len: int = 0,
    ) -> list[Output]:
        """Generate n continuations; `prefix_len` leading tokens may be served from the cache
        (they must end where a fresh tokenization would also end, e.g. at a special token)."""
        loop = asyncio.get_running_loop()
        prefix_len = min(prefix_len, len(prompt_ids) - 1)
        request = Request(
            prompt_ids,
            adapter,
            params,
            n,
            loop,
            loop.create_future(),
            on_delta,
            [None] * n,
            prefix_len,
        )
        with self._wake:
            self._pending.append(request)
            self._wake.notify_all()
        return await request.future

    async def run_on_engine(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread between batches (adapter loads and unloads)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._commands.put((fn, future, loop))
        with self._wake:
            self._wake.notify_all()
        return await future

    # -- the engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            self._run_commands()
            batch = self._next_batch()
            if batch is None:
                return
            if batch[0]:
                self._serve(*batch)

    def _run_commands(self) -> None:
        while True:
            try:
                fn, future, loop = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001  boundary: the error goes back to the caller
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

    def _next_batch(self) -> tuple[list[Request], tuple[int, ...]] | None:
        """The next batch and the cached prefix its rows share (None: stop).

        The oldest request's group (adapter and prefix) goes first, as many as fit. When
        requests of the same adapter but other prefixes wait too, and there are at least as
        many of them, they join the batch and every row is prefilled whole, rather than wait
        for several small batches in turn (a synthetic environment offers each task its own
        tools, so its episodes' system turns differ). Where a step's cost grows slower than
        its rows (a GPU) that is throughput; on the 2-core CPU measured it is not
        (docs/benchmarks.md, engines), only fewer requests waiting behind others."""
        with self._wake:
            while self._running and not self._pending and self._commands.empty():
                self._wake.wait()
            if not self._running:
                return None
            if not self._pending:
                return [], ()
        time.sleep(self.batch_window)  # let requests sent together arrive together
        with self._wake:
            self._pending = deque(r for r in self._pending if not r.future.done())
            if not self._pending:
                return [], ()
            first = self._pending[0].group
            batch = self._take(lambda r: r.group == first, [], 0)
            prefix = first[1]
            size = sum(r.n for r in batch)
            others = sum(r.n for r in self._pending if r.adapter == first[0])
            if size < self.max_batch and others >= size:
                batch = self._take(lambda r: r.adapter == first[0], batch, size)
                prefix = ()
            return batch, prefix

    def _take(
        self, fits: Callable[[Request], bool], batch: list[Request], size: int
    ) -> list[Request]:
        """Pending requests that `fits` accepts, oldest first, added to `batch` (holding
        `size` rows) up to `max_batch` rows (the first one always)."""
        for request in list(self._pending):
            overflow = size + request.n > self.max_batch and batch
            if not fits(request) or overflow:
                continue
            batch.append(request)
            size += request.n
            self._pending.remove(request)
            if size >= self.max_batch:
                break
        return batch

    def _serve(self, batch: list[Request], prefix: tuple[int, ...] = ()) -> None:
        started = time.perf_counter()
        # Counted before its rows are answered, so a caller that got its answer sees it.
        self.stats.batches += 1
        try:
            with self._adapter(batch[0].adapter):
                self._generate(batch, prefix)
        except Exception as exc:
            log.exception("generation failed", error=repr(exc))
            for request in batch:
                if not request.future.done():
                    request.loop.call_soon_threadsafe(_settle, request.future, None, exc)
        self.stats.busy_seconds += time.perf_counter() - started

    @contextlib.contextmanager
    def _adapter(self, name: str | None) -> Iterator[None]:
        if not hasattr(self.model, "peft_config"):
            if name is not None:
                raise KeyError(f"adapter {name!r} was unloaded")
            yield
        elif name is None:
            with self.model.disable_adapter():
                yield
        else:
            if name not in self.adapters:
                # Unloaded after the request was accepted: never answer it with another model.
                raise KeyError(f"adapter {name!r} was unloaded")
            self.model.set_adapter(name)
            yield

    def _generate(self, batch: list[Request], prefix: tuple[int, ...]) -> None:
        rows = [
            _Row(r, i, _generator(r.params.seed, i, self._rng)) for r in batch for i in range(r.n)
        ]
        adapter = batch[0].adapter
        kv = self._prefix_kv(adapter, prefix) if prefix else None
        shared = len(prefix) if kv is not None else 0
        prompts = [row.request.prompt_ids[shared:] for row in rows]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self._pad_id] * (width - len(p)) + p for p in prompts])
        # Padding sits between the shared prefix and each row's own suffix; the mask hides it
        # and positions skip it, so every row sees exactly its own prompt.
        mask = torch.tensor([[1] * shared + [0] * (width - len(p)) + [1] * len(p) for p in prompts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        self.stats.sequences += len(rows)
        self.stats.prompt_tokens += sum(len(r.request.prompt_ids) for r in rows)
        self.stats.prefilled_tokens += sum(len(p) for p in prompts)
        cache = None
        if kv is not None:
            cache = _expand(kv, len(rows))
            self.stats.prefix_hits += len(rows)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        active = list(range(len(rows)))  # rows[active[k]] is batch row k
        while active:
            next_ids = []
            for k, r in enumerate(active):
                row = rows[r]
                if row.request.future.done():
                    # The caller went away (client disconnected, timed out): stop generating.
                    row.done = True
                    next_ids.append(self._pad_id)
                    continue
                token = pick(logits[k], row.request.params, row.generator)
                self._append(row, token, logits[k])
                next_ids.append(token)
            keep = [k for k, r in enumerate(active) if not rows[r].done]
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                next_ids = [next_ids[k] for k in keep]
                active = [active[k] for k in keep]
            mask = torch.cat([mask, torch.ones(len(active), 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=torch.tensor(next_ids)[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]

    def _prefix_kv(
        self, adapter: str | None, prefix: tuple[int, ...]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        key = (adapter, prefix)
        kv = self.prefixes.get(key)
        if kv is None:
            out = self.model(input_ids=torch.tensor([list(prefix)]), use_cache=True)
            kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            self.prefixes.put(key, kv)
            self.stats.prefilled_tokens += len(prefix)
        return kv

    def _append(self, row: _Row, token: int, logits: torch.Tensor) -> None:
        params = row.request.params
        self.stats.generated_tokens += 1
        if params.logprobs:
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            top: list[tuple[str, float]] = []
            if params.top_logprobs:
                values, ids = torch.topk(logprobs, params.top_logprobs)
                top = [
                    (self.tokenizer.decode([int(i)]), float(v))
                    for v, i in zip(values, ids, strict=True)
                ]
            row.logprobs.append(
                TokenLogprob(self.tokenizer.decode([token]), float(logprobs[token]), top)
            )
        finish: str | None = None
        if token in self._stop_ids or token in params.stop_token_ids:
            finish = "stop"
            row.stop_token = token
        else:
            row.ids.append(token)
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
            hit = _first_stop(text, params.stop, len(row.text))
            if hit is not None:
                text, finish = text[:hit], "stop"
            if text.endswith("\ufffd") and finish is None:
                # Half of a multi-byte character: wait for the rest before streaming it.
                text = row.text
            delta, row.text = text[len(row.text) :], text
            if delta and row.request.on_delta is not None:
                row.request.loop.call_soon_threadsafe(row.request.on_delta, (row.index, delta))
            if finish is None and len(row.ids) >= params.max_tokens:
                finish = "length"
        if finish is not None:
            row.done = True
            self._finish(row, finish)

    def _finish(self, row: _Row, reason: str) -> None:
        request = row.request
        request.outputs[row.index] = Output(row.text, row.ids, reason, row.logprobs, row.stop_token)
        if all(o is not None for o in request.outputs) and not request.future.done():
            outputs = [o for o in request.outputs if o is not None]
            request.loop.call_soon_threadsafe(_settle, request.future, outputs, None)


def _expand(kv: list[tuple[torch.Tensor, torch.Tensor]], size: int) -> DynamicCache:
    """A fresh cache holding the prefix once per row (generation appends to it in place)."""
    return DynamicCache(
        ddp_cache_data=[
            (k.expand(size, -1, -1, -1).contiguous(), v.expand(size, -1, -1, -1).contiguous())
            for k, v in kv
        ]
    )


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _generator(seed: int | None, index: int, rng: random.Random) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed + index if seed is not None else rng.getrandbits(63))
    return g


def _first_stop(text: str, stops: tuple[str, ...], already: int) -> int | None:
    """Where the earliest stop string begins, looking only where new text could complete one."""
    best: int | None = None
    for stop in stops:
        at = text.find(stop, max(0, already - len(stop) + 1))
        if at != -1 and (best is None or at < best):
            best = at
    return best


def _stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for candidate in (
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
    ):
        if isinstance(candidate, int):
            ids.append(candidate)
        elif isinstance(candidate, list):
            ids.extend(candidate)
    end = tokenizer.convert_tokens_to_ids(TURN_END)
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.append(end)
    return sorted(set(ids))
