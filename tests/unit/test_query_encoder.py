"""The distilled query encoder's weights: read as written, refused with a clear error
where they are absent, for another MiniLM, or not a student's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch
from transformers import BertConfig, BertModel

from shared.errors import ConfigError
from shared.routing import query_encoder


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=8,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
    )
    return BertModel(config).eval()


def test_a_student_is_the_named_layers_over_the_teacher_s_token_embeddings(
    tmp_path: Path,
) -> None:
    teacher = tiny_bert()
    student = query_encoder.student_of(teacher, [0, 3])
    assert len(student.encoder.layer) == 2 and len(teacher.encoder.layer) == 4
    assert not student.embeddings.word_embeddings.weight.requires_grad
    with torch.no_grad():
        for p in student.encoder.parameters():
            p.add_(0.5)  # "trained": its layers differ from the teacher's now
    path = tmp_path / "student.safetensors"
    query_encoder.save(student.state_dict(), [0, 3], "1.2.3", path)
    loaded = query_encoder.load(tiny_bert(), "1.2.3", path)
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.inference_mode():
        want = student(input_ids=ids).last_hidden_state
        got = loaded(input_ids=ids).last_hidden_state
    assert torch.allclose(got, want, atol=5e-3)  # stored in fp16
    assert query_encoder.digest(path) == query_encoder.digest(path)
    assert len(query_encoder.digest(path)) == 12


def test_weights_for_another_minilm_or_none_at_all_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "student.safetensors"
    with pytest.raises(ConfigError, match="missing"):
        query_encoder.load(tiny_bert(), "1.2.3", path)
    with pytest.raises(ConfigError, match="missing"):  # the embedder asks for it first
        query_encoder.digest(path)
    student = query_encoder.student_of(tiny_bert(), [0, 1])
    query_encoder.save(student.state_dict(), [0, 1], "1.2.3", path)
    with pytest.raises(ConfigError, match=re.escape("'1.2.3', but '2.0.0' is installed")):
        query_encoder.load(tiny_bert(), "2.0.0", path)


def test_weights_of_another_shape_are_not_taken_for_a_student(tmp_path: Path) -> None:
    path = tmp_path / "student.safetensors"
    state = {"encoder.layer.0.attention.self.query.weight": torch.zeros(8, 8)}
    state["something.else"] = torch.zeros(3)
    query_encoder.save(state, [0], "1.2.3", path)
    with pytest.raises(ConfigError, match="not a distilled query encoder"):
        query_encoder.load(tiny_bert(), "1.2.3", path)
