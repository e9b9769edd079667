"""The endpoint's answers other than 200 reach the router's caller in the OpenAI error shape
(issue 14: they were passed on as they came, text/plain or an internal exception
included)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from services.router.handlers import _upstream_refusal


@given(status=st.integers(min_value=300, max_value=599), payload=st.binary(max_size=300))
def test_whatever_the_endpoint_sends_the_caller_gets_the_openai_shape(
    status: int, payload: bytes
) -> None:
    headers = {"X-Retrace-Adapter": "a", "X-Retrace-Conversation": "c"}
    resp = _upstream_refusal(status, payload, headers)
    assert resp.content_type == "application/json"
    if status == 429:  # the endpoint busy: try again
        assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1
    elif 400 <= status < 500 and status not in (401, 403):  # the request's own fault
        assert resp.status == status
    else:  # the endpoint failing, or refusing the router's own key: not the caller's to fix
        assert resp.status == 502
    assert resp.headers["X-Retrace-Adapter"] == "a"
    assert "X-Retrace-Conversation" not in resp.headers  # nothing was answered
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


def test_the_endpoint_s_failure_text_is_logged_at_debug_only() -> None:
    """It may echo the request (vLLM's errors do): user content stays out of warnings."""
    echo = json.dumps({"error": {"message": "bad input: my card is 4111 1111", "type": "X"}})
    with capture_logs() as logs:
        _upstream_refusal(500, echo.encode(), {})
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert warning["status"] == 500 and "4111" not in str(warning)
    [debug] = [e for e in logs if e["log_level"] == "debug"]
    assert "4111" in debug["text"]
