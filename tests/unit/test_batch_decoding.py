"""Rows decoding together (prefilled from stored prefixes, joining and leaving between steps)
get exactly the logits each sequence gets alone."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="decoding needs the train extra")

from shared.serving.batch import Batch  # noqa: E402
from shared.serving.kv_store import KVStore  # noqa: E402
from tests.support.tiny_model import tiny_llama_of  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def model() -> object:
    return tiny_llama_of(VOCAB).eval()


def alone(model: object, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]  # type: ignore[operator]


def check(model: object, batch: Batch) -> None:
    for row, sequence in enumerate(batch.sequences):
        assert torch.allclose(batch.logits[row], alone(model, sequence), atol=1e-4), row


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


@torch.no_grad()
def test_rows_that_join_leave_and_reuse_stored_prefixes_match_their_own_forward(
    model: object,
) -> None:
    rng = random.Random(1)
    store = KVStore()
    system = tokens(rng, 30)
    first, second = [*system, *tokens(rng, 5)], [*system, *tokens(rng, 9)]
    batch = Batch(model, pad_id=0, store=store)
    batch.add([first, second])
    assert batch.prefilled == len(first) + 9  # the second reused the first's system turn
    assert batch.reused == 1
    check(model, batch)
    for _ in range(3):
        batch.step(tokens(rng, len(batch)))
        check(model, batch)
    longer = tokens(rng, 60)  # wider than the batch: every row is padded further
    batch.add([longer])
    check(model, batch)
    batch.step(tokens(rng, 3))
    check(model, batch)
    batch.keep([0, 2])  # the second leaves
    check(model, batch)
    batch.step(tokens(rng, 2))
    check(model, batch)
    batch.keep([1])  # only the longest row is left: no column is padding for it
    assert batch.width == len(batch.sequences[0])
    batch.save(0)
    reply = batch.sequences[0]

    follow = Batch(model, pad_id=0, store=store)
    next_turn = [*reply, *tokens(rng, 7)]
    follow.add([next_turn])
    assert follow.prefilled == 7  # the stored conversation, then only the new turn
    check(model, follow)


@torch.no_grad()
def test_without_a_store_every_prompt_runs_whole(model: object) -> None:
    rng = random.Random(2)
    prompts = [tokens(rng, 20), tokens(rng, 20)]
    batch = Batch(model, pad_id=0)
    batch.add(prompts)
    batch.add([prompts[0]])
    assert batch.prefilled == 60 and batch.reused == 0
    check(model, batch)


def test_a_step_needs_one_token_per_row(model: object) -> None:
    batch = Batch(model, pad_id=0)
    with torch.no_grad():
        batch.add([[1, 2, 3]])
    with pytest.raises(ValueError, match="2 tokens for 1 rows"):
        batch.step([1, 2])
    with pytest.raises(ValueError, match="empty prompt"):
        batch.add([[]])


@torch.no_grad()
def test_rows_decoding_past_their_buffer_s_room_keep_their_keys_and_values(
    model: object,
) -> None:
    from shared.serving.batch import ROOM

    rng = random.Random(3)
    batch = Batch(model, pad_id=0)
    batch.add([tokens(rng, 12), tokens(rng, 5)])
    for _ in range(ROOM + 40):  # the buffers fill up and grow once
        batch.step(tokens(rng, 2))
    check(model, batch)


def test_a_new_batch_starts_on_the_models_device(model: object) -> None:
    """On a GPU the first rows' logits joined an empty CPU tensor and every rollout failed
    (`tests/gpu/test_grpo_cuda.py` runs the whole path there); the meta device shows where an
    empty batch's tensors live on a machine without one."""
    batch = Batch(model, pad_id=0, device="meta")
    assert batch.logits.device.type == "meta"
