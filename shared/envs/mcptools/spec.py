"""An MCP environment's description: a YAML file naming the MCP server, the task file and the
system prompt; each task carries the checks its reward is made of.

    name: notes-desk
    server:                       # a stdio server retrace starts, fresh for every episode
      command: python
      args: [server.py]
    # or: server: {url: "http://127.0.0.1:8000/mcp"}   (streamable HTTP, state shared)
    tasks: tasks.jsonl            # relative to this file
    system_prompt: You keep the user's notes.

A task row: `id`, `split`, `prompt`, optional `replies`, and `checks`, each one of
  {kind: called, tool, arguments: {...}}      a successful call of the tool with these arguments
  {kind: not_called, tool}                    the tool was never called
  {kind: result_contains, tool, text}         a successful result of the tool contains the text
  {kind: reply_contains, text}                the final reply contains the text (case-insensitive)
  {kind: judge, text}                         a model judges the episode against the criterion
with an optional `weight` (default 1). The reward is the weighted share of checks passed;
success is all of them. `judge` checks need the file's `judge` block:

    judge:
      model: qwen2.5-coder-0.5b   # a model on RETRACE_MODEL_URL, or on `url:` when given
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from shared.envs.kit.tasks import read_tasks
from shared.envs.protocol import TaskSpec
from shared.errors import PermanentError

CheckKind = Literal["called", "not_called", "result_contains", "reply_contains", "judge"]


class McpSpecError(PermanentError):
    """An MCP environment file, or a task's checks, that cannot be used; names the file."""


class ServerSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    command: str | None = None
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    """Relative to the environment file; default: its folder."""
    url: str | None = None
    """A streamable-HTTP server (`.../mcp`) instead of a command."""


class JudgeSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The model that grades `judge` checks (shared/envs/mcptools/judge.py)."""

    model: str
    url: str | None = None
    """An OpenAI-compatible endpoint; default: the services' own (`RETRACE_MODEL_URL`)."""
    temperature: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    max_tokens: Annotated[int, msgspec.Meta(ge=16)] = 256
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    max_transcript_chars: Annotated[int, msgspec.Meta(ge=1000)] = 6000


class McpEnvSpec(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    name: str
    server: ServerSpec
    tasks: str
    system_prompt: str = ""
    call_timeout_s: float = 60.0
    result_chars: int = 4000
    """A tool result longer than this reaches the agent cut, with a note."""
    judge: JudgeSpec | None = None
    """Grades the tasks' `judge` checks; required when any task has one."""


class Check(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    kind: CheckKind
    tool: str | None = None
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    text: str | None = None
    weight: float = 1.0


def load_spec(path: Path) -> tuple[McpEnvSpec, Path]:
    """The spec in `path` and the folder its relative paths start from."""
    if not path.is_file():
        raise McpSpecError(f"MCP environment file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = msgspec.convert(raw, McpEnvSpec)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise McpSpecError(f"MCP environment file {path}: {exc}") from None
    if (spec.server.command is None) == (spec.server.url is None):
        raise McpSpecError(
            f"MCP environment file {path}: server needs a command or a url, not both"
        )
    return spec, path.parent


def load_tasks(spec: McpEnvSpec, base: Path) -> list[TaskSpec]:
    """The task file's tasks, each with checks that parse and name their tools."""
    tasks = read_tasks(base / spec.tasks)
    for task in tasks:
        checks(task)
    return tasks


def checks(task: TaskSpec) -> list[Check]:
    raw = task.data.get("checks")
    if not isinstance(raw, list) or not raw:
        raise McpSpecError(f"task {task.id!r} needs a non-empty list of checks")
    try:
        parsed = msgspec.convert(raw, list[Check])
    except msgspec.ValidationError as exc:
        raise McpSpecError(f"task {task.id!r}: bad checks: {exc}") from None
    for check in parsed:
        if check.kind == "judge":
            if not (check.text or "").strip():
                raise McpSpecError(f"task {task.id!r}: a 'judge' check needs its criterion text")
            continue
        if check.kind != "reply_contains" and not check.tool:
            raise McpSpecError(f"task {task.id!r}: a {check.kind!r} check names its tool")
        if check.kind in ("reply_contains", "result_contains") and not check.text:
            raise McpSpecError(f"task {task.id!r}: a {check.kind!r} check needs its text")
        if check.weight <= 0:
            raise McpSpecError(f"task {task.id!r}: check weights must be positive")
    return parsed
