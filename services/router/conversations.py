"""Recognising a conversation's next turn without a session id.

OpenAI-style clients send the whole history on every request. After each reply the router
stores the hash of the conversation so far (history plus the reply: its `tip`); the next
request of the same conversation starts with exactly those messages, so the longest prefix
of a request whose hash is a stored tip names the conversation. Hashes cover what a client
echoes back (roles, texts, tool calls by name and arguments, tool results), canonically
serialised, so key order or absent-vs-null fields do not matter. A client may instead send
`X-Retrace-Conversation: <id>` (the router returns that header on every reply).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            [
                (c.get("function") or {}).get("name"),
                _arguments((c.get("function") or {}).get("arguments")),
            ]
            for c in calls
        ]
    return out


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, an integer of 4,300+ digits, too deep
            return raw
    return raw


def tip(messages: Sequence[dict[str, Any]]) -> str:
    """The hash of the history's canonical JSON (`json.dumps` of the list, keys sorted)."""
    hashed = _Hashing()
    for message in messages:
        hashed.add(message)
    return hashed.digest()


def prefix_tips(messages: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """(length, hash) of every prefix that ends on an assistant turn, longest first: the
    candidates for an earlier reply's tip."""
    return History(messages).tips


class History:
    """A request's messages, each serialised once, the hash growing with the history:
    hashing every prefix whole took 13 ms of the router's event loop a request at 104
    messages, 72 ms at 204; now 1.3 and 2.6 ms (`benchmarks/conversation_tips.py`)."""

    def __init__(self, messages: Sequence[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self._hashing = _Hashing()
        tips = []
        for n, message in enumerate(messages, 1):
            self._hashing.add(message)
            if message.get("role") == "assistant":
                tips.append((n, self._hashing.digest()))
        tips.reverse()
        self.tips = tips
        """`prefix_tips` of the messages."""

    def tip_with(self, reply: dict[str, Any]) -> str:
        """The tip of the messages followed by `reply` (the reply's own serialisation
        only)."""
        hashing = self._hashing.copy()
        hashing.add(reply)
        return hashing.digest()


_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False)
"""`json.dumps(..., sort_keys=True, ensure_ascii=False)` without an encoder made per call (a
third of its time for a message of 1 kB): the definition of a message's serialisation."""

_TEXT = msgspec.json.Encoder(order="sorted")
"""A string as `_CANONICAL` writes it (every code point escaped alike: a unit test checks
them all), and a JSON value with its keys sorted as `_CANONICAL` sorts them."""


def _float(literal: str) -> msgspec.Raw:
    """A JSON number with a fraction or exponent as `json.loads` and then `_CANONICAL` give
    it (`repr` of the float: `1e+16`, where msgspec writes `1e16`); NaN and infinities (a
    literal past a float's range) are left to them."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError("not a finite float")
    return msgspec.Raw(repr(value).encode())


_ARGUMENTS = msgspec.json.Decoder(float_hook=_float)


_FAST_BRACKETS = 200
"""Arguments with more brackets than this (so possibly nested as deep) go to `json`: msgspec
reads a few levels deeper than `json.loads` before Python's recursion limit, whose text
`_arguments` then keeps as a string, so near that limit (about 900 levels in the router)
the two would differ. (There `json`'s own answer depends on the caller's stack: the tip of
arguments nested that deep was never a stable one.)"""


def _arguments_serialised(raw: str) -> bytes:
    """`_CANONICAL.encode(_arguments(raw))` as UTF-8. msgspec reads and writes it (with
    `msgspec.json.format`'s ", " and ": "), a fifth of the time; what it refuses (NaN, a
    lone surrogate, an integer it will not take) and deep nesting `json` does as it always
    did, so a property test finds the bytes the same for any arguments."""
    if raw.count("[") + raw.count("{") <= _FAST_BRACKETS:
        try:
            return msgspec.json.format(_TEXT.encode(_ARGUMENTS.decode(raw)), indent=0)
        except (ValueError, RecursionError):  # msgspec's DecodeError and UnicodeError too
            pass
    return _CANONICAL.encode(_arguments(raw)).encode("utf-8", "surrogatepass")


def serialised(message: dict[str, Any]) -> bytes:
    """`json.dumps(canonical(message), sort_keys=True, ensure_ascii=False)` as UTF-8 (lone
    surrogates passed): what a tip hashes. Written by msgspec for a message of the shape
    the router's requests and replies have (strings for the role, content, tool names and
    arguments), in a quarter to a half of the time (on long agent conversations `json` here
    was a sixth of the router's CPU); any other shape, or a lone surrogate, goes to `json`."""
    try:
        written = _written(message)
    except UnicodeError:  # a lone surrogate: msgspec will not write it
        written = None
    if written is not None:
        return written
    return _CANONICAL.encode(canonical(message)).encode("utf-8", "surrogatepass")


def _written(message: dict[str, Any]) -> bytes | None:
    """`serialised` by msgspec, or None for a message of another shape."""
    role = message.get("role")
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if type(role) is not str or type(content) is not str or type(calls) is not list:
        return None
    head = b'{"content": ' + _TEXT.encode(content) + b', "role": ' + _TEXT.encode(role)
    if not calls:
        return head + b"}"
    written = []
    for call in calls:
        function = call.get("function") if type(call) is dict else None
        if type(function) is not dict:
            return None
        name, arguments = function.get("name"), function.get("arguments")
        if type(name) is not str or type(arguments) is not str:
            return None
        written.append(b"[" + _TEXT.encode(name) + b", " + _arguments_serialised(arguments) + b"]")
    return head + b', "tool_calls": [' + b", ".join(written) + b"]}"


class _Hashing:
    """SHA-256 of `json.dumps([canonical(m), ...], sort_keys=True, ensure_ascii=False)`
    fed one message at a time: the same bytes, so tips stored before stay valid."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"[")
        self._first = True

    def add(self, message: dict[str, Any]) -> None:
        # a lone surrogate (arguments holding "\ud800") is hashed, not a 500
        self._hash.update(serialised(message) if self._first else b", " + serialised(message))
        self._first = False

    def copy(self) -> _Hashing:
        twin = _Hashing()
        twin._hash, twin._first = self._hash.copy(), self._first
        return twin

    def digest(self) -> str:
        """The hash of the messages added so far (more may be added after)."""
        done = self._hash.copy()
        done.update(b"]")
        return done.hexdigest()


@dataclass
class Known:
    """A conversation as this router process last answered it."""

    id: uuid.UUID
    agent_id: uuid.UUID
    api_key_id: uuid.UUID | None
    adapter_id: uuid.UUID | None
    route: dict[str, Any]
    tip: str
    """The hash of its history through the last reply ("" before the first)."""
    turns: int


_Entry = tuple[bytes, bytes | None, bytes | None, bytes, str, int]
"""What `Recent` keeps of a conversation: its agent's, key's and adapter's ids (16 bytes
each), its route (JSON), its tip and its turns."""


def _raw(ident: uuid.UUID | None) -> bytes | None:
    return ident.bytes if ident is not None else None


IDS_KEPT = 4096
"""Agent, key and adapter ids `Recent` keeps as objects, so that a conversation found does
not make them again (a few per tenant; forgotten all at once past this)."""


class Recent:
    """The conversations this process answered last, newest kept (LRU, `size` of them), so
    that the next turn of one is found without reading the store, and a turn that another
    turn of its conversation overtook becomes a branch before it is answered.

    Memory answers only when it holds a request's longest candidate tip (or its named
    conversation at that tip): anything else, such as a turn another router process
    answered, is looked up in the store as before, and the store's own check at record time
    still branches a turn whose conversation moved on meanwhile.

    Each conversation is kept as bytes, text and numbers only, which the garbage collector
    does not track: as `Known` objects (their ids, routes and index keys) 100,000 of them
    were half a million objects that each full collection walked while every request in
    flight waited (72 ms at most with 26,000 kept, docs/benchmarks.md session 26). `find`
    gives a `Known` made afresh from what is kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_id: OrderedDict[bytes, _Entry] = OrderedDict()
        self._by_tip: dict[tuple[bytes, bytes | None, str], bytes] = {}
        self._ids: dict[bytes, uuid.UUID] = {}
        """Agents', keys' and adapters' ids by their bytes (`IDS_KEPT`)."""

    def _uuid(self, raw: bytes | None) -> uuid.UUID | None:
        if raw is None:
            return None
        ident = self._ids.get(raw)
        if ident is None:
            if len(self._ids) >= IDS_KEPT:
                self._ids.clear()
            ident = self._ids[raw] = uuid.UUID(bytes=raw)
        return ident

    def __len__(self) -> int:
        return len(self._by_id)

    def find(
        self,
        agent_id: uuid.UUID,
        api_key_id: uuid.UUID | None,
        named: uuid.UUID | None,
        longest: str | None,
    ) -> Known | None:
        """The conversation a request continues, when memory can tell for sure: the one it
        names (`named`) or, without a name, the caller's one whose tip is the request's
        longest candidate; in both cases at that very tip."""
        if longest is None or self.size == 0:
            return None
        agent = agent_id.bytes
        ident = (
            named.bytes
            if named is not None
            else self._by_tip.get((agent, _raw(api_key_id), longest))
        )
        entry = self._by_id.get(ident) if ident is not None else None
        if ident is None or entry is None or entry[0] != agent or entry[4] != longest:
            return None
        self._by_id.move_to_end(ident)
        _, key, adapter, route, tip, turns = entry
        return Known(
            uuid.UUID(bytes=ident),
            agent_id,
            api_key_id if named is None else self._uuid(key),  # the tip's key is the caller's
            self._uuid(adapter),
            msgspec.json.decode(route),
            tip,
            turns,
        )

    def remember(self, known: Known) -> Known:
        """Keep `known` (replacing what memory had of that conversation)."""
        if self.size == 0:
            return known
        ident = known.id.bytes
        old = self._by_id.pop(ident, None)
        if old is not None:
            self._unindex(ident, old)
        entry: _Entry = (
            known.agent_id.bytes,
            _raw(known.api_key_id),
            _raw(known.adapter_id),
            msgspec.json.encode(known.route),
            known.tip,
            known.turns,
        )
        self._by_id[ident] = entry
        self._index(ident, entry)
        while len(self._by_id) > self.size:
            evicted, gone = self._by_id.popitem(last=False)
            self._unindex(evicted, gone)
        return known

    def answered(self, known: Known, found_tip: str, new_tip: str) -> Known | None:
        """Move `known` on to `new_tip` after a reply to the turn that found it at
        `found_tip`; None when another turn of it was answered since (the caller branches):
        memory's own tip says so where it still keeps the conversation, else `known`'s."""
        ident = known.id.bytes
        entry = self._by_id.get(ident)
        if (entry[4] if entry is not None else known.tip) != found_tip:
            return None
        known.tip = new_tip
        known.turns += 1
        if entry is not None:
            self._unindex(ident, entry)
            moved = (*entry[:4], new_tip, known.turns)
            self._by_id[ident] = moved
            self._index(ident, moved)
        return known

    def _index(self, ident: bytes, entry: _Entry) -> None:
        if entry[4]:
            self._by_tip[(entry[0], entry[1], entry[4])] = ident

    def _unindex(self, ident: bytes, entry: _Entry) -> None:
        key = (entry[0], entry[1], entry[4])
        if self._by_tip.get(key) == ident:
            del self._by_tip[key]
