"""One tau2 episode, stepped the way tau2's Orchestrator steps a simulation.

The conversation opens with tau2's greeting from the agent and the user's answer to it. An
assistant message with tool calls goes to tau2's environment (each call answered by a tool
message; a malformed or unknown call is answered with an error, never raised); one with text
only goes to the user, whose own tool calls (telecom) run against the environment until the user
answers in text. The episode ends when the user says one of tau2's stop tokens, when the agent
hands over with a successful `transfer_to_human_agents`, on an empty message, or at tau2's step
and error limits. `trajectory` is tau2's message history, which `score` gives tau2's evaluator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from shared.envs.protocol import Message, Score, StepResult
from shared.envs.tau2.config import Tau2Config
from shared.envs.tau2.messages import content_text, parse_arguments, tool_message
from shared.envs.tau2.scoring import evaluate
from shared.envs.tau2.user import Tau2User, UserSimulatorRefusedError
from shared.envs.tools import CallRecord
from shared.errors import PermanentError

TRANSFER_TOOL = "transfer_to_human_agents"
UserFactory = Callable[[Any, list[Any] | None], Tau2User]
"""Builds the user from tau2's task and the user's tools (None when the domain has none)."""


class Tau2Episode:
    def __init__(self, domain: str, task: Any, make_user: UserFactory, cfg: Tau2Config) -> None:
        from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
        from tau2.data_model.simulation import TerminationReason
        from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
        from tau2.registry import registry

        self.domain = domain
        self.task = task
        self._reasons = TerminationReason
        self._max_steps = cfg.max_steps
        self._max_errors = cfg.max_errors
        self.env = registry.get_env_constructor(domain)()
        initial = task.initial_state
        if initial is not None and initial.message_history:
            raise PermanentError(f"tau2 {domain} task {task.id}: a preset history is not supported")
        self.env.set_state(
            initialization_data=initial.initialization_data if initial else None,
            initialization_actions=initial.initialization_actions if initial else None,
            message_history=[],
        )
        self.system_prompt: str = SYSTEM_PROMPT.format(
            domain_policy=self.env.get_policy(), agent_instruction=AGENT_INSTRUCTION
        )
        self.tools: list[dict[str, Any]] = [t.openai_schema for t in self.env.get_tools()]
        self.user = make_user(task, self.env.get_user_tools() if self.env.user_tools else None)
        self.calls: list[CallRecord] = []
        """Every tool call of the agent, as the runner records them."""
        self.termination: Any = None
        """tau2's TerminationReason once the episode has ended."""
        self.steps = 0
        self.errors = 0
        self.problem: str | None = None
        """Why the user side failed, when it did."""
        greeting = DEFAULT_FIRST_AGENT_MESSAGE.model_copy(deep=True)
        self.trajectory: list[Any] = [greeting]
        self.messages: list[Message] = [Message(role="assistant", content=greeting.content)]
        opening = self._user_turn(greeting)
        if opening is not None:
            self.messages.append(opening)

    @property
    def done(self) -> bool:
        return self.termination is not None

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult(messages=[], done=True)
        text = assistant.content or ""
        if assistant.tool_calls:
            out = self._agent_calls(assistant, text)
        elif text.strip():
            out = self._agent_text(text)
        else:
            # tau2 rejects an empty message from the agent as an agent error.
            self.termination = self._reasons.AGENT_ERROR
            out = []
        return StepResult(messages=out, done=self.done)

    async def astep(self, assistant: Message) -> StepResult:
        """`step` off the event loop: a user turn blocks on the simulator's endpoint."""
        return await asyncio.to_thread(self.step, assistant)

    def score(self) -> Score:
        score = evaluate(self.domain, self.task, self.trajectory, self.termination, self.errors)
        if self.problem:
            return msgspec.structs.replace(score, notes=[*score.notes, self.problem])
        return score

    async def ascore(self) -> Score:
        """`score` off the event loop: tau2's evaluator reloads the domain's database twice."""
        return await asyncio.to_thread(self.score)

    # -- the agent's side ------------------------------------------------------------------

    def _agent_calls(self, assistant: Message, text: str) -> list[Message]:
        from tau2.data_model.message import AssistantMessage, ToolCall

        parsed = [
            (call, parse_arguments(call.function.arguments)) for call in assistant.tool_calls or []
        ]
        valid = [
            ToolCall(id=call.id, name=call.function.name, arguments=args)
            for call, args in parsed
            if isinstance(args, dict)
        ]
        # A call whose arguments do not parse never reaches tau2's environment, so it stays out
        # of the history tau2's evaluator replays (it could not replay it).
        if valid or text.strip():
            self.trajectory.append(
                AssistantMessage(role="assistant", content=text or None, tool_calls=valid or None)
            )
        self._tick(to_env=True)
        out: list[Message] = []
        results = iter(self._run(valid))
        transferred = False
        for call, args in parsed:
            if isinstance(args, str):
                self.errors += 1
                self.calls.append(CallRecord(call.function.name, None, False, args))
                out.append(tool_message(call, args))
                continue
            result = next(results)
            error = bool(result.error)
            self.calls.append(
                CallRecord(
                    call.function.name, args, not error, content_text(result) if error else None
                )
            )
            out.append(tool_message(call, content_text(result)))
            transferred = transferred or (call.function.name == TRANSFER_TOOL and not error)
        self._tick(to_env=False)
        if transferred and not self.done:
            # tau2's user answers a completed transfer with ###TRANSFER### on its next turn; the
            # episode ends here instead, without a round trip to the simulator.
            self.termination = self._reasons.AGENT_STOP
        return out

    def _agent_text(self, text: str) -> list[Message]:
        from tau2.data_model.message import AssistantMessage

        message = AssistantMessage(role="assistant", content=text)
        self.trajectory.append(message)
        self._tick(to_env=False)
        if self.done:
            return []
        reply = self._user_turn(message)
        return [reply] if reply is not None else []

    # -- the user's side -------------------------------------------------------------------

    def _user_turn(self, message: Any) -> Message | None:
        """Hand `message` to the user until the user answers in text (or the episode ends)."""
        from tau2.data_model.message import MultiToolMessage
        from tau2.user.user_simulator import UserSimulator

        while True:
            try:
                reply = self.user.respond(message)
            except UserSimulatorRefusedError as exc:
                # The simulator's endpoint refused this conversation (it outgrew the context):
                # the episode ends here, scored as it stands, as a refused agent turn is.
                self.termination = self._reasons.USER_ERROR
                self.problem = str(exc)
                return None
            if reply.is_tool_call():
                self.trajectory.append(reply)
                self._tick(to_env=True)
                results = self._run(reply.tool_calls)
                self._tick(to_env=False)
                if self.done:
                    return None
                message = (
                    results[0]
                    if len(results) == 1
                    else MultiToolMessage(role="tool", tool_messages=results)
                )
                continue
            if not reply.has_text_content():
                # tau2 rejects an empty message from the user as a user error.
                self.termination = self._reasons.USER_ERROR
                return None
            self.trajectory.append(reply)
            if UserSimulator.is_stop(reply):
                self.termination = self._reasons.USER_STOP
            self._tick(to_env=False)
            return Message(role="user", content=content_text(reply))

    # -- tau2's environment and limits -----------------------------------------------------

    def _run(self, calls: list[Any]) -> list[Any]:
        """tau2's tool messages for `calls` (its errors as `Error: ...` text), kept in history."""
        results = [self.env.get_response(call) for call in calls]
        self.errors += sum(1 for r in results if r.error)
        self.trajectory.extend(results)
        return results

    def _tick(self, *, to_env: bool) -> None:
        """One Orchestrator step; its limits are checked whenever the next message is not
        for the environment, exactly as tau2 does (even on the step that ended the episode)."""
        self.steps += 1
        if to_env:
            return
        if self.steps >= self._max_steps:
            self.termination = self._reasons.MAX_STEPS
        if self.errors >= self._max_errors:
            self.termination = self._reasons.TOO_MANY_ERRORS
