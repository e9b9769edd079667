"""Environments: one protocol (protocol.py), built-in targets (toolbox, helpdesk), a registry."""
