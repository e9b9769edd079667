"""Turning a chat request into prompt tokens with the tool-aware template."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from jinja2 import TemplateError

from shared.llm.openai_types import ChatRequest
from shared.llm.tool_format import OPEN, tool_template

TURN_END = "<|im_end|>"
"""The special token that closes a ChatML turn (our template's, and Qwen's own)."""


def first_turn_length(ids: list[int], end_id: int | None) -> int:
    """Length of a prompt's opening ChatML turn, through its first turn end (0 when it has
    none): the system turn every turn of an environment's episodes opens with."""
    return ids.index(end_id) + 1 if end_id is not None and end_id in ids else 0


class PromptBuilder:
    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        own = getattr(tokenizer, "chat_template", None) or ""
        # A model whose own template knows tools keeps it; others (SmolLM2) get ours.
        self.template = template or (own if "tools" in own else tool_template())

    def build(self, req: ChatRequest) -> tuple[list[int], str]:
        """Prompt token ids, and the text the reply is forced to start with (tool_choice)."""
        tools = (
            [_tool_as_vllm_gives_it(t) for t in req.tools]
            if req.tools and req.tool_choice != "none"
            else None
        )
        messages = [msgspec.to_builtins(m) for m in req.messages]
        for m in messages:
            m.setdefault("content", "")
            if m["content"] is None:
                m["content"] = ""
            if m.get("role") == "assistant":
                _arguments_as_objects(m)
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=True,
            )
        except (TemplateError, TypeError, ValueError, RecursionError) as exc:
            # a tool's schema of a shape the template does not take (parameters that are
            # not an object, a description that is not text): the caller's, not a 500
            raise Unrenderable(
                f"this model's chat template cannot render the request: {str(exc)[:300]}"
            ) from exc
        forced = _forced_prefix(req.tool_choice) if tools else ""
        try:
            ids = list(self.tokenizer(text + forced, add_special_tokens=False)["input_ids"])
        except (TypeError, ValueError) as exc:
            # text the tokenizer cannot take: a lone surrogate (`"\ud83d"` in a past call's
            # arguments, written out raw by the template's `tojson`) was a 500; vLLM's 400
            raise Unrenderable(
                f"the rendered prompt cannot be tokenized: {str(exc)[:200]}"
            ) from exc
        return ids, forced


def _tool_as_vllm_gives_it(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM (0.32) hands it to a template: its function's `name`, `description`
    and `parameters` in that order, the last two null when absent, `strict` and
    `defer_loading` only when set, nothing else. Qwen's template writes each tool as JSON,
    so a tool given in another order, or without a description, was a different prompt
    under `serve-model` than under vLLM (session 33's review)."""
    given = tool.get("function")
    function: dict[str, Any] = given if isinstance(given, dict) else {}
    out: dict[str, Any] = {
        "name": function.get("name"),
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    deferred = function.get("defer_loading")
    if deferred is None:
        deferred = tool.get("defer_loading")
    for name, value in (("strict", function.get("strict")), ("defer_loading", deferred)):
        if value is not None:
            out[name] = value
    shown: dict[str, Any] = {"type": "function", "function": out}
    if tool.get("defer_loading") is not None:
        shown["defer_loading"] = tool["defer_loading"]
    return shown


def _arguments_as_objects(message: dict[str, Any]) -> None:
    """A past call's arguments as the object their JSON text holds, as vLLM hands them to a
    template: Qwen's (like most tool-aware templates) writes `arguments | tojson`, which
    would quote the text a second time and show the model its own calls in a form it never
    writes. Arguments that are empty, not JSON, or JSON but not an object become `{}`, as
    vLLM (0.32) makes them, so a prompt is the same token for token under either server
    (what GRPO trains on is what the served adapter will be shown)."""
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or isinstance(function.get("arguments"), dict):
            continue
        try:
            value = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError, RecursionError):
            value = None
        function["arguments"] = value if isinstance(value, dict) else {}


class Unrenderable(ValueError):
    """A request the model's chat template refused."""


def _forced_prefix(choice: str | dict[str, Any] | None) -> str:
    """`required` starts the reply inside a tool call; a named function also fixes its name."""
    if choice == "required":
        return OPEN + "\n"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str) and name:
            return OPEN + '\n{"name": ' + json.dumps(name) + ', "arguments": '
    return ""
