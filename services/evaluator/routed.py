"""The routed set, simulated: it is never played itself. Per test task, the router decides
from the task's opening request, and the task's outcomes are those the chosen configuration
had there (same tasks, same seeds). The learned router's examples come from the cycle's
train-task rollouts."""

from __future__ import annotations

from services.evaluator.state import BASE, adapter_config
from shared.routing.modes import Candidate, Example, RoutingMode

Outcomes = dict[str, list[tuple[bool, float]]]
"""Per task, its trials in order: (success, reward)."""


async def route(
    outcomes: dict[str, Outcomes],
    openings: dict[str, str],
    candidates: list[Candidate],
    mode: RoutingMode,
) -> tuple[Outcomes, dict[str, str]]:
    """The routed configuration's outcomes, and per task the configuration chosen there."""
    routed: Outcomes = {}
    decisions: dict[str, str] = {}
    for task, trials in outcomes[BASE].items():
        decision = await mode.decide(openings.get(task, ""), candidates)
        name = adapter_config(decision.adapter.name) if decision.adapter else BASE
        routed[task] = outcomes.get(name, {}).get(task, trials)
        decisions[task] = name
    return routed, decisions


def learn_examples(route: dict[str, Outcomes], openings: dict[str, str]) -> list[Example]:
    """Per train task, the configuration with the best mean reward (the base model unless
    an adapter does strictly better), as the learned router's examples."""

    def mean(results: list[tuple[bool, float]]) -> float:
        return sum(r for _, r in results) / len(results) if results else 0.0

    base = route.get(BASE, {})
    out = []
    for task, trials in sorted(base.items()):
        best, best_score = None, mean(trials)
        for name, results in sorted(route.items()):
            if name == BASE or task not in results:
                continue
            score = mean(results[task])
            if score > best_score:
                best, best_score = name.removeprefix("adapter:"), score
        if openings.get(task):
            out.append(Example(openings[task], best))
    return out
