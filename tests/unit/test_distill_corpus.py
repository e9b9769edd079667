"""The distillation corpus keeps prose sentences and nothing of the routing benchmark."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.distill_query_encoder import MAX_WORDS, MIN_WORDS, build_corpus, sentences


def test_prose_is_split_into_sentences_and_code_is_dropped() -> None:
    text = (
        "Return the number of rows. Raises an error when the table is gone!\n\n"
        "Use `frame.loc[0]` to read one. See https://example.org for more.\n"
        "Is it safe to call twice? Yes."
    )
    assert list(sentences(text)) == [
        "Return the number of rows.",
        "Raises an error when the table is gone!",
        "Is it safe to call twice?",
    ]


@given(st.text(max_size=400))
def test_every_sentence_is_prose_of_a_bounded_length(text: str) -> None:
    for sentence in sentences(text):
        assert MIN_WORDS <= len(sentence.split()) <= MAX_WORDS
        assert sentence[0].isalnum() or sentence[0] in "'\""
        assert not any(c in sentence for c in "{}[]<>=_`\\\n")


def test_the_benchmark_requests_are_left_out_and_counted() -> None:
    request = "Please book me a double room for two nights from Friday."
    texts = [
        f"{request} Then nothing else happens here.",
        f"Our guest wrote: {request.lower()}",
        "A sentence that has nothing to do with it.",
    ]
    built = build_corpus(texts, {request.casefold()}, limit=10, seed=0)
    assert sorted(built["sentences"]) == [
        "A sentence that has nothing to do with it.",
        "Then nothing else happens here.",
    ]
    assert built["excluded"] == 2
