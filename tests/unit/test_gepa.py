"""GEPA against a fake endpoint: the agent is polite only when its instructions say so, the
environment rewards politeness, and the reflection model proposes exactly that rule. The
search must find it, score it on the Pareto set, keep to its budget, and survive unusable
reflections. The search is the `gepa` package's; these tests check what retrace gives it
(episodes, feedback, the reflection model, the budget, the checkpoint)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.train.gepa import GEPA, GEPASettings, SearchCheckpoint, UnreadableCheckpointError
from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.errors import RetryableError
from tests.support.fake_chat import FakeJudge, Serve


class PoliteEpisode:
    system_prompt = "You help users."
    tools: list[dict[str, Any]] = []

    def __init__(self, task: TaskSpec) -> None:
        self.messages = [Message(role="user", content=task.data["request"])]
        self.reply = ""

    def step(self, assistant: Message) -> StepResult:
        self.reply = assistant.content or ""
        return StepResult(messages=[], done=True)

    def score(self) -> Score:
        polite = "please" in self.reply
        return Score(
            reward=1.0 if polite else 0.0,
            success=polite,
            notes=[] if polite else ["missed: polite_reply"],
        )


class PoliteEnvironment:
    name = "polite"

    def tasks(self) -> list[TaskSpec]:
        return [
            TaskSpec(id=f"p-{i:02d}", kind="p", split="train", data={"request": f"Help {i}"})
            for i in range(12)
        ]

    def reset(self, task: TaskSpec, seed: int) -> PoliteEpisode:
        return PoliteEpisode(task)


RULE = "```\nAlways BE POLITE: say please.\n```"


def answer(reflections: list[str]) -> Any:
    def reply(body: dict[str, Any]) -> str:
        if body["model"] == "reflector":
            return reflections.pop(0) if reflections else "```\nBe brief.\n```"
        system = body["messages"][0]["content"]
        return "please, it is done" if "BE POLITE" in system else "done"

    return reply


def settings(budget: int) -> GEPASettings:
    return GEPASettings(
        budget=budget, minibatch=2, pareto=4, reflection_model="reflector", agent_model="agent"
    )


def agent_requests(fake: FakeJudge) -> int:
    return sum(1 for r in fake.requests if r["model"] == "agent")


async def test_gepa_finds_the_rule_the_failures_call_for(serve: Serve) -> None:
    fake = FakeJudge(answer([RULE]))
    gepa = GEPA(await serve(fake), PoliteEnvironment(), settings(budget=20))
    result = await gepa.optimise(PoliteEnvironment().tasks(), "You are a helpful assistant.")
    assert result.seed_score == 0.0 and result.score == 1.0
    assert "BE POLITE" in result.prompt and result.accepted >= 1
    assert [c.parent for c in result.candidates][:2] == [None, 0]
    # every episode is counted, and no iteration ran past the budget
    assert result.rollouts == agent_requests(fake) <= 20
    reflections = [r for r in fake.requests if r["model"] == "reflector"]
    shown = reflections[0]["messages"][-1]["content"]
    assert "You are a helpful assistant." in shown and "missed: polite_reply" in shown


async def test_a_useless_reflection_is_not_accepted_and_garbage_is_survived(serve: Serve) -> None:
    fake = FakeJudge(answer(["not a prompt at all {", "```\nBe brief.\n```"]))
    gepa = GEPA(await serve(fake), PoliteEnvironment(), settings(budget=16))
    result = await gepa.optimise(PoliteEnvironment().tasks(), "seed")
    assert result.prompt == "seed" and result.accepted == 0 and result.score == 0.0
    assert result.rollouts == agent_requests(fake) <= 16


def test_a_budget_too_small_for_the_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot even score the seed"):
        GEPASettings(budget=3, pareto=4)


async def test_a_stopped_search_resumes_from_its_checkpoint(serve: Serve, tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if body["model"] == "reflector":
            return RULE
        return "please, it is done" if "BE POLITE" in body["messages"][0]["content"] else "done"

    tasks = PoliteEnvironment().tasks()
    fake = FakeJudge(reply, delay=0.02)
    client = await serve(fake)
    checkpoint = SearchCheckpoint(tmp_path)
    stopped = asyncio.create_task(
        GEPA(client, PoliteEnvironment(), settings(budget=48)).optimise(tasks, "seed", checkpoint)
    )
    while (checkpoint.iterations() or 0) < 2:
        assert not stopped.done(), "the search ended before it could be stopped"
        await asyncio.sleep(0.005)
    stopped.cancel()  # a worker dies mid-iteration: that iteration's work is lost
    with pytest.raises(asyncio.CancelledError):
        await stopped
    at = checkpoint.iterations()
    assert at is not None and at >= 2
    before = agent_requests(fake)

    resumed = await GEPA(client, PoliteEnvironment(), settings(budget=48)).optimise(
        tasks, "seed", checkpoint
    )
    assert resumed.resumes == [at]
    assert resumed.score == 1.0 and "BE POLITE" in resumed.prompt
    assert resumed.iterations > at
    # the resumed search did not start over: the seed's Pareto scoring was not paid again,
    # and the budget counts what the whole search spent
    assert agent_requests(fake) - before <= 48 - 4
    # every episode played is counted, those of the lost iteration and gepa's re-scoring of
    # the seed on resume included, and the whole search kept to its budget; an episode cut
    # off by the stop counts even if its request never reached the endpoint (at most the
    # episodes in flight then)
    assert agent_requests(fake) <= resumed.rollouts <= 48
    assert resumed.rollouts - agent_requests(fake) <= settings(48).concurrency


async def test_a_reflection_model_that_never_answers_fails_the_search(serve: Serve) -> None:
    """gepa logs a failed reflection and goes on; a search in which none ever answered is
    not a result (it would report the seed prompt as optimised)."""

    def reply(body: dict[str, Any]) -> str:
        if body["model"] == "reflector":
            raise web.HTTPNotFound(text='{"error": {"message": "no model reflector"}}')
        return "done"

    gepa = GEPA(await serve(FakeJudge(reply)), PoliteEnvironment(), settings(budget=16))
    with pytest.raises(RetryableError, match="never answered"):
        await gepa.optimise(PoliteEnvironment().tasks(), "seed")


class BrokenStepEnvironment(PoliteEnvironment):
    """Task p-03's episodes raise in `step`: an environment error, not a zero."""

    def reset(self, task: TaskSpec, seed: int) -> PoliteEpisode:
        episode = PoliteEpisode(task)
        if task.id == "p-03":

            def broken(assistant: Message) -> StepResult:
                raise ConnectionError("the booking backend went away")

            episode.step = broken  # type: ignore[method-assign]
        return episode


async def test_an_episode_the_environment_could_not_grade_stops_the_search(
    serve: Serve,
) -> None:
    gepa = GEPA(await serve(FakeJudge(answer([RULE]))), BrokenStepEnvironment(), settings(32))
    with pytest.raises(RetryableError, match=r"environment failed.*p-03.*backend went away"):
        await gepa.optimise(PoliteEnvironment().tasks(), "seed")


def test_an_unreadable_checkpoint_is_refused_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "gepa_state.bin").write_bytes(b"{not a pickle")
    with pytest.raises(UnreadableCheckpointError, match=r"gepa_state\.bin"):
        SearchCheckpoint(tmp_path).iterations()
