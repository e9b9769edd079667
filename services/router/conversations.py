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
from collections.abc import Sequence
from typing import Any


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
        except json.JSONDecodeError:
            return raw
    return raw


def tip(messages: Sequence[dict[str, Any]]) -> str:
    text = json.dumps([canonical(m) for m in messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def prefix_tips(messages: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """(length, hash) of every prefix that ends on an assistant turn, longest first: the
    candidates for an earlier reply's tip."""
    return [
        (n, tip(messages[:n]))
        for n in range(len(messages), 0, -1)
        if messages[n - 1].get("role") == "assistant"
    ]
