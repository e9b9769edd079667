"""The user side of a tau2 episode: tau2's LLM user simulator, or a script (gold replay).

Either answers one message addressed to the user (the agent's text, or the results of the
user's own tool calls) with a tau2 `UserMessage`: text, or tool calls on the user's device
(telecom), or one of tau2's stop tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from copy import deepcopy
from typing import Any, Protocol

from shared.envs.tau2.config import Tau2Config
from shared.errors import PermanentError, RetryableError
from shared.logging import get_logger
from shared.retry import RetryPolicy

log = get_logger(__name__)
STOP = "###STOP###"


class UserSimulatorError(RetryableError):
    """The user simulator's endpoint stayed unreachable or failing for every attempt."""


class UserSimulatorRefusedError(PermanentError):
    """The user simulator's endpoint refused the conversation (e.g. it outgrew the context)."""


class Tau2User(Protocol):
    def respond(self, message: Any) -> Any:
        """tau2's `UserMessage` answering `message` (an AssistantMessage or ToolMessage(s))."""
        ...


def user_turn_policy(cfg: Tau2Config) -> RetryPolicy:
    """How one user-simulator completion is retried: connection failures and timeouts, 5xx, 429.
    Any other API error (a 400 for an outgrown context) is a refusal, not retried."""
    import openai
    from litellm.exceptions import BadGatewayError, ServiceUnavailableError

    return RetryPolicy(
        "tau2-user-turn",
        attempts=cfg.user_attempts,
        base_delay=1.0,
        max_delay=10.0,
        timeout=cfg.user_timeout,
        retry_on=(
            openai.APIConnectionError,  # includes timeouts
            openai.InternalServerError,
            openai.RateLimitError,
            ServiceUnavailableError,
            BadGatewayError,
            OSError,
        ),
    )


class SimulatedUser:
    """tau2's `UserSimulator` (its guidelines, the task's scenario) through litellm at an
    OpenAI-compatible endpoint. A turn's state is only kept once the turn succeeded, so a retried
    turn never sees half of the failed one."""

    def __init__(self, task: Any, tools: list[Any] | None, cfg: Tau2Config, seed: int) -> None:
        from tau2.user.user_simulator import UserSimulator

        self.policy = user_turn_policy(cfg)
        self._sim = UserSimulator(
            tools=tools or None,
            instructions=str(task.user_scenario),
            llm=f"openai/{cfg.user_model}",
            llm_args={
                "api_base": cfg.user_url,
                "api_key": cfg.user_api_key,
                "temperature": cfg.user_temperature,
                "max_tokens": cfg.user_max_tokens,
                "seed": cfg.user_seed if cfg.user_seed is not None else seed,
                "timeout": cfg.user_timeout,
                "num_retries": 0,  # retries are ours (the policy above), not litellm's
            },
        )
        self._state = self._sim.get_init_state()

    def respond(self, message: Any) -> Any:
        import openai

        for attempt in range(1, self.policy.attempts + 1):
            try:
                reply, state = self._sim.generate_next_message(message, deepcopy(self._state))
            except self.policy.retry_on as exc:
                if attempt == self.policy.attempts:
                    raise UserSimulatorError(
                        f"user simulator failed {attempt} times: {exc}"
                    ) from exc
                pause = self.policy.delay(attempt)
                log.warning(
                    "retrying", policy=self.policy.name, attempt=attempt, error=repr(exc)[:300]
                )
                time.sleep(pause)
                continue
            except openai.APIError as exc:
                raise UserSimulatorRefusedError(f"user simulator: {exc}") from exc
            self._state = state
            return reply
        raise AssertionError("unreachable: the last attempt returns or raises")


class ScriptedUser:
    """Plays fixed replies in order, then ends the conversation with tau2's stop token; no model."""

    def __init__(self, replies: Sequence[Any]) -> None:
        self._replies = list(replies)

    def respond(self, message: Any) -> Any:
        from tau2.data_model.message import UserMessage

        if self._replies:
            return self._replies.pop(0)
        return UserMessage(role="user", content=STOP)
