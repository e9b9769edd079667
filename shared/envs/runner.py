"""Running one episode: an agent (model + system prompt) against an environment, turn by turn,
through the OpenAI-compatible client. A failed model call ends the episode with the error
recorded, scored as it stands (a bad rollout is data). An environment that fails (its reset,
a step or its scoring raises) ends the episode *ungraded*: that says nothing about the agent,
so the result is marked `env_error` and every statistic leaves it out."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.envs.guidance import hint_of, with_guidance
from shared.envs.protocol import (
    Environment,
    Episode,
    Message,
    Score,
    TaskSpec,
    advance,
    close,
    grade,
    start,
)
from shared.errors import PermanentError, RetryableError
from shared.llm.client import LLMClient, LLMError, as_message
from shared.llm.openai_types import ChatRequest
from shared.logging import get_logger
from shared.messages import Sampling

log = get_logger(__name__)
DEFAULT_MAX_TURNS = 12
DEFAULT_SAMPLING = Sampling()


@dataclass
class EpisodeResult:
    messages: list[dict[str, Any]]
    """The whole conversation, system prompt first; assistant turns may carry
    `tool_call_errors` (calls the model wrote that could not be parsed) and
    `tool_call_format` (how it wrote its calls: tagged, fenced or bare)."""
    score: Score
    tokens: int = 0
    latency_ms: float = 0.0
    turns: int = 0
    error: str | None = None
    model_error: bool = False
    """The episode ended because a model endpoint failed (the agent's, or one the environment
    calls, such as a simulated user's): not the agent's doing."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Each tool call: name, arguments, ok, error."""
    env_error: bool = False
    """The environment failed: `score` is a placeholder, never a grade of the agent."""
    opening: int = 0
    """Leading `messages` the environment wrote (the system turn and the episode's first
    messages); the agent's own turns start after them."""


def ungraded(reason: str) -> Score:
    """The placeholder score of an episode whose environment failed."""
    return Score(reward=0.0, success=False, notes=[reason])


def call_records(episode: object) -> list[dict[str, Any]]:
    """The tool calls an episode received (its `calls`, when it records them), as stored."""
    return [
        {"name": c.name, "arguments": c.arguments, "ok": c.ok, "error": c.error}
        for c in getattr(episode, "calls", [])
    ]


async def run_episode(
    client: LLMClient,
    model: str,
    env: Environment,
    task: TaskSpec,
    seed: int,
    *,
    agent_prompt: str = "",
    sampling: Sampling = DEFAULT_SAMPLING,
    max_turns: int = DEFAULT_MAX_TURNS,
    hinted: bool = False,
) -> EpisodeResult:
    """One episode; `hinted` appends the episode's hint, if it has one, to the system turn.

    A `RetryableError` from the environment on reset (an endpoint it depends on is down)
    propagates, so the caller retries the episode."""
    try:
        episode = await start(env, task, seed)
    except RetryableError:
        raise
    except Exception as exc:  # the environment's code (a plug-in's): its failure is data
        log.exception("environment reset failed", task=task.id)
        reason = f"environment reset failed: {exc!r}"
        return EpisodeResult([], ungraded(reason), error=reason, env_error=True)
    try:
        system = "\n\n".join(p for p in (agent_prompt.strip(), episode.system_prompt.strip()) if p)
        if hinted:
            system = with_guidance(system, hint_of(episode))
        history: list[Message] = [Message(role="system", content=system), *episode.messages]
        record: list[dict[str, Any]] = [msgspec.to_builtins(m) for m in history]
        opening = len(record)
        started = time.perf_counter()
        tokens = turns = 0
        error: str | None = None
        model_error = env_error = False
        for turn in range(max_turns):
            request = ChatRequest(
                model=model,
                messages=history,
                tools=episode.tools or None,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=None if sampling.seed is None else sampling.seed + turn,
            )
            try:
                response = await client.chat(request)
            except PermanentError as exc:
                # The endpoint refused this conversation (e.g. it outgrew the context window):
                # the episode ends here and is scored as it stands.
                error = f"model refused turn {turn + 1}: {exc}"
                log.warning("episode ended by a refused model call", task=task.id, error=str(exc))
                break
            except (LLMError, OSError, TimeoutError) as exc:
                error = f"model call failed on turn {turn + 1}: {exc}"
                model_error = True
                log.warning("episode ended by a model error", task=task.id, error=str(exc))
                break
            tokens += response.usage.completion_tokens
            turns += 1
            reply = response.choices[0].message
            assistant = as_message(reply)
            history.append(assistant)
            entry = msgspec.to_builtins(assistant)
            if reply.tool_call_errors:
                entry["tool_call_errors"] = list(reply.tool_call_errors)
            if reply.tool_call_format:
                entry["tool_call_format"] = reply.tool_call_format
            record.append(entry)
            try:
                result = await advance(episode, assistant)
            except RetryableError as exc:
                # An endpoint the environment depends on (a simulated user's model) failed: like a
                # model error, not the agent's doing.
                error = f"environment call failed on turn {turn + 1}: {exc}"
                model_error = True
                log.warning(
                    "episode ended by an environment endpoint error", task=task.id, error=str(exc)
                )
                break
            except Exception as exc:  # the environment's code (a plug-in's): its failure is data
                error = f"environment failed on turn {turn + 1}: {exc!r}"
                env_error = True
                log.exception("environment step failed", task=task.id)
                break
            history.extend(result.messages)
            record.extend(msgspec.to_builtins(m) for m in result.messages)
            if result.done:
                break
        score = ungraded(error or "") if env_error else None
        if score is None:
            try:
                score = await grade(episode)
            except RetryableError:
                raise
            except Exception as exc:  # the environment's scoring code
                error = f"environment scoring failed: {exc!r}"
                env_error = True
                score = ungraded(error)
                log.exception("environment scoring failed", task=task.id)
        return EpisodeResult(
            record,
            score,
            tokens,
            (time.perf_counter() - started) * 1000,
            turns,
            error,
            model_error,
            call_records(episode),
            env_error,
            opening,
        )
    finally:
        await _release(episode, task)


async def _release(episode: Episode, task: TaskSpec) -> None:
    """Close the episode (a tool server's process or connection); a failure to close is logged,
    never allowed to hide the episode's result."""
    try:
        await close(episode)
    except Exception:  # the environment's cleanup code
        log.exception("closing an episode failed", task=task.id)
