"""Talking to models: OpenAI wire types, the tool-call format, the client."""
