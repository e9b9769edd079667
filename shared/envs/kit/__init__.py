"""What a plug-in environment imports: the base class for the common case, the transcript its
reward reads, and the error a tool raises to refuse a call (docs/environments.md)."""

from shared.envs.kit.env import KitEpisode, TaskFileEnvironment, Transcript
from shared.envs.kit.schema import ToolDefinitionError, function_schema
from shared.envs.kit.tasks import TaskFileError, read_tasks
from shared.envs.protocol import Message, Score, TaskSpec
from shared.envs.tools import CallRecord, ToolError

__all__ = [
    "CallRecord",
    "KitEpisode",
    "Message",
    "Score",
    "TaskFileEnvironment",
    "TaskFileError",
    "TaskSpec",
    "ToolDefinitionError",
    "ToolError",
    "Transcript",
    "function_schema",
    "read_tasks",
]
