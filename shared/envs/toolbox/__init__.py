"""toolbox: a ToolSandbox-style phone-assistant environment with seeded worlds and tasks."""

from shared.envs.toolbox.env import ToolboxEnvironment

__all__ = ["ToolboxEnvironment"]
