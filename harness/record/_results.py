"""What a run returns: its stop, and each task's result (the `--json` contract's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._terminals import EXIT_CODE, Stop, Terminal

__all__ = ["RunResult", "TaskResult"]


@dataclass(slots=True)  # a run keeps one per task: keep them small
class TaskResult:
    id: str
    title: str
    terminal: Terminal
    reason: dict[str, Any]
    rule_ids: list[str] = field(default_factory=list)
    iterations: int = 0
    mark_done_error: dict[str, Any] | None = None
    left_changes: list[str] = field(default_factory=list)
    tokens: dict[str, Any] | None = None  # the agent's token usage, when it reports it
    seconds: float = 0.0  # wall time of the task
    # tool calls the agent reported `failed`: a Completed task whose every call failed is the agent's business,
    # but its record says so
    failed_tool_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "terminal": self.terminal.value,
            "reason": self.reason,
            "rule_ids": self.rule_ids,
            "iterations": self.iterations,
        }
        if self.mark_done_error:
            data["mark_done_error"] = self.mark_done_error
        if self.left_changes:
            data["left_changes"] = self.left_changes
        if self.tokens:
            data["tokens"] = self.tokens
        if self.failed_tool_calls:
            data["failed_tool_calls"] = self.failed_tool_calls
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass
class RunResult:
    stop: Stop
    tasks: list[TaskResult]
    transcript: Path

    @property
    def terminal(self) -> Terminal:
        return self.stop.terminal

    @property
    def reason(self) -> dict[str, Any]:
        return dict(self.stop.reason)

    @property
    def exit_code(self) -> int:
        return EXIT_CODE[self.stop.terminal]

    def to_json(self) -> dict[str, Any]:
        return {**self.stop.to_json(), "tasks": [t.to_json() for t in self.tasks], "transcript": str(self.transcript)}
