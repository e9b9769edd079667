"""The helpdesk environment: seeded episodes of a retail support desk with a scripted user.

`reset(task, seed)` rebuilds the task's database from its `db_seed`; `seed` picks the user's
opening wording. `step` runs tool calls through `ToolBox.call` (a bad call is a tool message,
never an exception); a text with no tool calls goes to the scripted user, whose reply comes
back. A text sent alongside tool calls is kept for scoring but not shown to the user. The
episode ends when the user is done, after a successful transfer to a human agent, or after
`MAX_STEPS` assistant messages.
"""

from __future__ import annotations

from typing import Any

from shared.envs.helpdesk.db import Database, generate
from shared.envs.helpdesk.policy import POLICY, ROLE
from shared.envs.helpdesk.scoring import Event, score
from shared.envs.helpdesk.tasks import build_tasks
from shared.envs.helpdesk.tools import TRANSFER_TOOL, build_toolbox
from shared.envs.helpdesk.user import ScriptedUser
from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.envs.tools import CallRecord

MAX_STEPS = 60


class HelpdeskEpisode:
    def __init__(self, task: TaskSpec, seed: int) -> None:
        self.task = task
        self.db: Database = generate(int(task.data["db_seed"]))
        self._box = build_toolbox(self.db)
        self._user = ScriptedUser(task.data, seed)
        self.system_prompt = f"{ROLE}\n\n{POLICY}"
        self.tools: list[dict[str, Any]] = self._box.schemas()
        self.messages = [Message(role="user", content=self._user.opening)]
        self.events: list[Event] = [Event("user", self._user.opening)]
        """Everything that happened, in order: what scoring reads."""
        self.done = False
        self._steps = 0

    @property
    def calls(self) -> list[CallRecord]:
        """Every tool call so far, checked or not (the ToolBox's records)."""
        return self._box.calls

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult(messages=[], done=True)
        self._steps += 1
        text = assistant.content or ""
        out: list[Message] = []
        if assistant.tool_calls:
            if text:
                self.events.append(Event("assistant", text))
            for call in assistant.tool_calls:
                out.append(self._box.call(call))
                record = self._box.calls[-1]
                self.events.append(Event("call", call=record))
                self.done = self.done or (record.ok and record.name == TRANSFER_TOOL)
        else:
            self.events.append(Event("assistant", text))
            reply, user_done = self._user.reply(text, self._box.calls)
            self.events.append(Event("user", reply))
            out.append(Message(role="user", content=reply))
            self.done = user_done
        self.done = self.done or self._steps >= MAX_STEPS
        return StepResult(messages=out, done=self.done)

    def score(self) -> Score:
        return score(self.task.data, self.db, self.events)


class HelpdeskEnvironment:
    """A tau2-style retail customer-service domain: policy, database, scripted user."""

    name = "helpdesk"

    def tasks(self) -> list[TaskSpec]:
        return build_tasks()

    def reset(self, task: TaskSpec, seed: int) -> HelpdeskEpisode:
        return HelpdeskEpisode(task, seed)
