"""The scripted user: answers a question with the task's next withheld detail, else leaves.

Rules, in order, for an assistant message with no tool calls:
1. If the task still has a scripted reply and the text asks for something (it contains a `?`
   or a request phrase such as "please provide", "let me know", "which"), the user answers
   with that reply (the replies are used once each, in order).
2. Otherwise the user has nothing to add: the episode ends.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ASKING = (
    "please provide", "please tell", "please specify", "please confirm", "please share",
    "please let me know", "let me know", "could you tell", "can you tell", "could you provide",
    "can you provide", "could you specify", "can you specify", "could you confirm", "which",
    "what time", "when should", "what should", "what would you like", "i need to know",
    "do you want", "would you like",
)  # fmt: skip


def is_asking(text: str) -> bool:
    lowered = text.lower()
    return "?" in text or any(re.search(rf"\b{re.escape(p)}\b", lowered) for p in ASKING)


class ScriptedUser:
    def __init__(self, replies: Sequence[str]) -> None:
        self._pending = list(replies)
        self.answered = 0

    def respond(self, text: str) -> str | None:
        """The user's next message, or None when the conversation is over."""
        if self._pending and is_asking(text):
            self.answered += 1
            return self._pending.pop(0)
        return None
