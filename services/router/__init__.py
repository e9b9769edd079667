"""The router service: the OpenAI-compatible endpoint; picks an adapter per conversation."""
