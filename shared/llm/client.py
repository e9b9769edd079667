"""The one client for every model call: async, OpenAI-compatible, with timeouts and a named
retry policy. Works the same against `retrace serve-model`, vLLM and hosted endpoints."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import msgspec

from shared.config import ModelConfig
from shared.envs.protocol import Message, ToolCall, ToolCallFunction
from shared.errors import UNDECODABLE, PermanentError, RetryableError
from shared.llm.openai_types import (
    ChatRequest,
    ChatResponse,
    Choice,
    CompletionRequest,
    CompletionResponse,
    ResponseMessage,
)
from shared.llm.tool_format import offered_tools, parse_reply
from shared.retry import RetryPolicy, with_retry


class LLMError(RetryableError):
    """The endpoint failed in a way a later attempt may not (5xx, timeout, connection)."""


class LLMRequestError(PermanentError):
    """The endpoint rejected the request (4xx): retrying the same request cannot help."""


CHAT_RETRY = RetryPolicy(
    "llm-chat",
    attempts=4,
    base_delay=0.5,
    max_delay=8.0,
    timeout=300.0,
    retry_on=(LLMError, aiohttp.ClientConnectionError, asyncio.TimeoutError),
)
"""Generation on a loaded CPU server can take minutes; a dead endpoint fails in about 15 s."""
ADMIN_RETRY = RetryPolicy(
    "llm-admin",
    attempts=3,
    base_delay=0.5,
    max_delay=4.0,
    timeout=120.0,
    retry_on=(LLMError, aiohttp.ClientConnectionError, asyncio.TimeoutError),
)


SESSION_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
"""No total limit from aiohttp itself (its default is 300 s, which silently capped every
longer `request_timeout`): the retry policy's timeout bounds each call."""


class LLMClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "EMPTY",
        admin_key: str | None = None,
        chat_retry: RetryPolicy = CHAT_RETRY,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self.admin_headers = {**self.headers, "Authorization": f"Bearer {admin_key or api_key}"}
        """For loading and unloading adapters (the endpoint's admin key, where it has one)."""
        self.chat_retry = chat_retry
        self._session = session
        self._owned = session is None

    @classmethod
    def for_endpoint(cls, cfg: ModelConfig) -> LLMClient:
        """A client of the configured endpoint whose generation calls wait up to
        `cfg.request_timeout` per attempt (`RETRACE_MODEL_REQUEST_TIMEOUT`): every service
        builds its client here, so the setting holds for all of them."""
        policy = dataclasses.replace(CHAT_RETRY, timeout=cfg.request_timeout)
        return cls(cfg.url, api_key=cfg.api_key, admin_key=cfg.admin_key, chat_retry=policy)

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256), timeout=SESSION_TIMEOUT
            )
            self._owned = True
        return self._session

    async def close(self) -> None:
        if self._owned and self._session is not None:
            await self._session.close()

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """One chat completion; tool calls a backend left in the text are parsed (never guessed)."""
        body = msgspec.json.encode(msgspec.structs.replace(request, stream=False))
        raw = await with_retry(self.chat_retry, lambda: self._post("/chat/completions", body))
        try:
            response = msgspec.json.decode(raw, type=ChatResponse)
        except UNDECODABLE as exc:
            raise LLMError(f"unreadable chat response: {exc}") from exc
        return _normalise(response, offered_tools(request))

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """One plain completion (a prompt of text or of token ids)."""
        body = msgspec.json.encode(msgspec.structs.replace(request, stream=False))
        raw = await with_retry(self.chat_retry, lambda: self._post("/completions", body))
        try:
            return msgspec.json.decode(raw, type=CompletionResponse)
        except UNDECODABLE as exc:
            raise LLMError(f"unreadable completion response: {exc}") from exc

    async def models(self) -> list[str]:
        raw = await with_retry(ADMIN_RETRY, lambda: self._request("GET", "/models", None))
        try:
            return [str(card["id"]) for card in msgspec.json.decode(raw)["data"]]
        except (*UNDECODABLE, KeyError, TypeError) as exc:
            raise LLMError(f"unreadable model list: {exc!r}") from exc

    async def load_adapter(self, name: str, path: str) -> None:
        body = msgspec.json.encode({"lora_name": name, "lora_path": path})
        await with_retry(ADMIN_RETRY, lambda: self._post("/load_lora_adapter", body, admin=True))

    async def unload_adapter(self, name: str) -> None:
        body = msgspec.json.encode({"lora_name": name})
        await with_retry(ADMIN_RETRY, lambda: self._post("/unload_lora_adapter", body, admin=True))

    async def _post(self, path: str, body: bytes, *, admin: bool = False) -> bytes:
        return await self._request("POST", path, body, admin=admin)

    async def _request(
        self, method: str, path: str, body: bytes | None, *, admin: bool = False
    ) -> bytes:
        headers = self.admin_headers if admin else self.headers
        async with self._http().request(
            method, self.base_url + path, data=body, headers=headers
        ) as resp:
            data = await resp.read()
            if resp.status >= 500 or resp.status == 429:
                raise LLMError(f"{method} {path}: HTTP {resp.status}: {_error_text(data)}")
            if resp.status >= 400:
                raise LLMRequestError(f"{method} {path}: HTTP {resp.status}: {_error_text(data)}")
            return data


def _error_text(data: bytes) -> str:
    try:
        return str(msgspec.json.decode(data)["error"]["message"])
    except (*UNDECODABLE, KeyError, TypeError):
        return data[:500].decode("utf-8", errors="replace")


def _normalise(response: ChatResponse, tools: tuple[str, ...]) -> ChatResponse:
    """Backends without a tool parser (or with one that gave up) return the calls as text:
    tagged, fenced or bare (see tool_format)."""
    if not tools:
        return response
    choices = []
    for choice in response.choices:
        msg = choice.message
        parsed = parse_reply(msg.content, tools) if msg.content and not msg.tool_calls else None
        if parsed is None or parsed.form is None:
            choices.append(choice)
            continue
        calls = [
            ToolCall(
                id=f"call_{choice.index}_{i}",
                function=ToolCallFunction(name=c.name, arguments=c.arguments),
            )
            for i, c in enumerate(parsed.calls)
        ]
        message = ResponseMessage(
            content=parsed.content,
            tool_calls=calls or None,
            tool_call_errors=[f"{m.error}: {m.raw[:500]}" for m in parsed.malformed] or None,
            tool_call_format=parsed.form,
        )
        choices.append(
            Choice(
                index=choice.index,
                message=message,
                finish_reason="tool_calls" if calls else choice.finish_reason,
                logprobs=choice.logprobs,
            )
        )
    return msgspec.structs.replace(response, choices=choices)


def as_message(message: ResponseMessage) -> Message:
    """The assistant message to append to a conversation."""
    return Message(role="assistant", content=message.content, tool_calls=message.tool_calls)
