"""`RETRACE_MODEL_REQUEST_TIMEOUT` bounds every generation call of every service: a busy CPU
server answers in minutes, and a shorter hidden limit throws the work away and asks again."""

from __future__ import annotations

import pytest

from shared.config import ModelConfig
from shared.envs.protocol import Message
from shared.llm.client import LLMClient
from shared.llm.openai_types import ChatRequest
from tests.support.fake_chat import FakeJudge, Serve
from tests.support.services import built

ENV = {
    "RETRACE_MODEL_REQUEST_TIMEOUT": "1234",
    "RETRACE_CONTRAST_JUDGE_MODEL": "judge",
    "RETRACE_SYNTHESIZE_WRITER_MODEL": "writer",
    "RETRACE_ROUTER_MODE": "base",
}


def _clients(service: object) -> list[LLMClient]:
    """The model clients a service's handlers hold, themselves or in their parts (the judge,
    the spec writer)."""
    found = []
    for handler in getattr(service, "handlers", {}).values():
        owner = getattr(handler, "__self__", None)
        for part in [owner, *vars(owner).values()] if owner is not None else []:
            client = getattr(part, "client", None)
            if isinstance(client, LLMClient):
                found.append(client)
    return found


@pytest.mark.parametrize("name", ["rollout", "contrast", "synthesize", "train"])
def test_every_service_client_waits_the_configured_time(name: str) -> None:
    service = built(name, ENV)
    clients = _clients(service)
    assert clients, "the service has no model client to check"
    assert {c.chat_retry.timeout for c in clients} == {1234.0}


def test_the_router_client_waits_the_configured_time() -> None:
    service = built("router", ENV)
    app = service.routes.__self__  # type: ignore[union-attr]
    assert app.client.chat_retry.timeout == 1234.0


async def test_a_reply_slower_than_the_limit_fails_and_one_within_it_arrives(
    serve: Serve,
) -> None:
    fake = FakeJudge(lambda body: "late but here", delay=0.6)
    url = (await serve(fake)).base_url
    request = ChatRequest(model="m", messages=[Message(role="user", content="hi")])
    async with LLMClient.for_endpoint(ModelConfig(url=url, request_timeout=3.0)) as patient:
        reply = await patient.chat(request)
    assert reply.choices[0].message.content == "late but here"
    async with LLMClient.for_endpoint(ModelConfig(url=url, request_timeout=0.2)) as hasty:
        with pytest.raises(TimeoutError):
            await hasty.chat(request)
