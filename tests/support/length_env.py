"""A one-turn environment whose reward grows with the reply's length (capped), so a random
tiny model's groups have reward variance: a fake for GRPO tests. Its real counterparts are
the toolbox, helpdesk and synthetic environments, trained on in the model tests."""

from __future__ import annotations

from typing import Any

from shared.envs.protocol import Message, Score, StepResult, TaskSpec


class LengthEpisode:
    system_prompt = "Answer briefly."
    tools: list[dict[str, Any]] = []

    def __init__(self, task: TaskSpec, target: int) -> None:
        self.messages = [Message(role="user", content=task.data["request"])]
        self.target = target
        self.reply = ""

    def step(self, assistant: Message) -> StepResult:
        self.reply = assistant.content or ""
        return StepResult(messages=[], done=True)

    def score(self) -> Score:
        reward = min(1.0, len(self.reply) / self.target)
        return Score(reward=reward, success=reward >= 1.0)


class LengthEnvironment:
    name = "length"

    def __init__(self, tasks: int = 6, target: int = 200) -> None:
        self.target = target
        self._tasks = [
            TaskSpec(
                id=f"len-{i}",
                kind="length",
                split="train" if i % 3 else "test",
                data={"request": f"Say something about the number {i}."},
            )
            for i in range(tasks)
        ]

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> LengthEpisode:
        return LengthEpisode(task, self.target)
