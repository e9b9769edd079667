"""Gold replay: a task's gold actions played through the adapter, scored by tau2's evaluator.

The agent's gold actions go in as assistant tool-call messages through `Episode.step`, one call
per message; the user's gold actions (telecom: things done on the phone) are played by a
scripted user, asked to by an assistant message. A last assistant message says the task's
`communicate_info`, and the scripted user ends the conversation with `###STOP###`: no model is
called anywhere. A correct adapter scores 1.0 on every task whose criteria it can express.
"""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any

from shared.envs.protocol import Message, Score, TaskSpec, ToolCall, ToolCallFunction
from shared.envs.tau2.env import Tau2Environment
from shared.envs.tau2.episode import TRANSFER_TOOL, Tau2Episode
from shared.envs.tau2.tasks import tau2_task
from shared.envs.tau2.user import ScriptedUser

OPENING = "Hi, I need help with my account."
ASK_USER = "Please do the following on your side and tell me when it is done."
USER_DONE = "Done."


def gold_actions(env: Tau2Environment, task: TaskSpec) -> list[Any]:
    criteria = tau2_task(env.domain, task.id).evaluation_criteria
    return list(criteria.actions or []) if criteria is not None else []


def replay_episode(
    env: Tau2Environment, task: TaskSpec, actions: list[Any] | None = None
) -> Tau2Episode:
    """The episode after playing `actions` (default: the task's gold actions) and the final
    message; `score()` grades it."""
    from tau2.data_model.message import ToolCall as Tau2ToolCall
    from tau2.data_model.message import UserMessage

    actions = gold_actions(env, task) if actions is None else actions
    turns = [(who, list(group)) for who, group in groupby(actions, key=lambda a: a.requestor)]
    script: list[Any] = [UserMessage(role="user", content=OPENING)]
    for who, group in turns:
        if who == "user":
            for i, action in enumerate(group):
                call = Tau2ToolCall(
                    id=f"user-{action.action_id or i}",
                    name=action.name,
                    arguments=action.arguments,
                    requestor="user",
                )
                script.append(UserMessage(role="user", tool_calls=[call]))
            script.append(UserMessage(role="user", content=USER_DONE))
    episode = env.episode(task, lambda _task, _tools: ScriptedUser(script))
    final = _final_text(env, task)
    for who, group in turns:
        if who == "user":
            episode.step(Message(role="assistant", content=ASK_USER))
            continue
        for i, action in enumerate(group):
            message = _call_message(action, i)
            if action.name == TRANSFER_TOOL:
                # A transfer ends the episode: what must be said goes with it (tau2 reads the
                # text of tool-call messages too).
                message = Message(role="assistant", content=final, tool_calls=message.tool_calls)
                final = ""
            episode.step(message)
    if final:
        episode.step(Message(role="assistant", content=final))
    return episode


def gold_replay(env: Tau2Environment, task: TaskSpec) -> Score:
    """tau2's score of the task's gold actions played through the adapter."""
    return replay_episode(env, task).score()


def _final_text(env: Tau2Environment, task: TaskSpec) -> str:
    criteria = tau2_task(env.domain, task.id).evaluation_criteria
    info = list(criteria.communicate_info or []) if criteria is not None else []
    return " ".join(str(i) for i in info) or "Is there anything else I can help you with?"


def _call_message(action: Any, index: int) -> Message:
    call = ToolCall(
        id=f"gold-{action.action_id or index}",
        function=ToolCallFunction(name=action.name, arguments=json.dumps(action.arguments)),
    )
    return Message(role="assistant", tool_calls=[call])
