"""The spec writer: an LLM writes a capability's scenario template and reward checks.

The reply must be the spec format's own data (`ScenarioTemplate` plus `CheckSpec`s), and is
accepted only when the spec built from it validates against the target, replays its reference
to 1.0 on several seeds, builds twice the same, and yields distinct tasks; any problem is fed
back and the writer asked again, up to `max_attempts` replies, then `SpecWriterError`. The
service falls back to the capability's default spec when that happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from services.synthesize import writer_prompts as prompts
from shared.envs.protocol import Message
from shared.envs.synthetic import SyntheticSpec, check_deterministic, toolbox_schemas, validate
from shared.envs.synthetic.defaults import template_spec
from shared.envs.synthetic.spec import CheckSpec, ScenarioTemplate
from shared.envs.synthetic.tasks import GeneratorError, generate_tasks
from shared.llm.client import LLMClient
from shared.llm.structured import (
    AskConfig,
    MalformedReply,
    StructuredOutputError,
    ask_structured,
    decode_json,
)

MAX_PROBLEMS_SHOWN = 8


class SpecWriterError(StructuredOutputError):
    """The writer gave no usable spec; the message lists what was wrong with each reply."""


class _Written(msgspec.Struct, frozen=True):
    template: ScenarioTemplate
    checks: list[CheckSpec] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class WriterConfig:
    model: str
    temperature: float = 0.7
    max_tokens: int = 1536
    max_attempts: int = 3
    determinism_seeds: int = 3
    """Seeds each written spec is built twice on (and its reference replayed on)."""
    seed: int = 0


class SpecWriter:
    def __init__(self, client: LLMClient, cfg: WriterConfig) -> None:
        self.client = client
        self.cfg = cfg

    async def write(
        self, capability: str, definition: str, evidence: Sequence[str] = ()
    ) -> SyntheticSpec:
        """A checked spec for the capability, written by the model."""
        schemas = toolbox_schemas()
        prompt = [
            Message(role="system", content=f"{prompts.SYSTEM}\n\n{prompts.EXAMPLE}"),
            Message(
                role="user",
                content=prompts.user_prompt(capability, definition, evidence, schemas),
            ),
        ]

        def parse(reply: str) -> SyntheticSpec:
            return self.accept(capability, definition, decode_json(reply, _Written))

        ask = AskConfig(
            model=self.cfg.model,
            temperature=self.cfg.temperature,
            max_tokens=self.cfg.max_tokens,
            max_attempts=self.cfg.max_attempts,
        )
        return await ask_structured(
            self.client,
            ask,
            prompt,
            seed=self.cfg.seed,
            parse=parse,
            what=f"environment spec for {capability}",
            error=SpecWriterError,
        )

    def accept(self, capability: str, definition: str, written: _Written) -> SyntheticSpec:
        """The spec the written template makes, or `MalformedReply` naming its problems."""
        spec = template_spec(capability, definition, written.template, written.checks or None)
        problems = validate(spec, toolbox_schemas()) or check_deterministic(
            spec, range(self.cfg.determinism_seeds)
        )
        if not problems:
            try:
                generate_tasks(spec)
            except GeneratorError as exc:
                problems = [f"{exc} (add slots or options so tasks differ)"]
        if problems:
            shown = problems[:MAX_PROBLEMS_SHOWN]
            more = len(problems) - len(shown)
            raise MalformedReply(
                "the environment is not valid: "
                + "; ".join(shown)
                + (f"; and {more} more" if more else "")
            )
        return spec
