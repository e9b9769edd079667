"""The router's cost of recognising a conversation, by the length of its history: the hashes
of a request's prefixes (its candidates for an earlier reply's tip) and the tip it is stored
at with its reply, on the event loop for every request.

    python -m benchmarks.conversation_tips

An agent's history: a system turn, the user's request, then tool calls and their 1 kB
results. Run on a checkout from before `History` (7a51710), it measures that code's
`prefix_tips` and `tip` instead.
"""

from __future__ import annotations

import json
import time
from typing import Any

from services.router import conversations


def history(calls: int, result_bytes: int = 1000) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful agent. " * 20},
        {"role": "user", "content": "Please fix order W123 and tell me what you did."},
    ]
    for i in range(calls):
        arguments = json.dumps({"order": "W123", "step": i})
        call = {"id": f"c{i}", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": arguments}  # type: ignore[assignment]
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x" * result_bytes})
    messages.append({"role": "assistant", "content": "Done, here is what I found."})
    messages.append({"role": "user", "content": "thanks, and the other one?"})
    return messages


def one_request(messages: list[dict[str, Any]]) -> None:
    reply = {"role": "assistant", "content": "Sure."}
    if hasattr(conversations, "History"):
        conversations.History(messages).tip_with(reply)
    else:  # the code before: every prefix hashed whole, then the history with its reply
        conversations.prefix_tips(messages)
        conversations.tip([*messages, reply])


def main() -> None:
    rows = []
    for calls in (1, 10, 50, 100):
        messages = history(calls)
        repeat = max(5, 2000 // len(messages))
        started = time.perf_counter()
        for _ in range(repeat):
            one_request(messages)
        ms = (time.perf_counter() - started) / repeat * 1000
        rows.append({"messages": len(messages), "ms_per_request": round(ms, 3)})
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
