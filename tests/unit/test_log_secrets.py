"""No URL's password reaches a log line (issue 14: a NATS URL with a password was logged in
clear on disconnect)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from shared.logging import configure_logging, get_logger, redact

_SPACE = ("Cs", "Cc", "Zs", "Zl", "Zp")  # a URL's credentials carry these percent-encoded
user = st.text(st.characters(blacklist_characters=":/@", blacklist_categories=_SPACE))
secret = st.text(
    st.characters(blacklist_characters="/\"'<>`{}|\\^", blacklist_categories=_SPACE), min_size=1
)
"""A password may hold an `@` (its tail once stayed in the line); what a URL never holds
unencoded (RFC 3986) it does not."""


@given(user, secret, st.sampled_from(["nats", "tls", "postgresql+asyncpg", "redis"]))
def test_a_password_in_a_url_is_never_kept(name: str, password: str, scheme: str) -> None:
    url = f"{scheme}://{name}:{password}@host:4222/db"
    shown = redact(f"connect to {url} failed")
    assert shown == f"connect to {scheme}://{name}:***@host:4222/db failed"


@given(secret.filter(lambda t: ":" not in t and "@" not in t), st.sampled_from(["nats", "tls"]))
def test_a_nats_token_in_a_url_is_never_kept(token: str, scheme: str) -> None:
    # NATS takes a URL's lone user part as a token (issue 14 audit: it was logged whole)
    assert redact(f"lost {scheme}://{token}@nats:4222") == f"lost {scheme}://***@nats:4222"


def test_a_password_is_hidden_and_nothing_after_its_url() -> None:
    # the password runs to the last `@` before the host, but not past a quote: a later address
    # in the same JSON text took the host and the fields between with it
    text = '{"dsn":"nats://svc:pw@nats:4222","owner":"ops@example.com"}'
    assert redact(text) == '{"dsn":"nats://svc:***@nats:4222","owner":"ops@example.com"}'


def test_an_exception_logged_by_its_tuple_keeps_its_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # as asyncio logs "Task exception was never retrieved": exc_info a tuple, outside any
    # `except`; hide_secrets made it a list, which is not read as one: no traceback at all
    import logging

    configure_logging("info", "json")
    try:
        raise ConnectionError("cannot reach nats://svc:tuple-secret@nats:4222")
    except ConnectionError as e:
        error = e
    logging.getLogger("test.tuple").error(
        "Task exception was never retrieved", exc_info=(type(error), error, error.__traceback__)
    )
    [line] = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x]
    assert "ConnectionError" in line["exception"] and "test_log_secrets.py" in line["exception"]
    assert "tuple-secret" not in json.dumps(line)


def test_several_servers_in_one_nats_url_each_lose_their_password() -> None:
    shown = redact("nats://u:p1@a:4222,nats://v:p2@b:4222")
    assert shown == "nats://u:***@a:4222,nats://v:***@b:4222"


@pytest.mark.parametrize(
    "text",
    [
        "nats://nats:4222",
        "mail bob@example.com",
        "https://user@host/x",
        "postgresql://retrace@db/x",
        "a:b@c",
    ],
)
def test_text_without_a_url_password_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_log_lines_hide_passwords_in_any_field(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    log = get_logger("test")
    log.warning(
        "nats disconnected",
        url="nats://svc:hunter2-secret@nats:4222",
        nested={"urls": ["postgresql://u:pg-secret@db/x"]},
    )
    try:
        raise ConnectionError("cannot reach nats://svc:exc-secret@nats:4222")
    except ConnectionError:
        log.exception("failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    text = json.dumps(lines)
    assert "hunter2-secret" not in text and "pg-secret" not in text and "exc-secret" not in text
    assert lines[0]["url"] == "nats://svc:***@nats:4222"


def test_console_lines_hide_passwords_in_tracebacks_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the console renderer formats an exception after hide_secrets has run (issue 14 audit)
    import logging

    configure_logging("info", "console")
    for log in (get_logger("test"), logging.getLogger("test.stdlib")):
        try:
            raise ConnectionError("cannot reach nats://svc:exc-secret@nats:4222")
        except ConnectionError:
            log.exception("failed")
    err = capsys.readouterr().err
    assert "exc-secret" not in err and err.count("nats://svc:***@nats:4222") >= 2, err[-2000:]


keys = st.from_regex(r"\Art_[a-z0-9]{1,8}_[A-Za-z0-9_-]{32}\Z")


@given(keys, st.text(max_size=20), st.text(max_size=20))
def test_a_tenant_key_s_secret_is_never_kept(key: str, before: str, after: str) -> None:
    # session 32's review: aiohttp logged a malformed request's Authorization header whole
    shown = redact(f"{before} {key} {after}")
    assert key[-32:] not in shown or key[-32:] in f"{before} {after}"


@given(
    st.text(st.characters(blacklist_categories=_SPACE, blacklist_characters="'\",;\\"), min_size=8)
)
def test_a_bearer_token_is_never_kept(token: str) -> None:
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):  # every case the parser takes
        shown = redact(f"Invalid header value char: b'Authorization: {scheme} {token}\\x01'")
        assert shown == f"Invalid header value char: b'Authorization: {scheme} ***\\x01'"


async def test_a_request_that_is_not_http_is_logged_without_what_it_carried(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """aiohttp logged a bad header at ERROR, the header (a tenant's key) in its message and
    traceback; now a WARNING that says only what was wrong."""
    configure_logging("info", "json")

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    secret = "S3cr3t" + "x" * 26
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer rt_acme_"
            + secret.encode()
            + b"\x01\r\n\r\n"
        )
        await writer.drain()
        answer = await reader.read()
        writer.close()
    finally:
        await runner.cleanup()
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:100]
    err = capsys.readouterr().err
    assert secret not in err
    lines = [json.loads(line) for line in err.splitlines() if line]
    refused = [line for line in lines if "malformed HTTP request" in line["event"]]
    assert refused and refused[0]["level"] == "warning" and "exception" not in refused[0]
