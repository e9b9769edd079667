"""The OpenAI-compatible API as msgspec Structs, shared by our server and our client: chat
completions, (token) completions with vLLM's `return_token_ids`, models and adapters.

Only what retrace uses is typed; unknown request fields are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from shared.envs.protocol import Message, ToolCall


class ResponseFormat(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StreamOptions(msgspec.Struct, kw_only=True, frozen=True):
    include_usage: bool | None = None
    """A last chunk, before `[DONE]`, with no choices and the request's `usage` (every other
    chunk then carries `"usage": null`), as OpenAI's API sends it."""


MAX_N = 16
"""Choices one chat request may ask for (serve-model's and the router's limit)."""


class ChatRequest(msgspec.Struct, kw_only=True, frozen=True):
    """POST /v1/chat/completions body."""

    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """auto | none | required | {"type": "function", "function": {"name": ...}}"""
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    top_k: int | None = None
    """vLLM extension (-1 or 0: off), as `min_p` and `repetition_penalty`."""
    min_p: float | None = None
    repetition_penalty: float | None = None
    parallel_tool_calls: bool | None = None
    """False: one tool call a reply at most."""

    def __post_init__(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                # a 0 is "unset" to vLLM (`max_completion_tokens or max_tokens`) and a
                # negative count would credit a token budget: refused, as OpenAI does
                raise ValueError(f"{name} must be at least 1, not {value}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be between -2 and 2, not {value}")
        for i, tool in enumerate(self.tools or []):
            function = tool.get("function")
            if tool.get("type") != "function" or not isinstance(function, dict):
                raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError(f"tools[{i}].function needs a `name`")
            if not isinstance(function.get("description", ""), str | None):
                raise ValueError(f"tools[{i}].function.description must be text")
            if not isinstance(function.get("parameters", {}), dict | None):
                raise ValueError(f"tools[{i}].function.parameters must be a JSON Schema object")
        choice = self.tool_choice
        if isinstance(choice, str) and choice not in ("auto", "none", "required"):
            raise ValueError(
                f"tool_choice must be auto, none, required or a function, not {choice!r}"
            )
        named = choice.get("function") if isinstance(choice, dict) else None
        if isinstance(choice, dict) and not (
            isinstance(named, dict) and isinstance(named.get("name"), str)
        ):
            raise ValueError(
                'tool_choice names a function as {"type": "function", "function": {"name": ...}}'
            )


class TopLogprob(msgspec.Struct, kw_only=True, frozen=True):
    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, kw_only=True, frozen=True):
    token: str
    logprob: float
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class ChoiceLogprobs(msgspec.Struct, kw_only=True, frozen=True):
    content: list[TokenLogprob]


class ResponseMessage(msgspec.Struct, kw_only=True, frozen=True):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_errors: list[str] | None = None
    """retrace extension: tool calls the model wrote but that could not be parsed, with why."""
    tool_call_format: str | None = None
    """retrace extension: how the calls were written (`tagged`, `fenced` or `bare`)."""


class Choice(msgspec.Struct, kw_only=True, frozen=True):
    index: int
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResponse(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"


class CompletionRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """POST /v1/completions body. A prompt of token ids is generated from as it is (training
    samples this way, so the loss sees exactly the tokens the endpoint saw and wrote)."""

    model: str
    prompt: list[int] | str
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    """vLLM extension (-1 or 0: off). Unset: the server's default, which vLLM takes from the
    model's generation config."""
    min_p: float | None = None
    repetition_penalty: float | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    """vLLM extension: also stop on these tokens (kept in `token_ids`)."""
    logprobs: int | None = None
    """Log-probabilities of the sampled tokens, with this many alternatives each."""
    return_token_ids: bool = False
    """vLLM extension: each choice carries `token_ids`, the stop token included."""
    stream: bool = False


class CompletionLogprobs(msgspec.Struct, kw_only=True, frozen=True):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None


class CompletionChoice(msgspec.Struct, kw_only=True, frozen=True):
    index: int
    text: str
    finish_reason: str | None
    """stop | length, or a server's own (vLLM: abort, error)"""
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None


class CompletionResponse(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    object: Literal["text_completion"] = "text_completion"


class LoadAdapterRequest(msgspec.Struct, kw_only=True, frozen=True):
    """POST /v1/load_lora_adapter (vLLM's shape)."""

    lora_name: str
    lora_path: str


class UnloadAdapterRequest(msgspec.Struct, kw_only=True, frozen=True):
    lora_name: str


class ModelCard(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    created: int
    owned_by: str = "retrace"
    root: str | None = None
    parent: str | None = None
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class ErrorBody(msgspec.Struct, kw_only=True, frozen=True):
    """OpenAI's error object: `param` names the request field at fault where one is known
    (null otherwise, as OpenAI sends it); `code` is the HTTP status."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(msgspec.Struct, kw_only=True, frozen=True):
    error: ErrorBody
