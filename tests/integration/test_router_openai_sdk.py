"""The official `openai` SDK against the router (real Postgres; a stand-in endpoint behind
it, whose real counterpart the model tests run): what a tenant's code sees through the
router's relay, headers and error mapping, typed as the SDK types them."""

from __future__ import annotations

import uuid

import openai
import pytest

from shared.store import Store
from tests.integration.test_delivery import eventually
from tests.integration.test_router_service import (  # noqa: F401 (fixture)
    Upstream,
    _recorded,
    router,
)

ASK = [{"role": "user", "content": "Set an alarm at 06:30 labelled gym, please."}]
Router = tuple[str, str, Upstream, dict[str, uuid.UUID]]


def _sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def test_a_chat_and_a_stream_through_the_router(router: Router) -> None:  # noqa: F811
    url, key, _, _ = router
    async with _sdk(url, key) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model="bot", messages=ASK)
        done = raw.parse()
        assert done.choices[0].message.content == "Done."
        conversation = raw.headers["X-Retrace-Conversation"]
        assert uuid.UUID(conversation)
        # the next turn, named: the SDK sends the router's header back as the tenant's code
        # would (extra_headers)
        history = [*ASK, {"role": "assistant", "content": "Done."}]
        history.append({"role": "user", "content": "Make it 06:45."})
        again = await sdk.chat.completions.with_raw_response.create(
            model="bot",
            messages=history,  # type: ignore[arg-type]
            extra_headers={"X-Retrace-Conversation": conversation},
        )
        assert again.headers["X-Retrace-Conversation"] == conversation
        pieces = []
        stream = await sdk.chat.completions.create(model="bot", messages=ASK, stream=True)
        async for chunk in stream:
            pieces.extend(c.delta.content or "" for c in chunk.choices)
        assert "".join(pieces) == "Sure, done."
        models = await sdk.models.list()
        assert "bot" in [m.id for m in models.data]


async def test_a_stream_of_two_choices_with_its_usage_keeps_the_first_and_its_tokens(
    router: Router,  # noqa: F811
    store: Store,
) -> None:
    """A stream of `n` choices interleaves them: the router folded every chunk's delta into
    one reply ("SureAnother answer., done."), and recorded 0 tokens for any stream. The
    turn kept is the first choice, as for a whole reply, with the usage the caller asked
    for (`stream_options.include_usage`)."""
    url, key, _, _ = router
    async with _sdk(url, key) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="bot",
            messages=ASK,
            stream=True,
            n=2,
            stream_options={"include_usage": True},
        )
        texts = ["", ""]
        usage = None
        async for chunk in raw.parse():
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
            usage = chunk.usage or usage
        assert texts == ["Sure, done.", "Another answer."]
        assert usage is not None and usage.completion_tokens == 4
        with pytest.raises(openai.BadRequestError, match="stream_options"):
            await sdk.chat.completions.create(
                model="bot", messages=ASK, stream_options={"include_usage": True}
            )
    conversation = raw.headers["X-Retrace-Conversation"]

    async def recorded() -> bool:
        return bool(await _recorded(store, conversation))

    await eventually(recorded)
    [kept] = await _recorded(store, conversation)
    assert kept.messages[-1] == {"role": "assistant", "content": "Sure, done."}
    assert kept.tokens == 4


async def test_the_router_s_errors_are_the_sdk_s_typed_exceptions(router: Router) -> None:  # noqa: F811
    url, key, upstream, _ = router
    async with _sdk(url, "rt_acme_" + "x" * 32) as stranger:
        with pytest.raises(openai.AuthenticationError) as refused:
            await stranger.chat.completions.create(model="bot", messages=ASK)
        assert refused.value.status_code == 401
    async with _sdk(url, key) as sdk:
        with pytest.raises(openai.NotFoundError, match="no agent"):
            await sdk.chat.completions.create(model="no-such-agent", messages=ASK)
        with pytest.raises(openai.BadRequestError, match="messages"):
            await sdk.chat.completions.create(model="bot", messages=[])
        upstream.refused.add("smollm2")  # the endpoint refuses what it was asked for
        upstream.refused.add("bot--set_alarms--v1")
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.chat.completions.create(model="bot", messages=ASK)
        assert missing.value.body is not None and "globex" not in str(missing.value.body)
