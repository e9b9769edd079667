"""The stored form of a presented key: any text a header can carry hashes, and only the
issued key hashes to its own; what is not shaped like an issued key is no key."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from shared.store.tenants import KEY_PREFIX, KEY_TOKEN_BYTES, hash_key, well_formed

# what aiohttp makes of a header's bytes: UTF-8 where they are, surrogates where not
HEADER_TEXT = st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape"))


@given(HEADER_TEXT | st.text(max_size=64))
def test_any_presented_text_hashes(presented: str) -> None:
    hashed = hash_key(presented)
    assert len(hashed) == 64 and int(hashed, 16) >= 0


def test_the_bytes_presented_are_what_is_hashed() -> None:
    issued = "rt_acme_" + "k" * 32
    assert hash_key(issued) != hash_key(issued + "\udcff")
    assert hash_key("rt_\udcff") == hash_key(b"rt_\xff".decode("utf-8", "surrogateescape"))
    assert hash_key("rt_\udcff") != hash_key("rt_\xff")  # the byte, not the character ÿ


TENANTS = st.from_regex(r"\A[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


@given(TENANTS, st.binary(min_size=KEY_TOKEN_BYTES, max_size=KEY_TOKEN_BYTES))
def test_every_key_issued_is_well_formed(tenant: str, token: bytes) -> None:
    key = KEY_PREFIX + tenant + "_" + base64.urlsafe_b64encode(token).decode().rstrip("=")
    assert well_formed(key)
    assert not well_formed(key[:-1]) and not well_formed(key + "A")
    assert not well_formed(key + "\n") and not well_formed(" " + key)


def test_a_key_issued_the_way_issue_api_key_does_is_well_formed() -> None:
    import secrets

    for tenant in ("acme", "northwind-traders", "a", "x" * 63):
        assert well_formed(KEY_PREFIX + tenant + "_" + secrets.token_urlsafe(KEY_TOKEN_BYTES))
    assert not well_formed("rt_Acme_" + "k" * 32)  # tenant ids are lowercase
    assert not well_formed("rt_acme_" + "k" * 31)
    assert not well_formed("sk-" + "k" * 48)
