"""The stored form of a presented key: any text a header can carry hashes, and only the
issued key hashes to its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.store.tenants import hash_key

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
