"""Training environments derived from a plug-in target's own tasks (docs/environments.md)."""
