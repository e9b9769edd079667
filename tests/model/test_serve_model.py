"""`retrace serve-model` with the real SmolLM2: the OpenAI API, adapters, batching, streaming."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shared.serving.api import MAX_BODY_BYTES, ModelServer
from shared.serving.engine import Engine

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_alarm",
            "description": "Set an alarm.",
            "parameters": {
                "type": "object",
                "properties": {"time": {"type": "string"}},
                "required": ["time"],
            },
        },
    }
]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 12,
        **extra,
    }


async def post(client: TestClient, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    resp = await client.post("/v1/chat/completions", json=body)
    data = await resp.json()
    assert resp.status == status, data
    return data


async def test_chat_completion_shape(client: TestClient) -> None:
    data = await post(client, chat("Say hello.", logprobs=True, top_logprobs=3))
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    tokens = choice["logprobs"]["content"]
    assert 0 < len(tokens) <= 12 and all(t["logprob"] <= 0 for t in tokens)
    assert len(tokens[0]["top_logprobs"]) == 3
    assert data["usage"]["completion_tokens"] == len(tokens)
    models = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["smollm2"]


async def test_bad_requests_get_clear_errors(client: TestClient) -> None:
    assert "not found" in (await post(client, chat("hi", model="nope"), 404))["error"]["message"]
    assert "n must be" in (await post(client, chat("hi", n=99), 400))["error"]["message"]
    assert "top_p" in (await post(client, chat("hi", top_p=0), 400))["error"]["message"]
    # Values that would break the batch for everyone in it are refused up front.
    assert (
        "temperature"
        in (await post(client, chat("hi", temperature=1e-300), 400))["error"]["message"]
    )
    assert "seed" in (await post(client, chat("hi", seed=2**64), 400))["error"]["message"]
    # sampling settings serve-model does not apply: refused, not answered as if applied
    for extra in (
        {"presence_penalty": 0.5},
        {"frequency_penalty": -1.0},
        {"logit_bias": {"42": -100}},
        {"top_k": 5},
        {"min_p": 0.1},
        {"repetition_penalty": 1.2},
    ):
        refused = (await post(client, chat("hi", **extra), 400))["error"]["message"]
        assert f"serve-model samples without {next(iter(extra))}" in refused
    neutral = chat("hi", presence_penalty=0, logit_bias={"42": 0}, top_k=-1)
    await post(client, neutral)  # values that change nothing are taken
    assert (
        "between -2 and 2"
        in (await post(client, chat("hi", presence_penalty=3), 400))["error"]["message"]
    )
    assert (
        "context window"
        in (await post(client, chat("hi", max_tokens=10_000_000), 400))["error"]["message"]
    )
    resp = await client.post("/v1/chat/completions", data=b"{not json")
    assert resp.status == 400 and "invalid request" in (await resp.json())["error"]["message"]
    # a body past the limit: 413 in the OpenAI shape, before anything is read into a prompt
    huge = chat("x" * (MAX_BODY_BYTES + 1))
    resp = await client.post("/v1/chat/completions", json=huge)
    assert resp.status == 413 and (await resp.json())["error"]["code"] == 413
    # max_tokens 0 was read as "unset" and generated the default 256 tokens
    assert "max_tokens" in (await post(client, chat("hi", max_tokens=0), 400))["error"]["message"]
    # aiohttp's own errors (no route, wrong method) in the OpenAI shape, not text/plain
    for method, path, status in (("GET", "/v1/nowhere", 404), ("GET", "/v1/chat/completions", 405)):
        resp = await client.request(method, path)
        body = await resp.json()
        assert resp.status == status and body["error"]["code"] == status, body
    for path in ("/nonexistent", "0" * 300):  # a name too long for the disk: a 500 (schemathesis)
        bad = await client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path})
        assert bad.status == 400, await bad.text()
    # issue 14: these were 500s carrying the internal exception
    deep = b'{"model": "smollm2", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    no_function = chat("hi", tools=[{"type": "function"}])
    # inside a string value, where a decoder that accepts the JSON meets the bytes
    invalid_utf8 = b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    for raw in (invalid_utf8, deep):
        resp = await client.post(
            "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        )
        body = await resp.json()
        assert resp.status == 400 and body["error"]["code"] == 400, body
        assert "Traceback" not in body["error"]["message"]
    assert "function" in (await post(client, no_function, 400))["error"]["message"]


async def complete(client: TestClient, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    resp = await client.post("/v1/completions", json={"model": "smollm2", **body})
    data = await resp.json()
    assert resp.status == status, data
    return data


async def test_token_completions_return_the_sampled_ids_with_the_stop_token(
    client: TestClient, loaded: tuple[object, Engine]
) -> None:
    """Training samples this way (vLLM's `return_token_ids`): exactly the ids the model wrote,
    the stop token included, each with its log-probability."""
    from shared.llm.openai_types import ChatRequest
    from shared.serving.prompts import PromptBuilder

    _, engine = loaded
    tokenizer = engine.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    request = ChatRequest(model="smollm2", messages=[{"role": "user", "content": "Say hello."}])  # type: ignore[list-item]
    prompt, _ = PromptBuilder(tokenizer).build(request)
    greedy = {"max_tokens": 40, "temperature": 0, "stop_token_ids": [end]}
    data = await complete(
        client, {"prompt": prompt, "logprobs": 0, "return_token_ids": True, **greedy}
    )
    [choice] = data["choices"]
    ids = choice["token_ids"]
    assert choice["finish_reason"] == "stop" and ids[-1] == end and end not in ids[:-1]
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["text"]
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids)
    assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"])
    assert data["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }
    as_chat = await post(client, chat("Say hello.", max_tokens=40))
    assert as_chat["choices"][0]["message"]["content"] == choice["text"]  # same model, same ids
    as_text = await complete(client, {"prompt": tokenizer.decode(prompt), **greedy})
    assert as_text["choices"][0]["text"] == choice["text"]
    assert "token_ids" not in as_text["choices"][0] or as_text["choices"][0]["token_ids"] is None


async def test_bad_completion_requests_get_clear_errors(client: TestClient) -> None:
    def message(data: dict[str, Any]) -> str:
        return str(data["error"]["message"])

    assert "empty" in message(await complete(client, {"prompt": []}, 400))
    assert "vocabulary" in message(await complete(client, {"prompt": [1, 10**9]}, 400))
    assert "vocabulary" in message(
        await complete(client, {"prompt": [1, 2], "stop_token_ids": [-1]}, 400)
    )
    assert "stream" in message(await complete(client, {"prompt": [1, 2], "stream": True}, 400))
    assert "not found" in message(await complete(client, {"prompt": [1], "model": "nope"}, 404))
    assert "n must be" in message(await complete(client, {"prompt": [1], "n": 0}, 400))
    # knobs serve-model does not implement are refused unless they ask for nothing
    assert "top_k" in message(await complete(client, {"prompt": [1], "top_k": 20}, 400))
    assert "repetition_penalty" in message(
        await complete(client, {"prompt": [1], "repetition_penalty": 1.1}, 400)
    )
    neutral = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "max_tokens": 2}
    await complete(client, {"prompt": [1], **neutral})
    assert "invalid request" in message(await complete(client, {"prompt": [1, "x"]}, 400))
    assert "context window" in message(
        await complete(client, {"prompt": [1], "max_tokens": 10_000_000}, 400)
    )


async def test_tool_choice_required_or_named_is_a_call_of_that_tool(client: TestClient) -> None:
    """Constrained decoding holds the reply to a call: `required`, one of the offered tools;
    a named function, that one even where the request asks for another."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    tools = [*TOOLS, weather]
    # the second asks for nothing a tool does: only the constraint makes its reply a call
    for prompt in ("Wake me at 7:30.", "Write two lines of a poem about the sea."):
        data = await post(client, chat(prompt, tools=tools, tool_choice="required", max_tokens=120))
        choice = data["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls" and calls, (prompt, choice)
        for call in calls:
            assert call["function"]["name"] in ("set_alarm", "get_weather")
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
    for name in ("set_alarm", "get_weather"):
        named = await post(
            client,
            chat(
                "Wake me at 7:30.",
                tools=tools,
                max_tokens=120,
                tool_choice={"type": "function", "function": {"name": name}},
            ),
        )
        msg = named["choices"][0]["message"]
        assert [c["function"]["name"] for c in msg["tool_calls"]] == [name], msg


async def _logprobs(client: TestClient, model: str) -> list[float]:
    data = await post(client, chat("Name a colour.", model=model, logprobs=True, max_tokens=8))
    return [t["logprob"] for t in data["choices"][0]["logprobs"]["content"]]


async def test_adapter_changes_logprobs_and_unloading_restores_them(
    client: TestClient, random_adapter: Path
) -> None:
    before = await _logprobs(client, "smollm2")
    resp = await client.post(
        "/v1/load_lora_adapter", json={"lora_name": "rand", "lora_path": str(random_adapter)}
    )
    assert resp.status == 200, await resp.text()
    assert "rand" in [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    missing = await post(client, chat("hi", model="nope"), 404)
    assert "rand" not in missing["error"]["message"]  # another tenant's, through a router
    with_adapter = await _logprobs(client, "rand")
    base_while_loaded = await _logprobs(client, "smollm2")
    assert with_adapter != pytest.approx(before, abs=1e-3)
    # the base model name bypasses a loaded adapter (this time from the stored prompt: the
    # same values up to float rounding)
    assert base_while_loaded == pytest.approx(before, abs=1e-4)
    dup = await client.post(
        "/v1/load_lora_adapter", json={"lora_name": "rand", "lora_path": str(random_adapter)}
    )
    assert dup.status == 400
    resp = await client.post("/v1/unload_lora_adapter", json={"lora_name": "rand"})
    assert resp.status == 200
    assert await _logprobs(client, "smollm2") == pytest.approx(before, abs=1e-4)
    await post(client, chat("hi", model="rand"), 404)


async def test_concurrent_requests_are_batched_and_match_single_runs(
    client: TestClient, loaded: tuple[object, Engine]
) -> None:
    _, engine = loaded
    prompts = [
        "Count to three.",
        "What is the capital of France? Answer briefly.",
        "Hi",
        "Name a fruit.",
        "Write one word.",
        "What colour is the sky?",
    ]
    single = [(await post(client, chat(p)))["choices"][0]["message"]["content"] for p in prompts]
    batches_before = engine.stats.batches
    together = await asyncio.gather(*(post(client, chat(p)) for p in prompts))
    assert engine.stats.batches - batches_before < len(prompts)  # some ran in one batch
    assert [d["choices"][0]["message"]["content"] for d in together] == single


async def test_seeded_sampling_is_reproducible_and_n_gives_n_choices(client: TestClient) -> None:
    body = chat("Tell me a word.", temperature=1.0, seed=123, n=3, max_tokens=10)
    first, second = await post(client, body), await post(client, body)
    texts = [c["message"]["content"] for c in first["choices"]]
    assert len(texts) == 3 and texts == [c["message"]["content"] for c in second["choices"]]


async def test_streaming_matches_the_whole_answer(client: TestClient) -> None:
    whole = (await post(client, chat("Count to five.")))["choices"][0]["message"]["content"]
    resp = await client.post("/v1/chat/completions", json=chat("Count to five.", stream=True))
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    text, finished, done = "", None, False
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: ")
        if line == "data: [DONE]":
            done = True
            break
        choice = json.loads(line[6:])["choices"][0]
        text += choice["delta"].get("content") or ""
        finished = choice["finish_reason"] or finished
    assert done and finished in ("stop", "length") and text == whole


async def test_a_stream_ends_with_its_usage_when_asked(client: TestClient) -> None:
    """`stream_options.include_usage`, as OpenAI's API: a last chunk with no choices and the
    request's usage, `"usage": null` on every other; ignored before (and a router could not
    record a stream's tokens)."""
    whole = await post(client, chat("Count to five."))
    body = chat("Count to five.", stream=True, stream_options={"include_usage": True})
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line and line != "data: [DONE]":
            events.append(json.loads(line.removeprefix("data: ")))
    *chunks, last = events
    assert chunks and all("usage" in c and c["usage"] is None for c in chunks)
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    plain = await client.post("/v1/chat/completions", json=chat("Count to five.", stream=True))
    assert b'"usage"' not in await plain.read()
    refused = await post(client, chat("hi", stream_options={"include_usage": True}), 400)
    assert "stream_options" in refused["error"]["message"]


async def test_prefix_cache_gives_the_same_tokens(loaded: tuple[object, Engine]) -> None:
    from shared.envs.protocol import Message
    from shared.llm.openai_types import ChatRequest
    from shared.serving.sampling import SamplingParams

    server, engine = loaded
    system = Message(role="system", content="You are a phone assistant. " * 20)

    def prompt(text: str) -> list[int]:
        request = ChatRequest(
            model="smollm2", messages=[system, Message(role="user", content=text)], tools=TOOLS
        )
        return server.prompts.build(request)[0]  # type: ignore[attr-defined]

    greedy = SamplingParams(temperature=0, max_tokens=12, logprobs=True)
    short, long = prompt("Wake me at 7."), prompt("Please set an alarm for 07:30 tomorrow.")
    plain = []
    for ids in (short, long):
        await engine.run_on_engine(engine.kv.clear)
        plain.append((await engine.generate(ids, greedy))[0])
    await engine.run_on_engine(engine.kv.clear)
    hits, prefilled = engine.stats.prefix_hits, engine.stats.prefilled_tokens
    cached = await asyncio.gather(*(engine.generate(ids, greedy) for ids in (short, long)))
    assert engine.stats.prefix_hits >= hits + 1
    # the second ran only where it parts from the first (the system turn with the tools is shared)
    assert engine.stats.prefilled_tokens - prefilled < len(short) + len(long) - 100
    for fresh, reused in zip(plain, (c[0] for c in cached), strict=True):
        assert reused.token_ids == fresh.token_ids
        for a, b in zip(fresh.logprobs, reused.logprobs, strict=True):
            assert abs(a.logprob - b.logprob) < 1e-3


async def test_abandoned_requests_stop_generating(loaded: tuple[object, Engine]) -> None:
    from shared.envs.protocol import Message
    from shared.llm.openai_types import ChatRequest
    from shared.serving.sampling import SamplingParams

    server, engine = loaded
    request = ChatRequest(
        model="smollm2",
        messages=[Message(role="user", content="Count from 1 to 1000, separated by commas.")],
    )
    ids, _ = server.prompts.build(request)  # type: ignore[attr-defined]
    long = SamplingParams(temperature=0, max_tokens=600)
    before = engine.stats.generated_tokens
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.generate(ids, long), 1.0)
    await asyncio.sleep(1.0)  # the engine notices at its next step
    settled = engine.stats.generated_tokens
    await asyncio.sleep(2.0)
    assert engine.stats.generated_tokens == settled  # nothing more is generated for nobody
    assert settled - before < 300  # far from the 600 a finished request would have cost


async def test_with_a_key_only_health_is_open(loaded: tuple[object, Engine]) -> None:
    """Without a key anyone who reached the port could chat with any tenant's adapter, list
    the adapters with their paths, load any path or unload them all (issue 14)."""
    open_server, engine = loaded
    keyed = ModelServer(
        engine,
        open_server.prompts,  # type: ignore[attr-defined]
        "smollm2",
        open_server.max_context,  # type: ignore[attr-defined]
        api_key="s3cret-key",
    )
    async with TestClient(TestServer(keyed.app())) as c:
        assert (await c.get("/healthz")).status == 200
        for method, path in (
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/load_lora_adapter"),
            ("POST", "/v1/unload_lora_adapter"),
            ("GET", "/metrics"),
        ):
            for token in (None, "wrong", "s3cret-ke"):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                resp = await c.request(method, path, headers=headers, json={})
                assert resp.status == 401, (method, path, token)
                assert (await resp.json())["error"]["code"] == 401
        good = {"Authorization": "Bearer s3cret-key"}
        listed = await c.get("/v1/models", headers=good)
        assert listed.status == 200 and (await listed.json())["data"][0]["id"] == "smollm2"
        answered = await c.post("/v1/chat/completions", json=chat("Hi."), headers=good)
        assert answered.status == 200


async def test_adapters_load_only_from_the_store_and_only_with_the_admin_key(
    loaded: tuple[object, Engine], random_adapter: Path, tmp_path: Path
) -> None:
    """Issue 14: any caller could unload every tenant's adapters, and ask the server to load
    any path on it (telling whether it existed). With an admin key, only it changes the
    adapters; loads come only from the adapter directories, and a path outside them gets
    the same answer whether it exists or not; health names no adapter."""
    open_server, engine = loaded
    store = tmp_path / "store"
    shutil.copytree(random_adapter, store / "rand")
    outside = tmp_path / "outside"
    shutil.copytree(random_adapter, outside)  # a real adapter, outside the store
    (store / "escape").symlink_to(outside, target_is_directory=True)  # inside by name only
    keyed = ModelServer(
        engine,
        open_server.prompts,  # type: ignore[attr-defined]
        "smollm2",
        open_server.max_context,  # type: ignore[attr-defined]
        api_key="service-key",
        admin_key="admin-key",
        adapter_dirs=[store],
    )
    service = {"Authorization": "Bearer service-key"}
    admin = {"Authorization": "Bearer admin-key"}
    before = len(engine.adapters)
    async with TestClient(TestServer(keyed.app())) as c:
        load = {"lora_name": "store-rand", "lora_path": str(store / "rand")}
        for headers, status in (({}, 401), (service, 403)):
            resp = await c.post("/v1/load_lora_adapter", json=load, headers=headers)
            assert resp.status == status and (await resp.json())["error"]["code"] == status
        refusals = set()
        for path in ("/etc", "/no/such/dir", str(outside), str(store / "escape"), "rand"):
            resp = await c.post(
                "/v1/load_lora_adapter", json={**load, "lora_path": path}, headers=admin
            )
            assert resp.status == 403, (path, await resp.text())
            refusals.add((await resp.json())["error"]["message"])
        assert len(refusals) == 1  # one answer, whatever is or is not there
        resp = await c.post("/v1/load_lora_adapter", json=load, headers=admin)
        assert resp.status == 200, await resp.text()
        try:
            health = await (await c.get("/healthz")).json()
            assert health["adapters"] == before + 1 and "store-rand" not in json.dumps(health)
            chat_as_admin = await c.post("/v1/chat/completions", json=chat("Hi."), headers=admin)
            assert chat_as_admin.status == 401
            unload = {"lora_name": "store-rand"}
            refused = await c.post("/v1/unload_lora_adapter", json=unload, headers=service)
            assert refused.status == 403
        finally:
            unload = {"lora_name": "store-rand"}
            done = await c.post("/v1/unload_lora_adapter", json=unload, headers=admin)
        assert done.status == 200 and len(engine.adapters) == before


async def test_response_format_is_followed_or_refused(client: TestClient) -> None:
    """Issue 14: `response_format` was ignored silently. `json_object` holds the reply to
    one JSON object (constrained decoding); `json_schema`, which this server cannot follow,
    is a 400 that says so."""
    data = await post(
        client,
        chat(
            "Give me a JSON object with your favourite colour.",
            response_format={"type": "json_object"},
            temperature=0,
            max_tokens=96,
        ),
    )
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert isinstance(json.loads(choice["message"]["content"]), dict), choice
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    refused = await post(client, chat("hi", response_format=schema), 400)
    assert "json_schema" in refused["error"]["message"]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_caller_who_leaves_stops_the_generation(
    loaded: tuple[object, Engine], stream: bool
) -> None:
    """A caller gone (a router's client that left, a timeout) went on costing the engine
    its whole reply: a stream's generation was never cancelled, and aiohttp finishes a
    plain request's handler whose caller has gone. As `retrace serve-model` listens, both
    stop within a step or two."""
    import aiohttp

    from shared.serving.server import ServeConfig, start_server

    server, engine = loaded
    runner = await start_server(server, ServeConfig(model="smollm2", host="127.0.0.1", port=0))  # type: ignore[arg-type]
    port = runner.addresses[0][1]
    # sampled, a small model rambles on rather than stop (greedy, it stops within 20 tokens)
    story = "Write a very long story about a dragon and a lighthouse keeper."
    body = chat(story, max_tokens=1500, stream=stream, temperature=1.0, seed=7)
    try:
        async with aiohttp.ClientSession() as http:
            sent = asyncio.ensure_future(
                http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            )
            before = engine.stats.generated_tokens

            async def generating() -> int:
                await asyncio.sleep(1.0)
                return engine.stats.generated_tokens

            assert await generating() > before  # under way
            if stream:
                reply = await sent
                await reply.content.readany()
                reply.close()  # the connection goes with it
            else:
                sent.cancel()  # the caller gives up before the reply
        left = engine.stats.generated_tokens
        await asyncio.sleep(1.5)
        settled = engine.stats.generated_tokens
        await asyncio.sleep(1.5)
        assert engine.stats.generated_tokens == settled  # stopped
        assert settled - before < 1500 and settled - left < 100
    finally:
        await runner.cleanup()
