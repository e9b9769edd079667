"""No URL's password reaches a log line (issue 14: a NATS URL with a password was logged in
clear on disconnect)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.logging import configure_logging, get_logger, redact

_SPACE = ("Cs", "Cc", "Zs", "Zl", "Zp")  # a URL's credentials carry these percent-encoded
user = st.text(st.characters(blacklist_characters=":/@", blacklist_categories=_SPACE))
secret = st.text(st.characters(blacklist_characters="/@", blacklist_categories=_SPACE), min_size=1)


@given(user, secret, st.sampled_from(["nats", "tls", "postgresql+asyncpg", "redis"]))
def test_a_password_in_a_url_is_never_kept(name: str, password: str, scheme: str) -> None:
    url = f"{scheme}://{name}:{password}@host:4222/db"
    shown = redact(f"connect to {url} failed")
    assert shown == f"connect to {scheme}://{name}:***@host:4222/db failed"


@pytest.mark.parametrize(
    "text", ["nats://nats:4222", "mail bob@example.com", "https://user@host/x", "a:b@c"]
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
