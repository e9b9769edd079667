"""Constrained decoding: what a reply may still say, checked token by token.

A `Grammar` is a sequence of segments: exact text (`Literal`), one of several texts
(`OneOf`), optional whitespace (`Spaces`) and a JSON object (`JsonObject`, recognised
character by character: strings, escapes, numbers, literals, nesting). Its `State` says
whether a token's text may come next (`accepts`), moves on by it (`fed`) and knows when the
reply is complete (then generation stops). Sampling draws from the model's own distribution
and redraws when a draw is refused (`serving.sampling.pick_allowed`), so an unconstrained
choice costs one check.

Used for `tool_choice` (`required`: a call of one of the offered tools; a named function:
a call of that one), whose arguments must be a JSON object, and for
`response_format: {"type": "json_object"}`. The arguments are not checked against the tool's
schema: they parse, and the names are the offered ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

CLOSE = "</tool_call>"
MAX_DEPTH = 64
"""Nesting a JSON object may reach (deeper is refused)."""


@dataclass(frozen=True)
class Literal:
    text: str

    def __post_init__(self) -> None:
        _ascii(self.text)


@dataclass(frozen=True)
class OneOf:
    options: tuple[str, ...]

    def __post_init__(self) -> None:
        for option in self.options:
            _ascii(option)


def _ascii(text: str) -> None:
    if not text or not text.isascii():
        # `Vocabulary.candidates` relies on it: outside JSON strings, only ASCII is written
        raise ValueError(f"grammar text must be non-empty ASCII (JSON-escape the rest): {text!r}")


@dataclass(frozen=True)
class Spaces:
    pass


@dataclass(frozen=True)
class JsonObject:
    pass


Segment = Literal | OneOf | Spaces | JsonObject


@dataclass(frozen=True)
class Grammar:
    segments: tuple[Segment, ...]

    def start(self) -> State:
        return State(self, 0, _begin(self.segments[0]) if self.segments else None)


def tool_call(names: tuple[str, ...], *, named: bool) -> Grammar:
    """The rest of a reply forced to open a tool call (`serving.prompts`): after `<tool_call>\\n`
    for `required` (the name one of `names`), after `"arguments": ` for a named function."""
    tail: tuple[Segment, ...] = (JsonObject(), Literal("}"), Spaces(), Literal(CLOSE))
    if named:
        return Grammar(tail)
    options = tuple(json.dumps(n) + ', "arguments": ' for n in names)  # ASCII: escaped
    return Grammar((Literal('{"name": '), OneOf(options), *tail))


JSON_OBJECT = Grammar((JsonObject(),))
"""`response_format: {"type": "json_object"}`: one JSON object (whitespace before it)."""


def for_request(
    tool_choice: str | dict[str, Any] | None,
    tool_names: tuple[str, ...],
    response_format: str | None,
) -> Grammar | None:
    """The grammar a chat request's reply must follow, if any (the forced prefix of
    `serving.prompts` already opened the call)."""
    if tool_names and tool_choice == "required":
        return tool_call(tool_names, named=False)
    if tool_names and isinstance(tool_choice, dict):
        return tool_call(tool_names, named=True)
    if response_format == "json_object":
        return JSON_OBJECT
    return None


class State:
    """Where a reply stands in its grammar. Immutable from outside: `fed` returns a new one."""

    __slots__ = ("grammar", "index", "inner")

    def __init__(self, grammar: Grammar, index: int, inner: Any) -> None:
        self.grammar = grammar
        self.index = index
        self.inner = inner

    @property
    def complete(self) -> bool:
        """Nothing more may follow (the reply is whole)."""
        segments = self.grammar.segments
        if self.index >= len(segments):
            return True
        if not _can_end(segments[self.index], self.inner):
            return False
        # the rest must be able to stay empty (only trailing `Spaces`)
        return all(isinstance(s, Spaces) for s in segments[self.index + 1 :]) and not _more(
            segments[self.index], self.inner
        )

    def accepts(self, text: str) -> bool:
        return self.fed(text) is not None

    def fed(self, text: str) -> State | None:
        """The state after `text`, or None when the grammar does not allow it."""
        if not text:
            return None
        index, inner = self.index, _copy(self.inner)
        segments = self.grammar.segments
        for ch in text:
            while True:
                if index >= len(segments):
                    return None
                segment = segments[index]
                if _feed(segment, inner, ch):
                    break
                if not _can_end(segment, inner):
                    return None
                index += 1
                inner = _begin(segments[index]) if index < len(segments) else None
        return State(self.grammar, index, inner)


class Vocabulary:
    """A tokenizer's tokens as text, indexed by their first two characters, so the tokens a
    state may accept are narrowed down without trying every one (`candidates`)."""

    NON_ASCII = "\u00e9"
    """Stands for every non-ASCII character: grammar texts are ASCII, so only a JSON string
    (which takes any of them) accepts one."""

    def __init__(self, tokenizer: Any) -> None:
        size = len(tokenizer)
        self.texts: list[str] = tokenizer.batch_decode([[i] for i in range(size)])
        index: dict[str, dict[str, list[int]]] = {}
        for token, text in enumerate(self.texts):
            if text:
                first = index.setdefault(self._key(text[0]), {})
                first.setdefault(self._key(text[1]) if len(text) > 1 else "", []).append(token)
        self._index = {
            a: {b: torch.tensor(ids, dtype=torch.long) for b, ids in seconds.items()}
            for a, seconds in index.items()
        }

    def _key(self, ch: str) -> str:
        return ch if ch.isascii() else self.NON_ASCII

    def candidates(self, state: State) -> torch.Tensor:
        """Ids of the tokens whose first two characters `state` accepts (a superset of those
        it accepts whole)."""
        kept = []
        for a, seconds in self._index.items():
            after = state.fed(a)
            if after is None:
                continue
            kept += [ids for b, ids in seconds.items() if b == "" or after.accepts(b)]
        return torch.cat(kept) if kept else torch.empty(0, dtype=torch.long)


# -- segments -------------------------------------------------------------------------------
def _begin(segment: Segment) -> Any:
    if isinstance(segment, Literal):
        return [0]
    if isinstance(segment, OneOf):
        return [0, segment.options]
    if isinstance(segment, Spaces):
        return None
    return _Json()


def _copy(inner: Any) -> Any:
    if isinstance(inner, list):
        return list(inner)
    if isinstance(inner, _Json):
        return inner.copy()
    return inner


def _feed(segment: Segment, inner: Any, ch: str) -> bool:
    if isinstance(segment, Literal):
        if inner[0] < len(segment.text) and segment.text[inner[0]] == ch:
            inner[0] += 1
            return True
        return False
    if isinstance(segment, OneOf):
        pos, alive = inner
        kept = tuple(o for o in alive if pos < len(o) and o[pos] == ch)
        if not kept:
            return False
        inner[0], inner[1] = pos + 1, kept
        return True
    if isinstance(segment, Spaces):
        return ch in " \t\r\n"
    return bool(inner.feed(ch))


def _can_end(segment: Segment, inner: Any) -> bool:
    if isinstance(segment, Literal):
        return bool(inner[0] == len(segment.text))
    if isinstance(segment, OneOf):
        return any(len(o) == inner[0] for o in inner[1])
    if isinstance(segment, Spaces):
        return True
    return bool(inner.done)


def _more(segment: Segment, inner: Any) -> bool:
    """Whether the segment could still take more text (then the reply is not over)."""
    if isinstance(segment, OneOf):
        return any(len(o) > inner[0] for o in inner[1])
    return isinstance(segment, Spaces)


# -- JSON -----------------------------------------------------------------------------------
_WS = " \t\r\n"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_ESCAPES = '"\\/bfnrt'
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}


class _Json:
    """A JSON object, character by character (RFC 8259; the root must be an object)."""

    __slots__ = ("hex_left", "key", "left", "mode", "stack")

    def __init__(self) -> None:
        self.stack: list[str] = []
        """Open containers, `{` or `[`."""
        self.mode = "root"
        self.key = False
        """The string being read is an object key."""
        self.left = ""
        """Letters still due in a literal."""
        self.hex_left = 0
        """Hex digits still due in a `\\u` escape."""

    def copy(self) -> _Json:
        other = _Json.__new__(_Json)
        other.stack, other.mode, other.key = list(self.stack), self.mode, self.key
        other.left, other.hex_left = self.left, self.hex_left
        return other

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def feed(self, ch: str) -> bool:
        mode = self.mode
        if mode == "string":
            if ch == '"':
                self._value_end() if not self.key else self._to("colon")
                return True
            if ch == "\\":
                self.mode = "escape"
                return True
            return ch >= " "
        if mode == "escape":
            if ch == "u":
                self.mode, self.hex_left = "unicode", 4
                return True
            if ch in _ESCAPES:
                self.mode = "string"
                return True
            return False
        if mode == "unicode":
            if ch not in _HEX:
                return False
            self.hex_left -= 1
            if not self.hex_left:
                self.mode = "string"
            return True
        if mode in ("minus", "zero", "int", "frac0", "frac", "exp0", "expsign", "exp"):
            return self._number(ch)
        if mode == "literal":
            if not self.left or ch != self.left[0]:
                return False
            self.left = self.left[1:]
            if not self.left:
                self._value_end()
            return True
        if mode == "done":
            return False
        if ch in _WS:
            return True
        if mode == "root":
            return ch == "{" and self._open("{")
        if mode in ("value", "value_or_close"):
            if mode == "value_or_close" and ch == "]":
                return self._close("]")
            return self._value_start(ch)
        if mode in ("key_or_close", "key"):
            if mode == "key_or_close" and ch == "}":
                return self._close("}")
            if ch == '"':
                self.mode, self.key = "string", True
                return True
            return False
        if mode == "colon":
            if ch == ":":
                self.mode = "value"
                return True
            return False
        if mode == "after":
            if ch == ",":
                self.mode = "key" if self.stack[-1] == "{" else "value"
                return True
            if ch in "}]":
                return self._close(ch)
            return False
        raise AssertionError(f"unknown mode {mode}")

    def _to(self, mode: str) -> None:
        self.mode, self.key = mode, False

    def _value_start(self, ch: str) -> bool:
        if ch in "{[":
            return self._open(ch)
        if ch == '"':
            self.mode, self.key = "string", False
            return True
        if ch == "-":
            self.mode = "minus"
            return True
        if ch in _DIGITS:
            self.mode = "zero" if ch == "0" else "int"
            return True
        if ch in _LITERALS:
            self.mode, self.left = "literal", _LITERALS[ch]
            return True
        return False

    def _open(self, ch: str) -> bool:
        if len(self.stack) >= MAX_DEPTH:
            return False
        self.stack.append(ch)
        self.mode = "key_or_close" if ch == "{" else "value_or_close"
        return True

    def _close(self, ch: str) -> bool:
        if not self.stack or {"}": "{", "]": "["}[ch] != self.stack[-1]:
            return False
        self.stack.pop()
        self._value_end()
        return True

    def _value_end(self) -> None:
        self._to("after" if self.stack else "done")

    def _number(self, ch: str) -> bool:
        mode = self.mode
        if ch in _DIGITS:
            if mode == "zero":
                return False  # no leading zeros
            self.mode = {
                "minus": "zero" if ch == "0" else "int",
                "int": "int",
                "frac0": "frac",
                "frac": "frac",
                "exp0": "exp",
                "expsign": "exp",
                "exp": "exp",
            }[mode]
            return True
        if ch == "." and mode in ("zero", "int"):
            self.mode = "frac0"
            return True
        if ch in "eE" and mode in ("zero", "int", "frac"):
            self.mode = "exp0"
            return True
        if ch in "+-" and mode == "exp0":
            self.mode = "expsign"
            return True
        if mode in ("zero", "int", "frac", "exp"):  # the number ended: the char is the next one
            self._value_end()
            return self.feed(ch)
        return False
