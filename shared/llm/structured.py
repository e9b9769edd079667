"""Structured (JSON) replies from a model, validated, with the problem fed back on a bad one.

`ask_structured` sends a prompt, parses the reply with the caller's `parse` (which raises
`MalformedReply` saying what was wrong) and, while the reply is malformed, asks again with
that problem fed back, up to `max_attempts` replies; then `StructuredOutputError` with every
problem and the last reply. Only the latest bad reply stays in the conversation, so it stays
bounded. `decode_json` is the strict parser most callers need: one JSON object (a reply that
is exactly one ```json fence is unwrapped), checked against a msgspec type, nothing repaired.
Endpoint failures are the client's: `LLMError` after its retry policy, `LLMRequestError` at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from shared.envs.protocol import Message
from shared.errors import UNDECODABLE, PermanentError
from shared.llm.client import LLMClient
from shared.llm.openai_types import ChatRequest, ResponseFormat
from shared.logging import get_logger

T = TypeVar("T")
log = get_logger(__name__)

FEEDBACK = """\
Your reply could not be used: {problem}
Reply again with only the JSON object asked for, nothing else."""

_FENCE = re.compile(r"```(?:json)?\s*\n(.*)\n\s*```", re.DOTALL)


class MalformedReply(Exception):
    """A reply that is not what was asked for; the message is fed back to the model."""


class StructuredOutputError(PermanentError):
    """No usable reply in `max_attempts` tries; the message says what was wrong each time."""


@dataclass(frozen=True)
class AskConfig:
    model: str
    temperature: float = 0.7
    max_tokens: int = 1024
    """Reply budget; a reply cut off here is malformed JSON and asked for again."""
    max_attempts: int = 3
    """Replies asked for before `StructuredOutputError` (the first included)."""


def decode_json(reply: str, type_: type[T]) -> T:
    """The reply's JSON as `type_`: the whole reply, a fenced block, or a complete JSON object
    that the reply opens with and then follows with something else (small models add a stray
    `}` or a sentence); whatever is taken is validated against `type_`."""
    text = reply.strip()
    fenced = _FENCE.fullmatch(text)
    body = fenced.group(1) if fenced else text
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise MalformedReply(f"wrong JSON shape: {exc}") from exc
    except UNDECODABLE as exc:
        leading = _leading_object(body)
        if leading is None:
            raise MalformedReply(f"not valid JSON: {exc}") from exc
    try:
        return msgspec.json.decode(leading, type=type_)
    except UNDECODABLE as exc:
        raise MalformedReply(f"wrong JSON shape: {exc}") from exc


def _leading_object(text: str) -> str | None:
    """The complete JSON object `text` opens with, re-encoded; None if it opens with none."""
    if not text.startswith("{"):
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return json.dumps(value)


async def ask_structured(
    client: LLMClient,
    cfg: AskConfig,
    prompt: Sequence[Message],
    *,
    seed: int,
    parse: Callable[[str], T],
    what: str,
    error: type[StructuredOutputError] = StructuredOutputError,
) -> T:
    """`parse(reply)` of the first usable reply; `error` when none came."""
    messages = list(prompt)
    problems: list[str] = []
    reply = ""
    for attempt in range(1, cfg.max_attempts + 1):
        response = await client.chat(
            ChatRequest(
                model=cfg.model,
                messages=messages,
                temperature=cfg.temperature,
                max_tokens=cfg.max_tokens,
                seed=seed,
                response_format=ResponseFormat(type="json_object"),
            )
        )
        choice = response.choices[0] if response.choices else None
        reply = (choice.message.content or "") if choice else ""
        try:
            if not reply.strip():
                raise MalformedReply("the reply was empty")
            return parse(reply)
        except MalformedReply as exc:
            cut = (
                " (the reply was cut off at max_tokens)"
                if choice and choice.finish_reason == "length"
                else ""
            )
            problem = f"{exc}{cut}"
            problems.append(f"attempt {attempt}: {problem}")
            log.warning("structured reply malformed", what=what, attempt=attempt, problem=problem)
            messages = [
                *prompt,
                Message(role="assistant", content=reply),
                Message(role="user", content=FEEDBACK.format(problem=problem)),
            ]
    raise error(
        f"no valid {what} in {cfg.max_attempts} attempts: "
        f"{'; '.join(problems)}; last reply: {reply[:300]!r}"
    )
