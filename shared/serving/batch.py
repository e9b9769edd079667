"""Sequences decoding together on one model, one forward pass per step for all of them.

Each prompt is prefilled on its own, from the longest prefix a `KVStore` holds: on a CPU
prefill costs the same per token at any batch size (docs/benchmarks.md, forward_cpu), so
running prompts one by one wastes nothing, while padding them to a common width would run
the padding too. Decoding is where batching pays (more rows per step for nearly the same
cost), so the rows' keys and values are then laid side by side, left-padded to one width
(the mask hides the padding, positions skip it). Rows may join between steps and leave when
done; a row that leaves can be stored, so the next turn of its conversation starts where it
ended. Each layer's keys and values sit in a buffer with room to grow, so a step writes its
token in place: transformers' `DynamicCache` concatenates, copying a batch of long
conversations whole at every step, which on a CPU cost more than the step's own compute.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from shared.serving.kv_store import KV, KVStore


class Batch:
    def __init__(
        self,
        model: Any,
        pad_id: int,
        store: KVStore | None = None,
        namespace: str | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        self.store = store
        self.namespace = namespace
        self.device = torch.device(device)
        self.sequences: list[list[int]] = []
        """Per row, the tokens its keys and values hold (prompt, then those fed since)."""
        self.logits = torch.empty(0, device=self.device)
        """Per row, the logits of its next token."""
        self.prefilled = 0
        """Prompt tokens run through the model (the rest came from the store)."""
        self.reused = 0
        """Prompts that started from a stored prefix."""
        self._cache: _RoomyCache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self._positions = torch.zeros((0, 1), dtype=torch.long, device=self.device)

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def width(self) -> int:
        return self._mask.shape[1]

    def add(self, prompts: list[list[int]]) -> None:
        """Prefill `prompts` (each at least one token) and add them as rows at the end."""
        rows: list[KV] = []
        logits = []
        for prompt in prompts:
            kv, last = self._prefill(prompt)
            rows.append(kv)
            logits.append(last)
        width = max(self.width, *(len(p) for p in prompts))
        layers = []
        for layer, (keys, values) in enumerate(self._layers() or [(None, None)] * len(rows[0])):
            ks = [] if keys is None else [_left_pad(keys, width)]
            vs = [] if values is None else [_left_pad(values, width)]
            ks += [_left_pad(kv[layer][0], width) for kv in rows]
            vs += [_left_pad(kv[layer][1], width) for kv in rows]
            layers.append((torch.cat(ks), torch.cat(vs)))
        self._cache = _RoomyCache(layers)
        fresh = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device
        )
        self._mask = torch.cat([F.pad(self._mask, (width - self.width, 0)), fresh])
        lengths = torch.tensor([[len(p) - 1] for p in prompts], device=self.device)
        self._positions = torch.cat([self._positions, lengths])
        self.logits = torch.cat([self.logits.reshape(-1, logits[0].shape[-1]), *logits])
        self.sequences += [list(p) for p in prompts]

    def step(self, tokens: list[int]) -> None:
        """Feed one token per row; `logits` become those of the token after it."""
        if len(tokens) != len(self):
            raise ValueError(f"{len(tokens)} tokens for {len(self)} rows")
        self._mask = torch.cat(
            [self._mask, torch.ones((len(self), 1), dtype=self._mask.dtype, device=self.device)],
            dim=1,
        )
        self._positions = self._positions + 1
        out = self.model(
            input_ids=torch.tensor(tokens, device=self.device)[:, None],
            attention_mask=self._mask,
            position_ids=self._positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        self.logits = out.logits[:, -1, :]
        for sequence, token in zip(self.sequences, tokens, strict=True):
            sequence.append(token)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current rows, in order); columns that are
        padding for every row left are cut."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask = self._mask[index]
        lead = int((mask.cumsum(1) == 0).sum(1).min()) if len(rows) else mask.shape[1]
        self._mask = mask[:, lead:]
        self._positions = self._positions[index]
        self._cache = _RoomyCache(
            [(k[index, :, lead:], v[index, :, lead:]) for k, v in self._layers()]
        )
        self.logits = self.logits[index]
        self.sequences = [self.sequences[r] for r in rows]

    def save(self, row: int) -> None:
        """Store row `row`'s keys and values (its prompt and every token fed since)."""
        if self.store is None:
            return
        n = len(self.sequences[row])
        kv = [(k[row : row + 1, :, -n:], v[row : row + 1, :, -n:]) for k, v in self._layers()]
        self.store.put(self.namespace, self.sequences[row], kv)

    def _prefill(self, prompt: list[int]) -> tuple[KV, torch.Tensor]:
        if not prompt:
            raise ValueError("an empty prompt has nothing to continue")
        start, past = (
            (0, None) if self.store is None else self.store.longest(self.namespace, prompt)
        )
        self.reused += past is not None
        self.prefilled += len(prompt) - start
        out = self.model(
            input_ids=torch.tensor([prompt[start:]], device=self.device),
            past_key_values=DynamicCache(ddp_cache_data=past) if past is not None else None,
            use_cache=True,
            logits_to_keep=1,  # the vocabulary projection of every prompt token is waste
        )
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        if self.store is not None:  # the next prompt of its group may start the same way
            self.store.put(self.namespace, prompt, kv)
        return kv, out.logits[:, -1, :]

    def _layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._cache is None:
            return []
        return [layer.contents() for layer in self._cache.roomy]


ROOM = 256
"""Tokens of room a layer's buffer gets past its contents (and again when it fills up)."""


class _RoomyLayer(DynamicLayer):
    """A cache layer whose keys and values are views of a buffer with room to spare: a step
    writes its token in place; only a full buffer is copied (into one with `ROOM` more)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._length = 0
        self._k = keys.new_empty((*keys.shape[:2], 0, keys.shape[-1]))
        self._v = values.new_empty((*values.shape[:2], 0, values.shape[-1]))
        self.update(keys, values)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._k = _grown(self._k, self._length, end + ROOM)
            self._v = _grown(self._v, self._length, end + ROOM)
        self._k[:, :, self._length : end] = key_states
        self._v[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = self.contents()
        return self.keys, self.values

    def contents(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k[:, :, : self._length], self._v[:, :, : self._length]


class _RoomyCache(DynamicCache):
    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.roomy = [_RoomyLayer(k, v) for k, v in layers]
        Cache.__init__(self, layers=list(self.roomy))


def _grown(buffer: torch.Tensor, length: int, size: int) -> torch.Tensor:
    """A buffer of `size` tokens holding the first `length` of `buffer`."""
    bigger = buffer.new_empty((*buffer.shape[:2], size, buffer.shape[-1]))
    bigger[:, :, :length] = buffer[:, :, :length]
    return bigger


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, heads, tokens, dim] padded with zeros on the left to `width` tokens."""
    return F.pad(t, (0, 0, width - t.shape[2], 0))
