"""JSON that msgspec cannot decode, at each place retrace decodes JSON from outside: a string
that is not UTF-8 and nesting deeper than the decoder follows. msgspec raises
UnicodeDecodeError and RecursionError for those, not its DecodeError, and each of these
boundaries caught only DecodeError: the model server and the environment server answered a
500 instead of a 400, the LLM client raised past its own error types, a spec file or the
state file of `retrace up` crashed the command (found by the model gate's tests, issue 14).
Bus messages and the router's spool and feedback have theirs in test_messages.py,
test_router_spool.py and test_router_service.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shared.config import ServiceConfig, StorageConfig
from shared.envs.derived.spec import decode_derived
from shared.envs.remote.server import environment_app
from shared.envs.remote.wire import PREFIX
from shared.envs.synthetic.spec import InvalidSpecError
from shared.envs.synthetic.spec import decode as decode_synthetic
from shared.llm.client import LLMError
from shared.llm.structured import MalformedReply, decode_json
from shared.messages import Sampling
from tests.support.served import client_on
from tests.unit.test_llm_client import FAST, REQUEST

NOT_UTF8 = b'{"name": "caf\xc3", "model": "\xff\xfe"}'
DEEP = b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("raw", [NOT_UTF8, DEEP])
def test_spec_files_say_they_are_malformed(raw: bytes) -> None:
    with pytest.raises(InvalidSpecError, match="malformed spec"):
        decode_synthetic(raw)
    with pytest.raises(InvalidSpecError, match="malformed derived spec"):
        decode_derived(raw)


def test_a_model_reply_nested_too_deeply_is_malformed() -> None:
    with pytest.raises(MalformedReply):
        decode_json("[" * 100_000, Sampling)


def test_an_unreadable_state_file_is_no_state(tmp_path: Path) -> None:
    from shared.cli.context import read_state, state_path

    cfg = ServiceConfig(storage=StorageConfig(data_dir=str(tmp_path)))
    state_path(cfg).parent.mkdir(parents=True)
    for raw in (NOT_UTF8, DEEP):
        state_path(cfg).write_bytes(raw)
        assert read_state(cfg) is None


@pytest.fixture
async def env_client() -> AsyncIterator[TestClient]:
    from retrace_hotel_desk.env import HotelDesk

    async with TestClient(TestServer(environment_app(HotelDesk()))) as client:
        yield client


@pytest.mark.parametrize("raw", [NOT_UTF8, DEEP])
async def test_the_environment_server_answers_a_400(env_client: TestClient, raw: bytes) -> None:
    resp = await env_client.post(f"{PREFIX}/reset", data=raw)
    assert resp.status == 400, await resp.text()


@pytest.mark.parametrize("raw", [NOT_UTF8, DEEP])
async def test_the_model_server_answers_a_400(raw: bytes) -> None:
    from shared.serving.api import ModelServer

    # the routes only: a stand-in engine (the body is refused before any engine is asked)
    embeddings = SimpleNamespace(num_embeddings=10)
    engine: Any = SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: embeddings))
    server = ModelServer(engine, prompts=None, served_name="m", max_context=8)  # type: ignore[arg-type]
    async with TestClient(TestServer(server.app())) as client:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/load_lora_adapter"):
            resp = await client.post(path, data=raw)
            body = await resp.json()
            assert resp.status == 400 and "invalid request" in body["error"]["message"], body


@pytest.mark.parametrize("raw", [b'{"choices": [{"message": {"content": "\xff"}}]}', DEEP])
async def test_the_llm_client_raises_its_own_error(raw: bytes) -> None:
    async def reply(_: web.Request) -> web.Response:
        return web.Response(body=raw, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", reply)
    async with client_on(app, chat_retry=FAST) as client:
        with pytest.raises(LLMError, match="unreadable"):
            await client.chat(REQUEST)


@pytest.mark.parametrize("raw", [NOT_UTF8, DEEP])
async def test_the_control_api_answers_a_400(raw: bytes) -> None:
    from services.api.handlers import Refused, body

    class Kind(msgspec.Struct):
        name: str

    async def handle(request: web.Request) -> web.Response:
        try:
            await body(request, Kind)
        except Refused as exc:
            return web.Response(status=exc.status, text=str(exc))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/", handle)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/", data=raw)
        assert resp.status == 400 and "invalid request body" in await resp.text()


def test_a_tool_call_nested_too_deeply_is_a_malformed_call() -> None:
    """Model output: json.loads raises RecursionError at depth 1000, which a prompt can ask
    for; it was a 500 in the model server and a crash in GRPO's scoring."""
    from shared.llm.tool_format import parse_reply

    deep = '{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}"
    tagged = parse_reply(f"<tool_call>{deep}</tool_call>", ("f",))
    assert tagged.calls == [] and "nested too deeply" in tagged.malformed[0].error
    for text in (f"```json\n{deep}\n```", deep):  # not read as a call: left as text
        assert parse_reply(text, ("f",)).calls == []


async def test_an_unreadable_model_list_is_an_llm_error() -> None:
    async def reply(_: web.Request) -> web.Response:
        return web.Response(body=b'{"data": [' + b"[" * 100_000 + b"]}", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/models", reply)
    async with client_on(app, chat_retry=FAST) as client:
        with pytest.raises(LLMError, match="unreadable model list"):
            await client.models()
