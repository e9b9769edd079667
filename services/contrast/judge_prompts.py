"""The LLM judge's prompts, and `compact`: a trajectory rendered for a judge within a budget.

`compact` writes one line per message (tool calls as `name(arguments)`, failed tool results
and unparsable calls marked `ERROR`) and never shows the outcome (success, reward): a judge
labelling one trajectory must not see whether it failed, or its labels would echo the outcome
instead of the behaviour. When the lines do not fit, the first and last lines stay (the request
and how the episode ended) and the middle is elided, closest to both ends first.

Templates are `string.Template`s (`$name`), so the JSON in them needs no brace escaping.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from string import Template

from services.contrast.labels import Capability
from services.contrast.trajectory import MessageView, TrajectoryView

TEXT_CHARS = 800
"""Most characters kept of one message's text (system, user, assistant)."""
RESULT_CHARS = 200
"""Most characters kept of one tool result or one call's arguments."""
_ELLIPSIS = "…"
_MIN_ROOM = 80
"""Below this the first and last lines are clipped as one text instead of elided around."""

# -- prompts ---------------------------------------------------------------------------------

PROPOSE_SYSTEM = """\
You analyse transcripts of a tool-using AI agent to find why it fails. You compare failed \
and successful episodes of the same agent and name the capabilities (general behaviours, \
not facts about one task) that failed episodes lack more often than successful ones. You \
reply with one JSON object and nothing else."""

PROPOSE_USER = Template("""\
Below are $n_failed FAILED and $n_succeeded SUCCESSFUL episodes of the same agent. Each line \
is one message: tool calls are written name(arguments), failed tool results and unparsable \
calls are marked ERROR, and long texts are cut with "…".

$failed

$succeeded

Propose at most $max_candidates capabilities that the agent shows in successful episodes and \
lacks in failed ones. Each capability must be:
- a behaviour that could matter on many tasks, not a fact about one task;
- judgeable from ONE transcript, without knowing whether it succeeded;
- named in snake_case (lowercase words joined by "_", at most 100 characters) after what \
the agent does, never after a message role (not "system", "user", "assistant" or "tool");
- defined precisely: what PRESENT, LACKING and NA (the episode gave no occasion for it) mean.

Reply with only this JSON object, no prose and no code fence, each <...> replaced by your own \
words:
{"capabilities": [{"name": "<what_the_agent_does>", "definition": "<what the behaviour is; \
PRESENT when ...; LACKING when ...; NA when ...>"}]}""")

LABEL_SYSTEM = """\
You are a strict evaluator of transcripts of a tool-using AI agent. For each capability you \
are given, you decide from the transcript alone whether the agent showed it (PRESENT), \
needed it and did not show it (LACKING), or had no occasion to show it (NA), exactly as the \
capability's definition says. You reply with one JSON object and nothing else."""

LABEL_USER = Template("""\
Capabilities:
$capabilities

Transcript (one line per message; tool calls are written name(arguments), failed tool \
results and unparsable calls are marked ERROR, long texts are cut with "…"):
<transcript>
$transcript
</transcript>

Label every capability above, each exactly once, with "PRESENT", "LACKING" or "NA". Reply \
with only this JSON object, no prose and no code fence:
$skeleton""")


def propose_prompt(failed: Sequence[str], succeeded: Sequence[str], max_candidates: int) -> str:
    """The proposer's user message around compacted failed and successful trajectories."""
    return PROPOSE_USER.substitute(
        n_failed=len(failed),
        n_succeeded=len(succeeded),
        failed=_episodes("FAILED", failed),
        succeeded=_episodes("SUCCESSFUL", succeeded),
        max_candidates=max_candidates,
    )


def label_prompt(capabilities: Sequence[Capability], transcript: str) -> str:
    """The labeller's user message: every capability's definition, then one transcript."""
    skeleton = {"labels": {c.name: "PRESENT|LACKING|NA" for c in capabilities}}
    return LABEL_USER.substitute(
        capabilities="\n".join(f"- {c.name}: {c.definition}" for c in capabilities),
        transcript=transcript,
        skeleton=json.dumps(skeleton),
    )


def _episodes(kind: str, transcripts: Sequence[str]) -> str:
    if not transcripts:
        return f"(no {kind} episodes)"
    return "\n\n".join(
        f"### {kind} episode {i}\n{text}" for i, text in enumerate(transcripts, start=1)
    )


EPISODE_HEADER_CHARS = len("\n\n### SUCCESSFUL episode 100\n")
"""Room one episode's header takes in `propose_prompt`, for budgeting."""

# -- compact ---------------------------------------------------------------------------------


def lines(trajectory: TrajectoryView) -> list[str]:
    """One line per message, then one for an early stop; long parts clipped."""
    out = [render(m) for m in trajectory.messages]
    if trajectory.error:
        out.append(f"[episode stopped: ERROR {_clip(_flat(trajectory.error), RESULT_CHARS)}]")
    return out


def compact(trajectory: TrajectoryView, max_chars: int) -> str:
    """`lines(trajectory)` joined, in at most `max_chars` characters, keeping start and end."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    return _fit(lines(trajectory), max_chars)


def render(message: MessageView) -> str:
    """One message as one line."""
    text = _clip(_flat(message.content or ""), TEXT_CHARS)
    if message.role == "tool":
        return f"tool {message.name or '?'}: {_result(message.content or '')}"
    if message.role != "assistant":
        return f"{message.role}: {text}"
    parts = [text] if text else []
    parts += [f"{c.name}({_clip(_flat(c.arguments), RESULT_CHARS)})" for c in message.tool_calls]
    parts += [
        f"ERROR unparsable call: {_clip(_flat(e), RESULT_CHARS)}" for e in message.tool_call_errors
    ]
    return "assistant: " + " | ".join(parts)


def _result(content: str) -> str:
    """A tool result, `ERROR ...` when it is the ToolBox's `{"error": ...}` object."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict) and set(body) == {"error"}:
        return f"ERROR {_clip(_flat(str(body['error'])), RESULT_CHARS)}"
    return _clip(_flat(content), RESULT_CHARS)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _clip(text: str, n: int) -> str:
    """At most `n` characters of `text`, keeping its start and its end around an ellipsis."""
    if len(text) <= n:
        return text
    if n <= 1:
        return text[:n]
    keep = n - len(_ELLIPSIS)
    head, tail = keep - keep // 2, keep // 2
    return text[:head] + _ELLIPSIS + (text[-tail:] if tail else "")


def _omitted(n: int) -> str:
    return f"[… {n} messages omitted …]"


def _fit(items: list[str], max_chars: int) -> str:
    """Keep the first and last lines (each clipped to half the room if need be), then middle
    lines nearest to either end, alternating, while they fit; a marker counts the rest."""
    text = "\n".join(items)
    if len(text) <= max_chars:
        return text
    middle = items[1:-1]
    room = max_chars - len(_omitted(len(middle))) - 2
    if len(items) < 3 or room < _MIN_ROOM:
        return _clip(text, max_chars)
    # Each end gets at most half the room, so one long message cannot crowd out the middle.
    first, last = _clip(items[0], room - room // 2), _clip(items[-1], room // 2)
    left = room - len(first) - len(last)
    front: list[str] = []
    back: list[str] = []
    i, j = 0, len(middle)
    from_front = True
    while i < j:
        candidate = middle[i] if from_front else middle[j - 1]
        if len(candidate) + 1 > left:
            break
        left -= len(candidate) + 1
        if from_front:
            front.append(candidate)
            i += 1
        else:
            back.insert(0, candidate)
            j -= 1
        from_front = not from_front
    gap = [_omitted(j - i)] if j > i else []
    return "\n".join([first, *front, *gap, *back, last])
