"""A smaller encoder for routing's queries, distilled from all-MiniLM-L6-v2.

MiniLM's own token embeddings and `layers` of its six transformer layers, trained on the
text of installed packages and of public request datasets to give MiniLM's mean-pooled
vectors (`benchmarks/distill_query_encoder.py`, docs/benchmarks.md). Routing embeds a new
conversation's request with it where the static vectors are not sure, against MiniLM's own
vectors of the adapters' profiles (the `cascade-distilled` embedder): a third of the
layers, a third of the time a query costs on the event loop's machine.

Only the trained layers ship (`WEIGHTS`, fp16); the token embeddings are the installed
MiniLM's, so the weights name the MiniLM package version they were trained against."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from shared.errors import ConfigError

WEIGHTS = Path(__file__).with_name("distilled-query-encoder.safetensors")


def student_of(encoder: Any, layers: list[int]) -> Any:
    """A copy of `encoder` (MiniLM's BertModel) with only `layers` of its encoder, its token
    embeddings frozen (the student's are always MiniLM's)."""
    import copy

    import torch

    student = copy.deepcopy(encoder)
    student.encoder.layer = torch.nn.ModuleList([student.encoder.layer[i] for i in layers])
    student.config.num_hidden_layers = len(layers)
    student.embeddings.word_embeddings.weight.requires_grad_(False)
    return student


def with_weights(encoder: Any, state: dict[str, Any], layers: list[int], source: str) -> Any:
    """The student of `encoder` with `state` (every weight but the token embeddings)."""
    student = student_of(encoder, layers).eval()
    missing, unexpected = student.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False
    )
    if unexpected or any("word_embeddings" not in k for k in missing):
        raise ConfigError(
            f"{source}: not a distilled query encoder's weights "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return student


def load(encoder: Any, teacher_version: str, path: Path = WEIGHTS) -> Any:
    """The shipped student over `encoder`; a clear error where the weights are absent or
    were trained against another MiniLM than the one installed."""
    from safetensors import safe_open

    with safe_open(str(_present(path)), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  safe_open has no iterator
    if meta.get("teacher_version") != teacher_version:
        raise ConfigError(
            f"{path} was distilled from all-MiniLM-L6-v2 {meta.get('teacher_version')!r}, "
            f"but {teacher_version!r} is installed: use the `cascade-int8` embedder"
        )
    layers = [int(x) for x in meta["layers"].split(",")]
    return with_weights(encoder, state, layers, str(path))


def digest(path: Path = WEIGHTS) -> str:
    """A short name for the weights' contents (the ONNX graph made of them is kept under it)."""
    return hashlib.sha256(_present(path).read_bytes()).hexdigest()[:12]


def _present(path: Path) -> Path:
    """`path`, or a clear error where the weights are not installed (the embedder names its
    graph by their digest before it loads them)."""
    if not path.exists():
        raise ConfigError(f"the distilled query encoder's weights are missing: {path}")
    return path


def save(state: dict[str, Any], layers: list[int], teacher_version: str, path: Path) -> None:
    """Write a student's weights (token embeddings left out) as `load` reads them, in fp16."""
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().half().contiguous() for k, v in state.items() if "word_embeddings" not in k},
        str(path),
        metadata={"layers": ",".join(map(str, layers)), "teacher_version": teacher_version},
    )
