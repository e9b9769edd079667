"""`judge` checks of MCP tasks: a criterion no deterministic check can test ("the reply
explains which note was deleted and why"), graded by a model like every other model retrace
calls: a model name on the OpenAI-compatible endpoint (`RETRACE_MODEL_URL`, its key and
timeout), or on the `url` the environment file gives. The judge sees the request, the agent's
tool calls with their results (cut to a budget) and its final reply, and answers JSON
`{"passed": bool, "reason": str}`; a reply that is not that is asked for again with the problem
named (`ask_structured`), and after `max_attempts` the episode's scoring fails with the
replies quoted: the episode is stored ungraded, an environment error, not an agent failure.
"""

from __future__ import annotations

import json

import msgspec

from shared.config import ModelConfig, load_config
from shared.envs.mcptools.spec import JudgeSpec
from shared.envs.protocol import Message
from shared.envs.tools import CallRecord
from shared.llm.client import LLMClient
from shared.llm.structured import AskConfig, StructuredOutputError, ask_structured, decode_json

SYSTEM = """\
You grade one episode of an AI assistant that used tools for a user. Decide whether the \
episode meets the criterion, judging only from what is shown. Reply with only a JSON object: \
{"passed": true or false, "reason": "one short sentence"}."""


class JudgeCheckError(StructuredOutputError):
    """The judge gave no usable verdict; the message quotes what it said."""


class Verdict(msgspec.Struct, frozen=True):
    passed: bool
    reason: str = ""


class _Endpoint(msgspec.Struct, kw_only=True, frozen=True):
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)


def endpoint(spec: JudgeSpec) -> ModelConfig:
    """The endpoint the judge is asked on: the services' own (`RETRACE_MODEL_*`), with the
    environment file's `url` instead when it names one."""
    configured = load_config(_Endpoint).model
    return msgspec.structs.replace(configured, url=spec.url) if spec.url else configured


def prompt(
    spec: JudgeSpec, criterion: str, request: str, calls: list[CallRecord], reply: str
) -> list[Message]:
    """What the judge is shown, within `spec.max_transcript_chars`."""
    lines = []
    for call in calls:
        outcome = (
            f"result: {str(call.result)[:300]}"
            if call.ok
            else f"refused: {(call.error or '')[:300]}"
        )
        lines.append(f"- {call.name}({json.dumps(call.arguments or {})[:300]}) {outcome}")
    transcript = "\n".join(lines) or "(no tool call)"
    budget = spec.max_transcript_chars
    body = (
        f"The user asked:\n{request[: budget // 4]}\n\n"
        f"The assistant's tool calls:\n{transcript[: budget // 2]}\n\n"
        f"The assistant's final reply:\n{reply[: budget // 4] or '(none)'}\n\n"
        f"Criterion: {criterion}"
    )
    return [Message(role="system", content=SYSTEM), Message(role="user", content=body)]


async def judged(
    spec: JudgeSpec,
    criterion: str,
    request: str,
    calls: list[CallRecord],
    reply: str,
    *,
    seed: int = 0,
) -> Verdict:
    """The judge's verdict on one criterion of one episode."""
    ask = AskConfig(
        model=spec.model,
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        max_attempts=spec.max_attempts,
    )
    async with LLMClient.for_endpoint(endpoint(spec)) as client:
        return await ask_structured(
            client,
            ask,
            prompt(spec, criterion, request, calls, reply),
            seed=seed,
            parse=lambda text: decode_json(text, Verdict),
            what=f"a verdict on {criterion!r}",
            error=JudgeCheckError,
        )
