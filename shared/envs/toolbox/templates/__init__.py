"""Task templates, one module per task kind; each template writes one task into a TaskBuilder."""

from __future__ import annotations

from collections.abc import Callable

from shared.envs.toolbox.builder import TaskBuilder
from shared.envs.toolbox.templates import (
    error_recovery,
    insufficient_information,
    multi_step,
    needs_clarification,
    report_result,
    single_tool,
)

Template = Callable[[TaskBuilder], None]

TEMPLATES: dict[str, tuple[Template, ...]] = {
    "single_tool": single_tool.TEMPLATES,
    "multi_step": multi_step.TEMPLATES,
    "needs_clarification": needs_clarification.TEMPLATES,
    "insufficient_information": insufficient_information.TEMPLATES,
    "error_recovery": error_recovery.TEMPLATES,
    "report_result": report_result.TEMPLATES,
}
