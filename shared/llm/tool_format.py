"""The tool-call text format: render a conversation with the tool-aware template, and parse
what the model wrote back into OpenAI tool calls.

Small models write a call in one of three forms, and the parser reads all of them, saying which
it saw (`ParsedReply.form`):
- `tagged`: the canonical Hermes form, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- `fenced`: the same JSON object (or a list of them) in a Markdown code fence;
- `bare`: the JSON object written straight into the text.
A fenced or bare object counts as a call only when it names one of the tools the request
declared: any other JSON is text the model meant for the user.

Parsing never guesses: a `<tool_call>` block (or a fenced or bare object naming a declared tool)
that is not a JSON object with a string `name` and an object `arguments` is reported as
malformed, with the reason and its raw text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from shared.llm.openai_types import ChatRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.S)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.S)
_DECODER = json.JSONDecoder()

Form = Literal["tagged", "fenced", "bare"]
Found = tuple[tuple[int, int], list["ParsedCall | MalformedCall"]]
"""A stretch of the text (start, end) and the calls read from it."""


@cache
def tool_template() -> str:
    """The Jinja chat template shipped with retrace (also usable as vLLM's --chat-template)."""
    return resources.files("shared.llm").joinpath("templates/tool_chatml.jinja").read_text()


def offered_tools(request: ChatRequest) -> tuple[str, ...]:
    """Names of the functions a chat request lets the model call (none under `tool_choice:
    "none"`)."""
    if not request.tools or request.tool_choice == "none":
        return ()
    return tool_names(request.tools)


def tool_names(schemas: Iterable[Any]) -> tuple[str, ...]:
    """The function names in OpenAI tool schemas (entries of another shape are skipped)."""
    names = []
    for tool in schemas:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """Canonical JSON text of the arguments object."""


@dataclass(frozen=True)
class MalformedCall:
    raw: str
    error: str
    name: str | None = None
    """The function name, when one could still be read."""


@dataclass
class ParsedReply:
    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)
    malformed: list[MalformedCall] = field(default_factory=list)
    form: Form | None = None
    """How the calls (or the malformed attempts) were written; None when there were none."""


def parse_reply(text: str, tools: Collection[str] = ()) -> ParsedReply:
    """Split model output into free text and tool calls (well-formed and malformed).

    `tools` names the functions the request declared; without them only the tagged form is
    read, since a fenced or bare JSON object could be anything."""
    if OPEN in text:
        return _parse_tagged(text)
    if not tools:
        return ParsedReply(text.strip() or None)
    declared = frozenset(tools)
    return (
        _gather(text, _fenced(text, declared), "fenced")
        or _gather(text, _bare(text, declared), "bare")
        or ParsedReply(text.strip() or None)
    )


def _parse_tagged(text: str) -> ParsedReply:
    calls: list[ParsedCall] = []
    malformed: list[MalformedCall] = []
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        closed = match.group(0).endswith(CLOSE)
        result = _parse_call(body)
        if isinstance(result, ParsedCall) and closed:
            calls.append(result)
        elif isinstance(result, ParsedCall):
            malformed.append(MalformedCall(body, f"unterminated {OPEN} block", result.name))
        else:
            malformed.append(result)
    content = _BLOCK.sub("", text).strip() if calls else text.strip()
    if malformed and calls:
        # Keep the text of the broken blocks visible beside the calls that did parse.
        content = "\n".join(filter(None, [content, *(OPEN + m.raw for m in malformed)]))
    return ParsedReply(content or None, calls, malformed, "tagged")


def _fenced(text: str, declared: frozenset[str]) -> Iterator[Found]:
    """Code fences and the declared-tool calls in each (a fence that is not JSON but names a
    declared tool is one malformed call)."""
    for match in _FENCE.finditer(text):
        body = match.group(2).strip()
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            if _names_declared(body, declared):
                yield match.span(), [_parse_call(body)]
            continue
        yield match.span(), _calls_in(obj, declared)


def _bare(text: str, declared: frozenset[str]) -> Iterator[Found]:
    """JSON values written in the text and the declared-tool calls in each."""
    for start, end, obj in _json_values(text):
        yield (start, end), _calls_in(obj, declared)


def _calls_in(obj: Any, declared: frozenset[str]) -> list[ParsedCall | MalformedCall]:
    return [_call_of(item) for item in _objects(obj) if _declared_name(item, declared)]


def _gather(text: str, pieces: Iterator[Found], form: Form) -> ParsedReply | None:
    """The reply made of the pieces that hold calls; None when none does."""
    calls: list[ParsedCall] = []
    malformed: list[MalformedCall] = []
    spans: list[tuple[int, int]] = []
    for span, found in pieces:
        if found:
            spans.append(span)
            _collect(found, calls, malformed)
    return _reply(text, spans, calls, malformed, form) if spans else None


def _reply(
    text: str,
    spans: list[tuple[int, int]],
    calls: list[ParsedCall],
    malformed: list[MalformedCall],
    form: Form,
) -> ParsedReply:
    if not calls:  # nothing parsed: the raw text stays visible, as with a broken tagged call
        return ParsedReply(text.strip() or None, [], malformed, form)
    kept, last = [], 0
    for start, end in spans:
        kept.append(text[last:start])
        last = end
    kept.append(text[last:])
    content = "".join(kept).strip()
    return ParsedReply(content or None, calls, malformed, form)


def _collect(
    results: list[ParsedCall | MalformedCall],
    calls: list[ParsedCall],
    malformed: list[MalformedCall],
) -> None:
    for result in results:
        if isinstance(result, ParsedCall):
            calls.append(result)
        else:
            malformed.append(result)


def _json_values(text: str) -> Iterator[tuple[int, int, Any]]:
    """Every JSON object or array that starts at a `{` or `[` outside an earlier one."""
    position = 0
    while True:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
        if not starts:
            return
        start = min(starts)
        try:
            obj, end = _DECODER.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            position = start + 1
            continue
        yield start, end, obj
        position = end


def _objects(obj: Any) -> list[Any]:
    """A call object, or each item of a list of them."""
    return obj if isinstance(obj, list) else [obj]


def _unwrap(obj: Any) -> Any:
    """OpenAI's own shape, `{"type": "function", "function": {...}}`, holds the call inside."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        return obj["function"]
    return obj


def _declared_name(obj: Any, declared: frozenset[str]) -> bool:
    obj = _unwrap(obj)
    return isinstance(obj, dict) and obj.get("name") in declared


def _names_declared(body: str, declared: frozenset[str]) -> bool:
    name = _guess_name(body)
    return name is not None and name in declared


def _call_of(obj: Any) -> ParsedCall | MalformedCall:
    return _check_call(_unwrap(obj), json.dumps(obj, ensure_ascii=False))


def _parse_call(body: str) -> ParsedCall | MalformedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return MalformedCall(
            body, f"not valid JSON: {exc.msg} at position {exc.pos}", _guess_name(body)
        )
    except RecursionError:
        return MalformedCall(body, "not valid JSON: nested too deeply", _guess_name(body))
    return _check_call(_unwrap(obj), body)


def _check_call(obj: Any, raw: str) -> ParsedCall | MalformedCall:
    if not isinstance(obj, dict):
        return MalformedCall(raw, "a tool call must be a JSON object with name and arguments")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(raw, "missing a string 'name'")
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return MalformedCall(raw, "'arguments' is a string that is not JSON", name)
    if not isinstance(args, dict):
        return MalformedCall(raw, "'arguments' must be a JSON object", name)
    return ParsedCall(name, json.dumps(args, ensure_ascii=False))


def _guess_name(body: str) -> str | None:
    found = re.search(r'"name"\s*:\s*"([^"]+)"', body)
    return found.group(1) if found else None
