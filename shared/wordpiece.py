"""A BERT WordPiece tokenizer's ids for plain text, word by word from memory.

Routing embeds each new conversation's first request with static token vectors, and the Rust
`tokenizers` took 55 us for one short request (its normalizer, pre-tokenizer and model run
whole for every call), several times the vectors' own arithmetic. For BERT's uncased
tokenizer, text of printable ASCII splits the same way wherever it stands: normalising is
lowercasing, pre-tokenizing cuts at whitespace and makes each punctuation mark a word, and
WordPiece reads each word alone. So a word's ids are asked of the tokenizer once and kept,
and a text's ids are its words' ids in order. Anything else (other characters, control
characters, a bracket that may open a special token such as `[MASK]`) goes to the tokenizer
whole. The ids are the tokenizer's own either way (a property test compares them).

One `WordIds` serves every stage of a routing decision (the static vectors, the learned
table, MiniLM's graph): each is handed the same request, and the last text's ids are kept, so
the request is split once.
"""

from __future__ import annotations

import re
from typing import Any

_PLAIN = re.compile(r"[\t\n\r\x20-\x5a\x5c\x5e-\x7e]*")
"""Text the word-by-word path takes: printable ASCII and tab, newline, return, without `[`
and `]` (the tokenizer finds its special tokens in the raw text, before normalising)."""
_WORDS = re.compile(r"[a-z0-9]+|[^a-z0-9\s]")
"""BERT's words of lowercased plain text: runs of letters and digits; each other printable
character (every one is punctuation to BERT) alone."""


LONGEST = 100
"""WordPiece's longest word (`max_input_chars_per_word`): a longer one is [UNK], asked of
the tokenizer each time and not kept (a few thousand such words would hold megabytes)."""


class WordIds:
    """`ids(text)`: the token ids `tokenizer` gives `text` without special tokens, cut to
    `limit`. `tokenizer` is a `tokenizers.Tokenizer` with BERT's normalizer (uncased) and
    pre-tokenizer; at most `size` words are kept (all forgotten when full, then learnt
    again). The list returned is shared with later callers given the same text object: read
    it, do not change it."""

    def __init__(self, tokenizer: Any, limit: int, size: int = 65_536) -> None:
        self.tokenizer = tokenizer
        self.limit = limit
        self.size = size
        self._words: dict[str, list[int]] = {}
        self._last: tuple[str, list[int]] = ("", [])
        """The text asked for last (the very object, compared by identity) and its ids."""

    def ids(self, text: str) -> list[int]:
        last = self._last  # one read: another thread may replace it meanwhile
        if last[0] is text:
            return last[1]
        out = self._split(text)
        self._last = (text, out)
        return out

    def _split(self, text: str) -> list[int]:
        if not _PLAIN.fullmatch(text):
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)[: self.limit]
        words = self._words
        out: list[int] = []
        for match in _WORDS.finditer(text.lower()):  # read no further than the limit
            word = match.group()
            own = words.get(word)
            if own is None:
                own = list(self.tokenizer.encode(word, add_special_tokens=False).ids)
                if len(word) <= LONGEST:
                    if len(words) >= self.size:
                        words.clear()
                    words[word] = own
            out += own
            if len(out) >= self.limit:
                return out[: self.limit]
        return out
