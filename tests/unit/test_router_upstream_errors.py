"""The endpoint's answers other than 200 reach the router's caller in the OpenAI error shape
(issue 14: they were passed on as they came, text/plain or an internal exception
included)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from services.router.handlers import _upstream_refusal


@given(status=st.integers(min_value=300, max_value=599), payload=st.binary(max_size=300))
def test_whatever_the_endpoint_sends_the_caller_gets_the_openai_shape(
    status: int, payload: bytes
) -> None:
    resp = _upstream_refusal(status, payload, {"X-Retrace-Adapter": "a"})
    assert resp.content_type == "application/json"
    assert resp.status == (status if 400 <= status < 500 else 502)
    assert resp.headers["X-Retrace-Adapter"] == "a"
    assert resp.body is not None
    error = json.loads(bytes(resp.body))["error"]  # type: ignore[arg-type]
    assert error["code"] == resp.status and error["message"] and error["type"]


def test_a_4xx_keeps_its_message_and_a_5xx_keeps_its_details_to_itself() -> None:
    vllm = json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 2048 tokens",
                "type": "BadRequestError",
                "code": 400,
            }
        }
    ).encode()
    resp = _upstream_refusal(400, vllm, {})
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert resp.status == 400 and "maximum context length" in body["error"]["message"]
    resp = _upstream_refusal(500, b"Traceback (most recent call last): secret internals", {})
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert resp.status == 502 and "secret" not in body["error"]["message"]
    assert body["error"]["type"] == "upstream_error"
