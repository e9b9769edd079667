"""Settings of the tau2 environments (`RETRACE_TAU2_*`): the simulated user's endpoint and
tau2's episode limits. Read once, when an environment is built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.config import Count, ModelConfig, Seconds, load_config
from shared.serving.packaged import DEFAULT_AGENT_MODEL

Url = Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$")]
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]


class Tau2Config(msgspec.Struct, kw_only=True, frozen=True):
    """tau2's LLM user simulator, pointed at any OpenAI-compatible endpoint through litellm."""

    user_url: Url = ModelConfig().url
    """Endpoint of the user simulator's model (default: the local `retrace serve-model`)."""
    user_model: str = DEFAULT_AGENT_MODEL
    """Model name at that endpoint; litellm is called with `openai/<user_model>`."""
    user_api_key: str = "EMPTY"
    """Sent as a bearer token; litellm needs one even for a local endpoint."""
    user_temperature: Temperature = 0.0
    """tau2's default for the user simulator."""
    user_seed: int | None = None
    """Sampling seed of every user turn; unset: the episode's seed (tau2 seeds the user with
    the run's seed)."""
    user_max_tokens: Count = 256
    """Most tokens of one user reply."""
    user_timeout: Seconds = 120.0
    """Seconds for one user-simulator completion."""
    user_attempts: Count = 3
    """Attempts per user turn when the endpoint is unreachable or failing (5xx, timeouts)."""
    max_steps: Count = 200
    """tau2's step limit (agent messages, tool batches and user messages all count); past it
    the episode ends as `max_steps` and tau2 gives 0."""
    max_errors: Count = 10
    """tau2's limit on failed tool calls; past it the episode ends as `too_many_errors`."""


class _Settings(msgspec.Struct, kw_only=True, frozen=True):
    tau2: Tau2Config = msgspec.field(default_factory=Tau2Config)


def load_tau2_config(env: Mapping[str, str] | None = None) -> Tau2Config:
    """The `RETRACE_TAU2_*` settings; a bad value is a ConfigError naming its variable."""
    return load_config(_Settings, env=env).tau2
