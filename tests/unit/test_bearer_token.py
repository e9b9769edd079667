"""The bearer token of a request (`errors_http.presented_token`), read alike by the router,
the control API and the model server: the scheme whatever its case (RFC 9110; `bearer` was
a 401 everywhere), and no token without it (a bare key was taken by the model server)."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from shared.llm.errors_http import bearer_token, presented_token

tokens = st.text(
    st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60
)  # visible ASCII, as a header carries a key


def _token(header: str | None) -> str:
    headers = {} if header is None else {"Authorization": header}
    return presented_token(make_mocked_request("GET", "/", headers=headers))


@given(
    st.sampled_from(["Bearer", "bearer", "BEARER", "bEaReR"]), tokens, st.sampled_from([" ", "  "])
)
def test_the_token_after_the_scheme_whatever_its_case(scheme: str, token: str, gap: str) -> None:
    assert _token(f"{scheme}{gap}{token}") == token


@given(tokens)
def test_no_scheme_or_another_is_no_token(token: str) -> None:
    assert _token(token) == ""
    assert _token(f"Basic {token}") == ""


def test_no_header_is_no_token() -> None:
    assert _token(None) == "" and _token("Bearer") == "" and _token("Bearer   ") == ""
    request = make_mocked_request("GET", "/", headers={"Authorization": "bearer k"})
    assert bearer_token(request) == b"k"
