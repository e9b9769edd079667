"""The evaluator service: evaluates adapters on held-out tasks and decides promotion."""
