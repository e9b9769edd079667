"""The control API as the CLI's tenant-level commands reach it (agents, cycles): one code
path for a tenant's actions, whoever acts. Where it is: `RETRACE_API_URL`, else the running
`retrace up`'s. Who acts: `RETRACE_API_KEY` (a tenant's key: its tenant, whatever `--tenant`
says), else the operator's key (`RETRACE_API_ADMIN_KEY`, or the one `retrace up` made and
keeps in `<data dir>/run/admin.key`) acting for `--tenant`."""

from __future__ import annotations

import secrets
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import click
import msgspec
from click.core import ParameterSource

from shared.cli.context import read_state
from shared.config import ServiceConfig, load_config
from shared.errors import UNDECODABLE, ConfigError
from shared.runtime.files import write_private
from shared.runtime.http import ACTING_FOR
from shared.store.tenants import KEY_PREFIX


class ClientSettings(msgspec.Struct, kw_only=True, frozen=True):
    """`RETRACE_API_URL`, `RETRACE_API_KEY`, `RETRACE_API_ADMIN_KEY`."""

    url: str | None = None
    key: str | None = None
    admin_key: str | None = None


class ApiError(click.ClickException):
    """The API refused the request: its status and its own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ApiUnavailable(ApiError):
    """Out of reach, or answering 503: worth trying again."""


def admin_key_path(cfg: ServiceConfig) -> Path:
    return cfg.storage.data_path / "run" / "admin.key"


def make_admin_key(cfg: ServiceConfig) -> str:
    """The operator's key for a `retrace up` with none configured: written for the CLI to
    read (owner-only), removed when `up` stops."""
    key = "rt_admin_" + secrets.token_urlsafe(32)
    write_private(admin_key_path(cfg), key)  # never an old file's mode, nor a link's target
    return key


class ControlApi:
    """An HTTP session with the control API, as one tenant (an async context manager)."""

    def __init__(
        self, url: str, headers: dict[str, str], tenant: str = "", timeout_s: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = headers
        self.tenant = tenant
        """Whom the requests act for (as far as the key tells)."""
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None

    @classmethod
    def connect(cls, cfg: ServiceConfig, tenant: str, *, explicit: bool = True) -> ControlApi:
        """The API this deployment runs, with the credentials the environment gives. With a
        tenant's key, `tenant` given `explicit`ly (not by default) must be the key's."""
        try:
            settings = load_config(ClientSettings, service="api")
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        url = settings.url
        running = False
        if url is None:
            state = read_state(cfg)
            if state is not None and "api" in state.services:
                url = f"http://{state.host}:{state.services['api']}"
                running = True
        if url is None:
            raise click.ClickException(
                "the control API is not running: start retrace with `retrace up` (or set "
                "RETRACE_API_URL to a running one)"
            )
        if settings.key:
            owner = key_tenant(settings.key)
            if explicit and owner is not None and owner != tenant:
                raise click.ClickException(
                    f"RETRACE_API_KEY is tenant {owner!r}'s, not {tenant!r}'s: a key acts only "
                    "for its own tenant (drop --tenant, or use that tenant's key)"
                )
            return cls(url, {"Authorization": f"Bearer {settings.key}"}, owner or tenant)
        admin = settings.admin_key
        if admin is None and running and admin_key_path(cfg).exists():
            # the running `retrace up`'s own key (never a file a stopped one left behind)
            admin = admin_key_path(cfg).read_text().strip()
        if not admin:
            raise click.ClickException(
                f"no key for the control API at {url}: set RETRACE_API_KEY (a tenant's key) "
                "or RETRACE_API_ADMIN_KEY (the operator's)"
            )
        return cls(url, {"Authorization": f"Bearer {admin}", ACTING_FOR: tenant}, tenant)

    async def __aenter__(self) -> ControlApi:
        self._http = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.close()

    async def call(self, method: str, path: str, body: object = None) -> Any:
        """The decoded JSON answer; an error answer raises ApiError with the API's message."""
        assert self._http is not None, "use ControlApi as `async with`"
        try:
            async with self._http.request(method, self.url + path, json=body) as r:
                raw = await r.read()
                status = r.status
        except TimeoutError as exc:
            raise ApiUnavailable(
                0,
                f"the control API at {self.url} did not answer {method} {path} within "
                f"{self.timeout.total:.0f} s (it may still have acted: look before repeating)",
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            raise ApiUnavailable(
                0,
                f"cannot reach the control API at {self.url} ({exc or type(exc).__name__}): is "
                "`retrace up` running?",
            ) from exc
        try:
            answer = msgspec.json.decode(raw) if raw else None
        except UNDECODABLE:
            answer = None
        if status >= 400:
            message = _message(answer) or raw.decode(errors="replace")[:300]
            raise (ApiUnavailable if status == 503 else ApiError)(status, message)
        if answer is None and raw:
            raise ApiError(status, f"the control API answered {path} with no JSON: {raw[:200]!r}")
        return answer

    async def every(self, path: str) -> list[Any]:
        """Every item of a paged list."""
        items: list[Any] = []
        cursor: str | None = None
        while True:
            sep = "&" if "?" in path else "?"
            after = f"{sep}cursor={quote(cursor, safe='')}" if cursor else ""
            page = await self.call("GET", path + after)
            items += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items


def key_tenant(key: str) -> str | None:
    """The tenant a key was issued for, from its form `rt_<tenant>_<secret>` (tenant ids
    hold no underscore); None for a key of another form."""
    if not key.startswith(KEY_PREFIX):
        return None
    tenant, sep, _ = key.removeprefix(KEY_PREFIX).partition("_")
    return tenant if sep and tenant else None


def given(param: str) -> bool:
    """Whether the current command's `param` was given (command line or environment), not
    left at its default."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return True
    source = ctx.get_parameter_source(param)
    return source is not None and source != ParameterSource.DEFAULT


def _message(answer: Any) -> str | None:
    """The message of an error in the OpenAI shape."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        message = answer["error"].get("message")
        return str(message) if message else None
    return None
