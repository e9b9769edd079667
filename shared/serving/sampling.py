"""Choosing the next token for each row of a batch, each row with its own settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shared.serving.constrain import Grammar


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
    grammar: Grammar | None = None
    """What the reply must follow (None: free text)."""


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from one row of logits (greedy when temperature is 0)."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    scaled = _truncated(logits.float() / params.temperature, params.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _truncated(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scaled` with the tokens outside the top-p nucleus set to -inf."""
    if top_p >= 1.0:
        return scaled
    ordered, order = torch.sort(scaled, descending=True)
    cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
    # Drop tokens once the mass before them already reaches top_p (the first always stays).
    drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p
    ordered[drop] = float("-inf")
    return torch.full_like(scaled, float("-inf")).scatter(0, order, ordered)


FREE_DRAWS = 4
"""Draws from the whole distribution before `pick_allowed` narrows it to the candidates."""
REDRAWS = 16
"""Draws among the candidates before it walks them from the most likely down."""


def pick_allowed(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed: Callable[[int], bool],
    candidates: Callable[[], torch.Tensor],
) -> int | None:
    """One token id that `allowed` accepts, drawn from the model's distribution restricted to
    such tokens. A model that follows the grammar anyway costs a check per token: the first
    draws are from the whole distribution. Then the distribution is cut to `candidates()`
    (a superset of the allowed ids) and a refused draw is taken out before the next; greedy,
    or after `REDRAWS` refusals, the candidates are tried from the most likely down. None when
    no candidate is allowed."""
    if params.temperature <= 0:
        best = int(torch.argmax(logits))
        if allowed(best):
            return best
    else:
        probs = torch.softmax(_truncated(logits.float() / params.temperature, params.top_p), -1)
        for _ in range(FREE_DRAWS):
            token = int(torch.multinomial(probs, 1, generator=generator))
            if allowed(token):
                return token
    ids = candidates()
    if not len(ids):
        return None
    sub = logits[ids].float()
    if params.temperature > 0:
        probs = torch.softmax(_truncated(sub / params.temperature, params.top_p), -1)
        for _ in range(REDRAWS):
            if not float(probs.sum()) > 0:
                break
            k = int(torch.multinomial(probs, 1, generator=generator))
            if allowed(int(ids[k])):
                return int(ids[k])
            probs[k] = 0.0
    for k in torch.argsort(sub, descending=True).tolist():
        if allowed(int(ids[k])):
            return int(ids[k])
    return None
