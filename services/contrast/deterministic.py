"""The deterministic proposer and labeller: a fixed catalogue of capabilities read off features.

Always available (no judge needed), so contrast works and is testable without a model. Each
capability's rule maps `features.extract(trajectory)` to a label; NA means the trajectory
gave the agent no occasion to show the capability. The rules are target-agnostic, so some
are coarse (the labeller cannot know whether a task needed a question): the contrast
criterion, not the rule, decides whether a capability separates failures from successes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.contrast.features import Features, extract
from services.contrast.labels import Capability, Label, Rule
from services.contrast.trajectory import TrajectoryView


def _on_features(fn: Callable[[Features], Label]) -> Rule:
    def rule(trajectory: TrajectoryView) -> Label:
        return fn(extract(trajectory))

    rule.__name__ = rule.__qualname__ = fn.__name__
    rule.__doc__ = fn.__doc__
    return rule


def _lacking_if(lacking: bool) -> Label:
    return "LACKING" if lacking else "PRESENT"


def _well_formed(f: Features) -> Label:
    if f.no_tool_calls:
        return "NA"
    return _lacking_if(f.malformed_calls > 0)


def _valid_arguments(f: Features) -> Label:
    if f.well_formed_calls == 0:
        return "NA"
    return _lacking_if(f.invalid_argument_calls > 0)


def _existing_tools(f: Features) -> Label:
    if f.received_calls == 0:
        return "NA"
    return _lacking_if(f.unknown_tool_calls > 0)


def _recover(f: Features) -> Label:
    if f.recovered_failures + f.unrecovered_failures == 0:
        return "NA"
    return _lacking_if(f.unrecovered_failures > 0)


def _no_repeated_rejections(f: Features) -> Label:
    if f.invalid_argument_calls == 0:
        return "NA"
    return _lacking_if(f.repeated_rejected_calls > 0)


def _ask(f: Features) -> Label:
    if f.question_before_side_effect is None:
        return "NA"
    return _lacking_if(not f.question_before_side_effect)


def _look_up(f: Features) -> Label:
    if f.read_only_before_side_effect is None:
        return "NA"
    return _lacking_if(not f.read_only_before_side_effect)


def _report(f: Features) -> Label:
    if f.reported_after_tools is None:
        return "NA"
    return _lacking_if(not f.reported_after_tools)


def _use_tools(f: Features) -> Label:
    if f.assistant_turns == 0:
        return "NA"
    return _lacking_if(f.no_tool_calls)


def _stop(f: Features) -> Label:
    if f.successful_calls == 0:
        return "NA"
    return _lacking_if(f.duplicate_side_effects > 0 or f.ended_on_tool_call)


CATALOGUE: tuple[Capability, ...] = (
    Capability(
        "well_formed_tool_calls",
        "Write every tool call in the expected call format with a JSON object as arguments. "
        "NA: no tool call attempted. LACKING: some call could not be parsed, or its "
        "arguments were not a JSON object. PRESENT: every call parsed.",
        _on_features(_well_formed),
    ),
    Capability(
        "valid_tool_arguments",
        "Give arguments that satisfy the called tool's schema: required fields present, "
        "right types, allowed values. NA: no parsed call reached an existing tool. "
        "LACKING: some call was rejected by the schema. PRESENT: none was.",
        _on_features(_valid_arguments),
    ),
    Capability(
        "use_existing_tools",
        "Call only tools that exist in the given tool list, never an invented name. "
        "NA: the environment received no call. LACKING: some call named an unknown tool. "
        "PRESENT: every called tool exists.",
        _on_features(_existing_tools),
    ),
    Capability(
        "recover_from_tool_errors",
        "When a tool refuses a well-formed call (not found, taken, a value it cannot use), "
        "read its error and fix or retry until that tool succeeds. NA: no tool refused a "
        "schema-valid call. LACKING: a refusing tool is never later called successfully. "
        "PRESENT: every one is.",
        _on_features(_recover),
    ),
    Capability(
        "avoid_repeating_rejected_calls",
        "Never resend a call the schema already rejected with the very same arguments. "
        "NA: no call was rejected by the schema. LACKING: an identical rejected call was "
        "sent again. PRESENT: every retry changed the arguments.",
        _on_features(_no_repeated_rejections),
    ),
    Capability(
        "ask_for_missing_information",
        "Ask the user a question (a text with '?') before the first action that changes "
        "state. NA: no state-changing call attempted. LACKING: acted without asking. "
        "PRESENT: asked first.",
        _on_features(_ask),
    ),
    Capability(
        "look_up_before_acting",
        "Read the current state with a read-only tool (get_/list_/search_/find_...) in an "
        "earlier turn than the first state-changing call. NA: no state-changing call. "
        "LACKING: acted with no prior lookup. PRESENT: looked up first.",
        _on_features(_look_up),
    ),
    Capability(
        "report_result_to_user",
        "Finish by telling the user, in text after the last tool result, what was done or "
        "found. NA: no tool result came back. LACKING: the last assistant message is not "
        "such a text. PRESENT: it is.",
        _on_features(_report),
    ),
    Capability(
        "use_tools_when_needed",
        "Act through the tools instead of answering from memory or only chatting. "
        "NA: the agent never replied. LACKING: not a single tool call was attempted. "
        "PRESENT: at least one was.",
        _on_features(_use_tools),
    ),
    Capability(
        "stop_after_completion",
        "Once the work is done, stop: hand back to the user instead of repeating a "
        "successful state-changing call or calling tools until cut off. NA: no call "
        "succeeded. LACKING: a duplicate successful action, or ended mid tool use. "
        "PRESENT: neither.",
        _on_features(_stop),
    ),
)
"""The candidates, each with its rule; names are unique."""


class RuleLabeller:
    """Labels with each capability's own rule; `run` is ignored (the rules are pure)."""

    def label(self, capability: Capability, trajectory: TrajectoryView, run: int) -> Label:
        if capability.rule is None:
            raise ValueError(f"capability {capability.name!r} has no rule; it needs a judge")
        return capability.rule(trajectory)


def propose(
    trajectories: Sequence[TrajectoryView], catalogue: Sequence[Capability] = CATALOGUE
) -> list[Capability]:
    """The catalogue entries that label at least one failed trajectory LACKING: the rest
    cannot separate failures from successes on this data at all."""
    failed = [t for t in trajectories if not t.success]
    labeller = RuleLabeller()
    return [c for c in catalogue if any(labeller.label(c, t, 0) == "LACKING" for t in failed)]
