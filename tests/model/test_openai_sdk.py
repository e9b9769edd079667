"""`retrace serve-model` through the official `openai` SDK (issue 14, conformance): typed
responses, tool calls forced by `tool_choice`, `n`, `seed`, logprobs, streamed tool-call deltas
and the SDK's typed exceptions, against the real SmolLM2."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient

openai = pytest.importorskip("openai", reason="the SDK tests need the openai package")

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
ASK = [{"role": "user", "content": "Wake me at 7."}]


@pytest.fixture
async def sdk(client: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    url = f"http://{client.server.host}:{client.server.port}/v1"
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as made:
        yield made


async def test_a_typed_chat_completion_with_logprobs(sdk: openai.AsyncOpenAI) -> None:
    done = await sdk.chat.completions.create(
        model="smollm2", messages=ASK, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.logprobs is not None and choice.logprobs.content
    assert len(choice.logprobs.content[0].top_logprobs) == 2
    assert done.usage is not None and done.usage.completion_tokens == len(choice.logprobs.content)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "set_alarm"}}]
)
async def test_tool_choice_is_enforced(sdk: openai.AsyncOpenAI, choice: object) -> None:
    done = await sdk.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=40,
        temperature=0,
    )  # fmt: skip
    calls = done.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "set_alarm", done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls"


async def test_n_and_seed(sdk: openai.AsyncOpenAI) -> None:
    def ask(seed: int) -> object:
        return sdk.chat.completions.create(
            model="smollm2", messages=ASK, max_tokens=8, temperature=1.0, n=2, seed=seed
        )

    first, again = await ask(11), await ask(11)
    assert len(first.choices) == 2  # type: ignore[attr-defined]
    assert [c.message.content for c in first.choices] == [  # type: ignore[attr-defined]
        c.message.content
        for c in again.choices  # type: ignore[attr-defined]
    ]


async def test_streamed_tool_calls_arrive_as_indexed_deltas(sdk: openai.AsyncOpenAI) -> None:
    named = {"type": "function", "function": {"name": "set_alarm"}}
    async with sdk.chat.completions.stream(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=40,
        temperature=0,
    ) as stream:  # fmt: skip
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert not message.content  # the forced opening of the call is no reply text
    assert message.tool_calls and message.tool_calls[0].function.name == "set_alarm"


async def test_errors_are_the_sdks_typed_exceptions(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="no-such-model", messages=ASK, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        await sdk.chat.completions.create(model="smollm2", messages=ASK, top_p=0, max_tokens=4)
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
