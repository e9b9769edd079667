"""Routing's MiniLM graph with ONNX Runtime's BERT fusions, and its way back when the
exported graph has not the pattern they know (the real fused graph: tests/model)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared import embeddings
from shared.logging import configure_logging

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")


def _no_attention(path: Path) -> None:
    """A graph that is a single matrix product: nothing the fusions recognise."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_graph_the_fusions_do_not_recognise_is_kept_as_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "json")
    source, target = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    _no_attention(source)
    exported = source.read_bytes()
    config = SimpleNamespace(num_attention_heads=12, hidden_size=384, num_hidden_layers=6)
    embeddings._fuse(source, target, config)
    assert target.read_bytes() == exported  # the same graph: the same vectors
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    [warning] = [line for line in lines if "not fused" in line["event"]]
    assert warning["attention_fused"] == 0 and warning["layers"] == 6


def test_quantising_writes_nothing_beside_the_cached_graph(tmp_path: Path) -> None:
    # ONNX Runtime writes a shape-inferred copy of its input beside the input under a fixed
    # name and deletes it: two workers quantising one cached graph read and deleted each
    # other's (CI, session 34). Another process's copy stands there for the whole call here.
    graph = tmp_path / "minilm.onnx"
    _no_attention(graph)
    (tmp_path / "minilm-inferred.onnx").mkdir()
    small = embeddings._quantized(graph)
    assert small == tmp_path / "minilm.int8-per-channel.onnx"
    onnx.checker.check_model(onnx.load(str(small)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "minilm-inferred.onnx",
        "minilm.int8-per-channel.onnx",
        "minilm.onnx",
    ]
