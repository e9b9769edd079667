"""Choosing the next token for each row of a batch, each row with its own settings."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end generation besides the model's own end tokens."""
    logprobs: bool = False
    top_logprobs: int = 0


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from one row of logits (greedy when temperature is 0)."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / params.temperature
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        # Drop tokens once the mass before them already reaches top_p (the first always stays).
        drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p
        ordered[drop] = float("-inf")
        scaled = torch.full_like(scaled, float("-inf")).scatter(0, order, ordered)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
