"""`retrace serve-model`: load a model, start the engine, serve the API until SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path

import torch
from aiohttp import web

from shared.logging import get_logger
from shared.runtime.deadlines import BODY_TIMEOUT_S, IDLE_TIMEOUT_S
from shared.runtime.http import listen
from shared.serving.access import weaknesses
from shared.serving.api import ModelServer
from shared.serving.engine import Engine
from shared.serving.model_files import DEFAULT_CACHE, resolve_model
from shared.serving.packaged import DEFAULT_AGENT_MODEL
from shared.serving.prompts import PromptBuilder

log = get_logger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    model: str = DEFAULT_AGENT_MODEL
    served_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32
    batch_window_ms: float = 10.0
    kv_cache_mb: int = 4096
    threads: int | None = None
    cache_dir: Path = DEFAULT_CACHE
    api_key: str | None = None
    """Required as a bearer token on every route but health (None: open to whoever reaches
    the port; keep it on 127.0.0.1 then)."""
    admin_key: str | None = None
    """Required instead of `api_key` to load and unload adapters (None: `api_key` does)."""
    api_key_file: Path | None = None
    """More keys accepted as `api_key` is, one per line, re-read when the file changes
    (`shared.serving.keys`: a key rotated without a restart)."""
    admin_key_file: Path | None = None
    """More admin keys, as `api_key_file`."""
    adapter_dirs: tuple[Path, ...] = ()
    """Where adapters may be loaded from (the artifact store); empty: anywhere."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    """A connection without a whole request for this long is closed."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """A request body must arrive within this (408 after)."""


def load(cfg: ServeConfig) -> tuple[ModelServer, Engine]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    path = resolve_model(cfg.model, cfg.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = Engine(
        model,
        tokenizer,
        max_batch=cfg.max_batch,
        batch_window=cfg.batch_window_ms / 1000,
        kv_budget_bytes=cfg.kv_cache_mb << 20,
    )
    name = cfg.served_name or cfg.model
    context = int(getattr(model.config, "max_position_embeddings", 2048))
    server = ModelServer(
        engine,
        PromptBuilder(tokenizer),
        name,
        context,
        api_key=cfg.api_key,
        body_timeout_s=cfg.body_timeout_s,
        admin_key=cfg.admin_key,
        adapter_dirs=cfg.adapter_dirs or None,
        api_key_file=cfg.api_key_file,
        admin_key_file=cfg.admin_key_file,
    )
    return server, engine


async def start_server(server: ModelServer, cfg: ServeConfig) -> web.AppRunner:
    """`server` listening on `cfg.host:cfg.port`, as `retrace serve-model` runs it: a handler
    whose caller has gone is cancelled, and with it the generation it waits for (the engine
    drops a row whose caller went away at its next step) instead of finishing a reply
    nobody reads."""
    return await listen(
        server.app(),
        cfg.host,
        cfg.port,
        idle_timeout_s=cfg.idle_timeout_s,
        cancel_on_disconnect=True,
    )


async def serve(cfg: ServeConfig) -> None:
    server, engine = await asyncio.to_thread(load, cfg)
    engine.start()
    runner = await start_server(server, cfg)
    log.info(
        "model server ready",
        model=server.served_name,
        host=cfg.host,
        port=cfg.port,
        max_batch=cfg.max_batch,
        api_keys=len(server.access.api_keys),
        admin_keys=len(server.access.admin_keys),
        key_files=[str(f) for f in (cfg.api_key_file, cfg.admin_key_file) if f is not None],
        adapter_dirs=[str(d) for d in cfg.adapter_dirs] or "anywhere",
    )
    for weakness in weaknesses(server.access):
        log.warning(f"model server open: {weakness}", host=cfg.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("model server stopping")
    await runner.cleanup()
    await asyncio.to_thread(engine.stop)
