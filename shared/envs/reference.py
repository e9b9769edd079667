"""Reference demonstrations: a task's reference solution replayed through its own episode.

Built-in and synthetic tasks carry their reference solution in `data["reference"]` (the
assistant's side of a solved conversation). Replaying it through `step` gives a real, graded
trajectory of an agent that solves the task, recorded exactly as the runner records a model's
episode, so anything that reads trajectories can read it too.
"""

from __future__ import annotations

import time

import msgspec

from shared.envs.protocol import Environment, Message, TaskSpec, advance, close, grade, start
from shared.envs.runner import EpisodeResult, call_records


class MalformedReferenceError(ValueError):
    """A task's stored reference solution is not a list of assistant messages."""


def reference_of(task: TaskSpec) -> list[Message] | None:
    """The task's reference solution, or None when its environment ships none."""
    raw = task.data.get("reference")
    if raw is None:
        return None
    try:
        messages = msgspec.convert(raw, list[Message])
    except msgspec.ValidationError as exc:
        raise MalformedReferenceError(f"task {task.id}: malformed reference: {exc}") from exc
    wrong = [i for i, m in enumerate(messages) if m.role != "assistant"]
    if not messages or wrong:
        raise MalformedReferenceError(
            f"task {task.id}: a reference is a non-empty list of assistant messages; "
            f"entries {wrong} are not"
            if wrong
            else f"task {task.id}: the reference is empty"
        )
    return messages


def replay(env: Environment, task: TaskSpec, seed: int = 0) -> EpisodeResult | None:
    """The reference solution played through a fresh episode and graded; None without one.

    The replay stops where the episode ends, like a model's episode would."""
    reference = reference_of(task)
    if reference is None:
        return None
    episode = env.reset(task, seed)
    history: list[Message] = [
        Message(role="system", content=episode.system_prompt),
        *episode.messages,
    ]
    opening = len(history)
    started = time.perf_counter()
    turns = 0
    for message in reference:
        history.append(message)
        turns += 1
        result = episode.step(message)
        history.extend(result.messages)
        if result.done:
            break
    return EpisodeResult(
        messages=[msgspec.to_builtins(m) for m in history],
        score=episode.score(),
        latency_ms=(time.perf_counter() - started) * 1000,
        turns=turns,
        calls=call_records(episode),
        opening=opening,
    )


async def areplay(env: Environment, task: TaskSpec, seed: int = 0) -> EpisodeResult | None:
    """`replay` for environments whose episodes start asynchronously (HTTP, MCP); the episode
    is closed however the replay ends."""
    reference = reference_of(task)
    if reference is None:
        return None
    episode = await start(env, task, seed)
    try:
        history: list[Message] = [
            Message(role="system", content=episode.system_prompt),
            *episode.messages,
        ]
        opening = len(history)
        started = time.perf_counter()
        turns = 0
        for message in reference:
            history.append(message)
            turns += 1
            result = await advance(episode, message)
            history.extend(result.messages)
            if result.done:
                break
        return EpisodeResult(
            messages=[msgspec.to_builtins(m) for m in history],
            score=await grade(episode),
            latency_ms=(time.perf_counter() - started) * 1000,
            turns=turns,
            calls=call_records(episode),
            opening=opening,
        )
    finally:
        await close(episode)
