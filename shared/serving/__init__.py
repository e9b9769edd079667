"""`retrace serve-model`: an OpenAI-compatible server on transformers + peft (the embedded
default; production uses vLLM behind the same API)."""
