"""Environments whose tools an MCP server serves (docs/environments.md, "MCP tools")."""
