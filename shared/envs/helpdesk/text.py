"""Text matching shared by the scripted user and scoring: normalising, sentences, amounts."""

from __future__ import annotations

import re

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_REQUEST_OPENERS = (
    "please",
    "could you",
    "can you",
    "would you",
    "may i",
    "tell me",
    "let me know",
    "provide",
    "share",
)
ORDER_ID = re.compile(r"\bW\d{7}\b", re.IGNORECASE)


def normalize(text: str) -> str:
    """Lower case, thousands separators dropped (so "$1,234.50" matches "1234.50")."""
    return _THOUSANDS.sub("", text.lower())


def contains(text: str, needle: str) -> bool:
    return normalize(needle) in normalize(text)


def money(amount: float) -> str:
    """How amounts are required in communication checks: two decimals, no currency sign."""
    return f"{amount:.2f}"


def questions(text: str) -> list[str]:
    """The normalised sentences that ask something: ending in "?" or opening with a request."""
    out = []
    for sentence in _SENTENCE_END.split(normalize(text)):
        s = sentence.strip()
        if s.endswith("?") or s.startswith(_REQUEST_OPENERS):
            out.append(s)
    return out


def order_ids(text: str) -> set[str]:
    """Every order id (`W` and seven digits) the text mentions, upper-cased."""
    return {m.upper() for m in ORDER_ID.findall(text)}
