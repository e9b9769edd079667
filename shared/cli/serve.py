"""`retrace serve-model`, the embedded OpenAI-compatible model server, and `retrace
model-gate`, its rules in front of vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import click

from shared.cli.context import load_settings
from shared.errors import ConfigError
from shared.logging import configure_logging
from shared.runtime.deadlines import BODY_TIMEOUT_S, IDLE_TIMEOUT_S
from shared.runtime.http import loopback
from shared.serving.packaged import DEFAULT_AGENT_MODEL

UNSET_KEY = "EMPTY"
"""What clients send when `RETRACE_MODEL_API_KEY` is unset (the OpenAI SDK's placeholder)."""


def _access_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options `serve-model` and `model-gate` share: who may call, what may be loaded,
    how long a client may take."""
    for option in reversed(_ACCESS_OPTIONS):
        command = option(command)
    return command


_ACCESS_OPTIONS = [
    click.option(
        "--api-key",
        envvar="RETRACE_MODEL_API_KEY",
        default=None,
        help="Bearer token every route but /healthz requires (the variable the services send it "
        "from; `retrace up` generates one). Unset: no key, for a port only you can reach.",
    ),
    click.option(
        "--admin-key",
        envvar="RETRACE_MODEL_ADMIN_KEY",
        default=None,
        help="Bearer token loading and unloading adapters requires instead of --api-key (the "
        "services send it from this variable; `retrace up` generates one). Unset: --api-key does.",
    ),
    click.option(
        "--api-key-file",
        envvar="RETRACE_MODEL_API_KEY_FILE",
        default=None,
        type=click.Path(dir_okay=False, path_type=Path),
        help="A file of keys accepted as --api-key is, one per line (# comments), read again "
        "when it changes or on SIGHUP: add the new key, move the callers, delete the old line "
        "(docs/serving.md, rotating keys).",
    ),
    click.option(
        "--admin-key-file",
        envvar="RETRACE_MODEL_ADMIN_KEY_FILE",
        default=None,
        type=click.Path(dir_okay=False, path_type=Path),
        help="A file of admin keys, as --api-key-file.",
    ),
    click.option(
        "--adapter-dir",
        "adapter_dirs",
        multiple=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="A directory adapters may be loaded from; repeat for more. Default: the artifact "
        "store (RETRACE_STORAGE_ARTIFACT_DIR, else <data dir>/artifacts). A path outside is "
        "refused (403), whether it exists or not.",
    ),
    click.option(
        "--idle-timeout",
        default=IDLE_TIMEOUT_S,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds a connection may hold no whole request (idle, or sending its headers) "
        "before it is closed.",
    ),
    click.option(
        "--body-timeout",
        default=BODY_TIMEOUT_S,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds a request body may take to arrive (408 after).",
    ),
]


@click.command("serve-model")
@click.option(
    "--model",
    default=DEFAULT_AGENT_MODEL,
    show_default=True,
    help="A packaged model (qwen2.5-coder-0.5b, smollm2: see docs/models.md), a Hugging Face "
    "id (org/name, through the hub's cache) or a local Hugging Face model directory.",
)
@click.option("--served-name", default=None, help="Name clients use in `model` (default: --model).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option(
    "--max-batch",
    default=32,
    type=click.IntRange(min=1),
    show_default=True,
    help="Sequences generated together.",
)
@click.option(
    "--batch-window-ms",
    default=10.0,
    type=click.FloatRange(0, 10_000),
    show_default=True,
    help="How long a batch waits for more requests before it starts.",
)
@click.option(
    "--kv-cache-mb",
    default=4096,
    show_default=True,
    type=click.IntRange(min=0),
    help="Memory for keys and values of recent prompts and replies, which later prompts that "
    "start the same way (an episode's next turn, the same system turn) reuse; 0 turns it off.",
)
@click.option(
    "--threads", default=None, type=int, help="torch CPU threads (default: torch's choice)."
)
@_access_options
def serve_model(
    model: str,
    served_name: str | None,
    host: str,
    port: int,
    max_batch: int,
    batch_window_ms: float,
    kv_cache_mb: int,
    threads: int | None,
    api_key: str | None,
    admin_key: str | None,
    api_key_file: Path | None,
    admin_key_file: Path | None,
    adapter_dirs: tuple[Path, ...],
    idle_timeout: float,
    body_timeout: float,
) -> None:
    """Serve a model over the OpenAI-compatible API (chat, tools, LoRA adapters), CPU or GPU."""
    try:
        from shared.serving.server import ServeConfig, serve
    except ImportError as exc:
        raise click.ClickException(
            f"serve-model needs the train extra: pip install -e '.[train]' ({exc})"
        ) from exc
    cfg = load_settings()
    configure_logging(cfg.log.level, cfg.log.format)
    api_key = _key_for(host, api_key, api_key_file)
    _check_key_files(api_key_file, admin_key_file)  # before minutes of model loading
    serve_cfg = ServeConfig(
        model=model,
        served_name=served_name,
        host=host,
        port=port,
        max_batch=max_batch,
        batch_window_ms=batch_window_ms,
        kv_cache_mb=kv_cache_mb,
        threads=threads,
        api_key=api_key,
        admin_key=admin_key or None,
        api_key_file=api_key_file,
        admin_key_file=admin_key_file,
        adapter_dirs=adapter_dirs or (cfg.storage.artifact_path,),
        idle_timeout_s=idle_timeout,
        body_timeout_s=body_timeout,
    )
    try:
        asyncio.run(serve(serve_cfg))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("model-gate")
@click.option(
    "--upstream",
    required=True,
    help="The engine's OpenAI base URL (vLLM: http://vllm:8000/v1). Keep the engine where only "
    "the gate reaches it: its own key guards its /v1 routes only.",
)
@click.option(
    "--upstream-key",
    envvar="RETRACE_MODEL_UPSTREAM_KEY",
    default=None,
    help="The engine's own key (vLLM's --api-key), which the gate alone holds.",
)
@click.option("--host", envvar="RETRACE_HTTP_HOST", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="RETRACE_HTTP_PORT", default=8000, show_default=True)
@_access_options
def model_gate(
    upstream: str,
    upstream_key: str | None,
    host: str,
    port: int,
    api_key: str | None,
    admin_key: str | None,
    api_key_file: Path | None,
    admin_key_file: Path | None,
    adapter_dirs: tuple[Path, ...],
    idle_timeout: float,
    body_timeout: float,
) -> None:
    """Serve the model server's API and rules in front of vLLM: the services' key on every
    route but health, the admin key to load and unload adapters, adapters from the artifact
    store only, and none of vLLM's other routes."""
    from shared.serving.gate import GateConfig, serve_gate

    if not upstream.startswith(("http://", "https://")):
        raise click.BadParameter("an http:// or https:// URL", param_hint="--upstream")
    cfg = load_settings()
    configure_logging(cfg.log.level, cfg.log.format)
    gate_cfg = GateConfig(
        upstream=upstream,
        upstream_key=upstream_key or None,
        host=host,
        port=port,
        api_key=_key_for(host, api_key, api_key_file),
        admin_key=admin_key or None,
        api_key_file=api_key_file,
        admin_key_file=admin_key_file,
        adapter_dirs=adapter_dirs or (cfg.storage.artifact_path,),
        idle_timeout_s=idle_timeout,
        body_timeout_s=body_timeout,
    )
    try:
        asyncio.run(serve_gate(gate_cfg))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _check_key_files(*files: Path | None) -> None:
    """A key file that cannot be used, as a usage error now (`shared.serving.keys`)."""
    from shared.serving.keys import KeyRing

    for file in files:
        if file is not None:
            try:
                KeyRing(None, file)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from exc


def _key_for(host: str, api_key: str | None, key_file: Path | None = None) -> str | None:
    """The key a model server on `host` requires besides its key file's; a server without
    either only on a loopback address."""
    keyed = bool(api_key) and api_key != UNSET_KEY
    if not keyed and key_file is None and not loopback(host):
        raise click.UsageError(
            f"refusing to serve on {host} without a key: whoever reaches that address could "
            "chat with every tenant's adapters and change them. Set --api-key "
            "(RETRACE_MODEL_API_KEY) or --api-key-file, or serve on 127.0.0.1."
        )
    return api_key if keyed else None
