"""What the model is shown of its own past tool calls, with the real tokenizers and templates:
Qwen's own template and ours (SmolLM2's), as `serve-model` and GRPO's prompts render them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

pytest.importorskip("transformers", reason="model tests need the train extra")

from transformers import AutoTokenizer

from shared.llm.openai_types import ChatRequest
from shared.serving.prompts import PromptBuilder, Unrenderable
from tests.support.histories import after_a_call
from tests.support.models import packaged_or_skip

pytestmark = [pytest.mark.model]


def _rendered(tokenizer: Any, arguments: str) -> str:
    request = msgspec.convert({"model": "m", **after_a_call(arguments)}, ChatRequest)
    ids, _ = PromptBuilder(tokenizer).build(request)
    return str(tokenizer.decode(ids))


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return AutoTokenizer.from_pretrained(packaged_or_skip(request.param))


def test_a_past_call_is_shown_as_the_model_writes_one(tokenizer: Any) -> None:
    # Qwen's template writes `arguments | tojson`: given the request's JSON text it showed
    # "arguments": "{\"room\": 12}", a call quoted twice, unlike any the model writes
    text = _rendered(tokenizer, '{"room": 12, "note": "late \\u00e9"}')
    assert '{"name": "book", "arguments": {"room": 12, "note": "late é"}}' in text
    assert '\\"room\\"' not in text


def test_empty_arguments_are_an_empty_object(tokenizer: Any) -> None:
    assert '{"name": "book", "arguments": {}}' in _rendered(tokenizer, "")


@pytest.mark.parametrize("arguments", ["{room: 12", "[12]", "12", "null"])
def test_arguments_that_are_not_an_object_are_an_empty_one_as_in_vllm(
    tokenizer: Any, arguments: str
) -> None:
    # vLLM 0.32 coerces them so (renderers/chat_utils.py): the same prompt under either server
    assert '{"name": "book", "arguments": {}}' in _rendered(tokenizer, arguments)


def test_a_lone_surrogate_in_a_past_call_is_the_caller_s_error(tokenizer: Any) -> None:
    # session 33's review: the escape became a raw surrogate the tokenizer refused, a 500
    # (vLLM answers the same history with a 400)
    with pytest.raises(Unrenderable, match="cannot be tokenized"):
        _rendered(tokenizer, '{"h": "\\ud83d"}')
