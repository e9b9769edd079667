"""The key/value store finds the longest stored prefix of a prompt, per namespace, within its
memory budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the store holds torch tensors (train extra)")

from shared.serving.kv_store import MIN_REUSE, KVStore  # noqa: E402


def kv_of(ids: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values whose every entry records its token and position: [1, 1, n, 2]."""
    rows = torch.tensor([[float(t), float(i)] for i, t in enumerate(ids)])[None, None]
    return [(rows + layer, -rows - layer) for layer in range(layers)]


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_longest_stored_prefix_is_found_and_sliced() -> None:
    store = KVStore()
    base = list(range(40))
    store.put(None, base, kv_of(base))
    store.put(None, [*base[:20], *range(100, 130)], kv_of([*base[:20], *range(100, 130)]))
    prompt = [*base[:30], 7, 7]
    n, kv = store.longest(None, prompt)
    assert n == 30 and kv is not None
    assert torch.equal(kv[1][0], kv_of(base)[1][0][:, :, :30])


def test_at_least_one_token_is_left_to_run() -> None:
    store = KVStore()
    ids = list(range(40))
    store.put(None, ids, kv_of(ids))
    n, kv = store.longest(None, ids)
    assert n == 39 and kv is not None and kv[0][0].shape[2] == 39


def test_short_matches_and_other_namespaces_are_not_reused() -> None:
    store = KVStore()
    ids = list(range(40))
    store.put("adapter-a", ids, kv_of(ids))
    assert store.longest(None, ids) == (0, None)
    assert store.longest("adapter-a", [*ids[: MIN_REUSE - 1], 999, 999]) == (0, None)
    store.drop("adapter-a")
    assert len(store) == 0 and store.used_bytes == 0


def test_a_sequence_that_extends_a_stored_one_replaces_it() -> None:
    store = KVStore()
    turn = list(range(30))
    store.put(None, turn, kv_of(turn))
    store.put(None, [*turn, 5, 6, 7], kv_of([*turn, 5, 6, 7]))
    assert len(store) == 1
    assert store.longest(None, [*turn, 5, 6, 7, 8])[0] == 33


def test_the_store_is_a_copy_of_what_it_was_given() -> None:
    store = KVStore()
    ids = list(range(20))
    kv = kv_of(ids)
    store.put(None, ids, kv)
    kv[0][0].zero_()
    _, got = store.longest(None, [*ids, 1])
    assert got is not None and got[0][0].abs().sum() > 0


def test_the_least_recently_used_leave_first_within_the_budget() -> None:
    one = sum(k.nbytes + v.nbytes for k, v in kv_of(list(range(20))))
    store = KVStore(budget_bytes=2 * one)
    a, b, c = ([t] * 20 for t in (1, 2, 3))
    store.put(None, a, kv_of(a))
    store.put(None, b, kv_of(b))
    store.longest(None, [*a, 0])  # a is used: b is now the oldest
    store.put(None, c, kv_of(c))
    assert store.used_bytes == 2 * one
    assert store.longest(None, [*b, 0]) == (0, None)
    assert store.longest(None, [*a, 0])[0] == 20
    assert store.longest(None, [*c, 0])[0] == 20


def test_a_budget_of_zero_stores_nothing() -> None:
    store = KVStore(budget_bytes=0)
    ids = list(range(40))
    store.put(None, ids, kv_of(ids))
    assert len(store) == 0


tokens = st.lists(st.integers(0, 3), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(stored=st.lists(tokens, max_size=6), prompt=tokens.filter(bool))
def test_longest_is_the_longest_common_prefix_leaving_one_token(
    stored: list[list[int]], prompt: list[int]
) -> None:
    store = KVStore()
    for ids in stored:
        store.put(None, ids, kv_of(ids))
    expected = max(
        (min(common(ids, prompt), len(prompt) - 1) for ids in stored if len(ids) >= MIN_REUSE),
        default=0,
    )
    n, kv = store.longest(None, prompt)
    if expected < MIN_REUSE:
        assert (n, kv) == (0, None)
        return
    assert n == expected and kv is not None
    # every position holds the prompt's own token at that position
    assert kv[0][0][0, 0, :, 0].tolist() == [float(t) for t in prompt[:n]]
    assert kv[0][0][0, 0, :, 1].tolist() == [float(i) for i in range(n)]
