"""Keys and values of recently run token sequences, so a prompt that starts like one of them
is prefilled from where they part, not from its first token.

An agent's episode sends the whole conversation every turn: turn k's prompt is turn k-1's
prompt, its reply and the tool's answer. Every episode of an environment also opens with the
same system turn (instructions and tools), and a GRPO group sends one task several times. On a
CPU, prefill runs at about 100 tokens/s whatever the batch (docs/benchmarks.md, forward_cpu),
so these shared starts, not the replies, were where the time went.

Entries live per namespace (the adapter: other weights, other keys and values), are found by
longest common prefix, and leave least recently used first once `budget_bytes` is spent.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values of one sequence: [1, heads, tokens, head_dim] each."""
MIN_REUSE = 16
"""Shorter common prefixes are run again rather than looked up."""
DEFAULT_BUDGET_BYTES = 2 << 30


@dataclass
class _Entry:
    ids: torch.Tensor
    kv: KV
    nbytes: int


class KVStore:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[tuple[str | None, int], _Entry] = OrderedDict()
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, namespace: str | None, ids: list[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of `ids` in `namespace` that leaves at least one token
        of `ids` to run (the next token's logits come from it): its length and keys and
        values, or (0, None) below `MIN_REUSE`."""
        want = torch.tensor(ids, dtype=torch.long)
        best, found = 0, None
        for key, entry in self._entries.items():
            if key[0] != namespace:
                continue
            n = min(len(entry.ids), len(ids) - 1)
            if n <= best:
                continue
            differs = (entry.ids[:n] != want[:n]).nonzero()
            common = int(differs[0]) if len(differs) else n
            if common > best:
                best, found = common, key
        if found is None or best < MIN_REUSE:
            return 0, None
        self._entries.move_to_end(found)
        kv = self._entries[found].kv
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def put(self, namespace: str | None, ids: list[int], kv: KV) -> None:
        """Keep the keys and values of `ids` (copied: the caller's tensors may be a view of a
        larger batch). Stored sequences that `ids` extends are dropped: it covers them."""
        if len(ids) < MIN_REUSE or self.budget_bytes <= 0:
            return
        seq = torch.tensor(ids, dtype=torch.long)
        for key in [k for k, e in self._entries.items() if k[0] == namespace]:
            old = self._entries[key].ids
            if len(old) <= len(seq) and torch.equal(old, seq[: len(old)]):
                self._drop(key)
        own = [(k[:, :, : len(ids)].clone(), v[:, :, : len(ids)].clone()) for k, v in kv]
        nbytes = sum(k.nbytes + v.nbytes for k, v in own)
        if nbytes > self.budget_bytes:
            return
        self._entries[(namespace, self._next)] = _Entry(seq, own, nbytes)
        self._next += 1
        self.used_bytes += nbytes
        while self.used_bytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def drop(self, namespace: str | None) -> None:
        """Forget `namespace` (its adapter was loaded again or unloaded)."""
        for key in [k for k in self._entries if k[0] == namespace]:
            self._drop(key)

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0

    def _drop(self, key: tuple[str | None, int]) -> None:
        self.used_bytes -= self._entries.pop(key).nbytes
