"""Who may call a model server, and what it may load: the rules `retrace serve-model` and
`retrace model-gate` (in front of vLLM) both hold. One model server serves every tenant's
adapters, so it is retrace's own service: its key is the services', a separate admin key
changes what is loaded, and adapters load from the artifact store only (issue 14). Both keys
can also be listed in key files, re-read when they change, to rotate a key without a restart
(`shared.serving.keys`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from aiohttp import web

from shared.llm.errors_http import bearer_token, openai_error
from shared.serving.keys import MIN_KEY_LENGTH, KeyRing

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_PATHS = frozenset({"/healthz", "/health", "/openapi.json"})
"""What a model server answers without its key: whether it is up."""
ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
"""What changes the adapters every caller is served: the admin key's, when there is one."""
KEY_RELOAD_INTERVAL_S = 2.0
"""How often a server looks whether its key files changed (SIGHUP: at once)."""


class OutsideStore(Exception):
    """An adapter path outside the directories adapters may load from."""

    message = "adapters load only from this server's adapter directories (the artifact store)"


class ModelAccess:
    def __init__(
        self,
        api_key: str | None = None,
        admin_key: str | None = None,
        adapter_dirs: Sequence[Path] | None = None,
        *,
        api_key_file: Path | None = None,
        admin_key_file: Path | None = None,
    ) -> None:
        self.api_keys = KeyRing(api_key, api_key_file, kind="api key")
        """Every route but health needs `Authorization: Bearer <key>` with one of these
        (none: open). `KeyFileError` here for a key file that cannot be used."""
        self.admin_keys = KeyRing(admin_key, admin_key_file, kind="admin key")
        """When any is set, loading and unloading adapters need one of these instead of an
        api key: a caller that only chats cannot change what every tenant is served."""
        self.adapter_dirs = (
            tuple(Path(d).resolve() for d in adapter_dirs) if adapter_dirs is not None else None
        )
        """The directories adapters load from (the artifact store); a path outside them is
        refused whether it exists or not. None: any path (a server in a test's process)."""

    def reload(self) -> bool:
        """Re-read the key files that changed (blocking file reads: call it in a thread);
        whether any key changed."""
        return self.api_keys.reload() | self.admin_keys.reload()

    async def watching_keys(self, app: web.Application) -> AsyncIterator[None]:
        """An aiohttp cleanup context: `keep_keys_current` while the server runs."""
        task = asyncio.create_task(keep_keys_current(self))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @web.middleware
    async def authorized(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The server's key on every route but health: without it, anyone who reached the
        port could chat with any tenant's adapter, list them with their paths, load any path
        or unload every adapter (issue 14)."""
        if request.path in OPEN_PATHS:
            return await handler(request)
        if self.admin_keys.required and request.path in ADMIN_PATHS:
            if not self.admin_keys.accepts(bearer_token(request)):
                return openai_error(
                    401 if not request.headers.get("Authorization") else 403,
                    "loading and unloading adapters needs this model server's admin key",
                    "permission_error",
                )
            return await handler(request)
        if self.api_keys.required and not self.api_keys.accepts(bearer_token(request)):
            return openai_error(401, "this model server needs its key as a bearer token")
        return await handler(request)

    async def adapter_path(self, given: str) -> Path:
        """`given` with its links resolved, when it lies beneath an adapter directory;
        `OutsideStore` otherwise, with the same answer whether or not the path exists, so
        the server tells nothing of its files outside the store."""
        path = Path(given)
        if self.adapter_dirs is None:
            return path
        return await asyncio.to_thread(_in_store, path, self.adapter_dirs)


def _in_store(path: Path, dirs: tuple[Path, ...]) -> Path:
    """`path` resolved, when it and every file beneath it (links resolved: an adapter's
    weights linked to any file the server may read are outside the store too) lie beneath
    one of `dirs`; `OutsideStore` otherwise. The path itself is checked before anything
    beneath it is looked at: walking first told by its time what lies outside the store (8 s
    for a virtualenv, none for a missing path), and `/` had a thread walk the whole disk.
    A store directory itself is not an adapter."""

    def beneath(p: Path) -> bool:
        return any(p != d and p.is_relative_to(d) for d in dirs)

    try:
        path = path.resolve()
        if not beneath(path):  # resolved: absolute
            raise OutsideStore(OutsideStore.message)
        # a symlink loop is a RuntimeError in Python 3.11's resolve, an OSError later
        if path.is_dir() and not all(beneath(p.resolve()) for p in path.rglob("*")):
            raise OutsideStore(OutsideStore.message)
    except (ValueError, OSError, RuntimeError):  # a NUL byte; a link loop
        raise OutsideStore(OutsideStore.message) from None
    return path


def weaknesses(access: ModelAccess) -> list[str]:
    """What a model server under these rules leaves open to whoever reaches its port, as its
    start warns of it: no key, no admin key, adapters from any path."""
    said = []
    if not access.api_keys.required:
        changes = "" if access.admin_keys.required else ", loads and unloads"
        said.append(
            f"no key: whoever reaches the port chats with, lists{changes} every tenant's "
            "adapters (set RETRACE_MODEL_API_KEY)"
        )
    elif not access.admin_keys.required:
        said.append(
            "no admin key: every caller with the service key also loads and unloads adapters, "
            "changing what every tenant is served (set RETRACE_MODEL_ADMIN_KEY)"
        )
    short = [
        ring.kind
        for ring in (access.api_keys, access.admin_keys)
        if any(len(k) < MIN_KEY_LENGTH for k in ring.accepted())
    ]
    if short:
        said.append(
            f"{' and '.join(short)} of fewer than {MIN_KEY_LENGTH} characters: easily guessed "
            "(`retrace up` generates long ones)"
        )
    if access.admin_keys.accepted() & access.api_keys.accepted():
        said.append(
            "the admin key is also a service key: every caller that chats also loads and "
            "unloads adapters (give RETRACE_MODEL_ADMIN_KEY a key of its own)"
        )
    if access.adapter_dirs is None:
        said.append("adapters load from any path this server can read (give --adapter-dir)")
    return said


async def keep_keys_current(access: ModelAccess, interval_s: float = KEY_RELOAD_INTERVAL_S) -> None:
    """Re-read `access`'s key files when they change (looked at every `interval_s`, and at
    once on SIGHUP) until cancelled; nothing to do without a key file."""
    if access.api_keys.file is None and access.admin_keys.file is None:
        return
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, wake.set)
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), interval_s)
            wake.clear()
            await asyncio.to_thread(access.reload)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
