"""The generation engine: one thread that owns the model and serves batches.

Requests that arrive within `batch_window` of each other (up to `max_batch` sequences, all on
the same adapter) are generated together (`Batch`): each prompt prefilled from the longest
prefix the engine's `KVStore` holds (an episode's earlier turn, its environment's system
turn, a sibling in its group), then one forward pass per step for the whole batch, each row
sampled with its own settings and stopped on its own. Rows that finish leave the batch (their
keys and values stored for the conversation's next turn); requests for the same adapter that
arrive meanwhile join it between steps, unless another adapter's requests are waiting.
Adapter loads and unloads run on the same thread between batches, so a batch never sees its
adapter change.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from shared.logging import get_logger
from shared.serving.batch import Batch
from shared.serving.constrain import State, Vocabulary
from shared.serving.kv_store import DEFAULT_BUDGET_BYTES, KVStore
from shared.serving.prompts import TURN_END
from shared.serving.sampling import SamplingParams, pick, pick_allowed

log = get_logger(__name__)


class AdapterUnloaded(LookupError):
    """A request's adapter was unloaded after the request was accepted (it is never answered
    with another model)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"model {name!r} was unloaded while the request waited")
        self.name = name


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


@dataclass
class _Row:
    request: Request
    index: int
    generator: torch.Generator
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_token: int | None = None
    done: bool = False
    grammar: State | None = None
    """Where the reply stands in the grammar it must follow (None: free text)."""


@dataclass
class EngineStats:
    batches: int = 0
    sequences: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    """Prompt tokens actually run through the model (the rest came from the prefix cache)."""
    prefix_hits: int = 0
    """Prompts that started from stored keys and values."""
    joined: int = 0
    """Sequences that joined a batch already decoding."""
    busy_seconds: float = 0.0


class Engine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 32,
        batch_window: float = 0.01,
        kv_budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        if max_batch < 1 or not 0 <= batch_window <= 10:
            raise ValueError(
                f"max_batch must be 1 or more and the batch window 0 to 10 s, not {max_batch} "
                f"and {batch_window} s"
            )
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
        self._vocabulary: Vocabulary | None = None
        """The tokens as text, for the grammars of constrained replies (built on first use)."""
        self.kv = KVStore(kv_budget_bytes)
        """Keys and values of recent prompts and replies, per adapter (None: the base)."""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the generation thread runs (a health check asks: requests hang without)."""
        return self._running and self._thread is not None and self._thread.is_alive()

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
    ) -> list[Output]:
        """Generate n continuations of `prompt_ids` (at least one token)."""
        if not prompt_ids:
            raise ValueError("an empty prompt has nothing to continue")
        loop = asyncio.get_running_loop()
        request = Request(
            prompt_ids, adapter, params, n, loop, loop.create_future(), on_delta, [None] * n
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
            if batch:
                self._serve(batch)

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

    def _next_batch(self) -> list[Request] | None:
        """The next batch: the oldest request and those for the same adapter, up to
        `max_batch` rows (None: stop)."""
        with self._wake:
            while self._running and not self._pending and self._commands.empty():
                self._wake.wait()
            if not self._running:
                return None
            if not self._pending:
                return []
        time.sleep(self.batch_window)  # let requests sent together arrive together
        with self._wake:
            self._pending = deque(r for r in self._pending if not r.future.done())
            if not self._pending:
                return []
            return self._take(self._pending[0].adapter, 0)

    def _joiners(self, adapter: str | None, size: int) -> list[Request]:
        """Waiting requests for `adapter` that may join a batch of `size` rows now: none while
        a command or another adapter's request waits (the batch drains, then they go)."""
        with self._wake:
            if not self._pending or not self._commands.empty():
                return []
            if any(r.adapter != adapter for r in self._pending):
                return []
            return self._take(adapter, size)

    def _take(self, adapter: str | None, size: int) -> list[Request]:
        """Pending live requests for `adapter`, oldest first, while the batch (holding `size`
        rows) stays within `max_batch` rows; the first always, when the batch is empty."""
        batch: list[Request] = []
        for request in list(self._pending):
            if request.future.done():
                self._pending.remove(request)
                continue
            if request.adapter != adapter:
                continue
            if size + request.n > self.max_batch and (batch or size):
                break
            batch.append(request)
            size += request.n
            self._pending.remove(request)
        return batch

    def _serve(self, batch: list[Request]) -> None:
        started = time.perf_counter()
        # Counted before its rows are answered, so a caller that got its answer sees it.
        self.stats.batches += 1
        try:
            with self._adapter(batch[0].adapter):
                self._generate(batch)
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
                raise AdapterUnloaded(name)
            yield
        elif name is None:
            with self.model.disable_adapter():
                yield
        else:
            if name not in self.adapters:
                # Unloaded after the request was accepted: never answer it with another model.
                raise AdapterUnloaded(name)
            self.model.set_adapter(name)
            yield

    def _generate(self, batch: list[Request]) -> None:
        adapter = batch[0].adapter
        decoding = Batch(self.model, self._pad_id, self.kv, adapter, self.model.device)
        rows: list[_Row] = []  # rows[k] is the batch's row k
        self._join(decoding, rows, batch)
        while rows:
            next_ids = []
            for k, row in enumerate(rows):
                if row.request.future.done():
                    # The caller went away (client disconnected, timed out): stop generating.
                    row.done = True
                    next_ids.append(self._pad_id)
                    continue
                token = self._choose(row, decoding.logits[k])
                self._append(row, token, decoding.logits[k])
                next_ids.append(token)
            keep = [k for k, row in enumerate(rows) if not row.done]
            if len(keep) < len(rows):
                for k, row in enumerate(rows):
                    if row.done:
                        decoding.save(k)  # the conversation's next turn starts from here
                decoding.keep(keep)
                rows = [rows[k] for k in keep]
                next_ids = [next_ids[k] for k in keep]
            if rows:
                decoding.step(next_ids)
            joining = self._joiners(adapter, len(rows))
            if joining:
                if rows:
                    self.stats.joined += sum(r.n for r in joining)
                else:  # the batch had drained: these start the next one
                    self.stats.batches += 1
                self._join(decoding, rows, joining)

    def _choose(self, row: _Row, logits: torch.Tensor) -> int:
        params = row.request.params
        if row.grammar is None:
            return pick(logits, params, row.generator)
        if self._vocabulary is None:
            started = time.perf_counter()
            self._vocabulary = Vocabulary(self.tokenizer)
            log.info(
                "vocabulary indexed for constrained replies",
                seconds=round(time.perf_counter() - started, 2),
            )
        texts, state, vocabulary = self._vocabulary.texts, row.grammar, self._vocabulary
        token = pick_allowed(
            logits,
            params,
            row.generator,
            lambda t: t < len(texts) and state.accepts(texts[t]),
            lambda: vocabulary.candidates(state),
        )
        if token is None:  # nothing can follow: the grammar is broken, not the model
            raise RuntimeError("no token continues the reply's grammar")
        row.grammar = state.fed(texts[token])
        return token

    def _join(self, decoding: Batch, rows: list[_Row], requests: list[Request]) -> None:
        """Prefill `requests` into `decoding` as new rows (one per sample)."""
        new = [
            _Row(
                r,
                i,
                _generator(r.params.seed, i, self._rng),
                r.prompt_ids,
                grammar=r.params.grammar.start() if r.params.grammar else None,
            )
            for r in requests
            for i in range(r.n)
        ]
        before = (decoding.prefilled, decoding.reused)
        decoding.add([row.prompt_ids for row in new])
        rows += new
        self.stats.sequences += len(new)
        self.stats.prompt_tokens += sum(len(row.prompt_ids) for row in new)
        self.stats.prefilled_tokens += decoding.prefilled - before[0]
        self.stats.prefix_hits += decoding.reused - before[1]

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
            if finish is None and row.grammar is not None and row.grammar.complete:
                finish = "stop"  # the reply its grammar allows is whole
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
