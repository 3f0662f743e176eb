"""What a person watching `loop-harness run` sees: progress on stderr, a closing table on stdout.

The display is a transcript observer: it never touches the kernel. On a
terminal it shows a live status line (task, turn, tokens); elsewhere it
prints one line per event, so logs stay readable.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

from .record._results import RunResult

__all__ = ["RunDisplay", "summary_table"]


Part = str | tuple[str, str]  # plain text, or (text, style) as rich.text.Text.assemble takes them


class RunDisplay:
    """Call with each transcript record (a `Kernel` observer); `close()` when the run ends.

    Whether stderr is a terminal is decided once: off a terminal a line is one plain write (rich's
    rendering cost 1.3-1.7 ms of CPU per task there, more than the rest of the kernel's bookkeeping)."""

    wants_rpc = False  # it shows no `rpc` record, two thirds of a task's: the transcript does not hand them over

    def __init__(self, console: Console | None = None, stream: TextIO | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.stream = stream or sys.stderr
        self._status: Status | None = None
        self._task: str | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "agent_start":
            self._show(f"starting the agent: {' '.join(record['argv'][-4:])}")
        elif kind == "task_start":
            task = record["task"]
            self._task = task["id"] or "prompt"
            if task["id"]:
                self._print((f"→ {task['id']}", "bold"), f": {task['title']}")
            self._show(f"{self._task}: waiting for the agent")
        elif kind == "turn":
            if self.live:
                self._show(
                    f"{self._task}: {_budget_line(record.get('budget'))} ({record['prompt_kind'].replace('_', ' ')})"
                )
        elif kind == "budget" and record["event"] in ("tripped", "new_segment", "nudge", "convergence"):
            self._print("  ", ("budget", "yellow"), f" {_budget_event(record)}")
        elif kind == "usage" and record.get("usage"):
            self._show(f"{self._task}: {record['usage'].get('totalTokens', 0)} tokens so far")
        elif kind == "policy" and record["decision"] == "refuse":
            self._print("  ", ("refused", "red"), f" {record['source']}: {record['reason'].get('kind')}")
        elif kind == "host_retry":
            self._print(f"  host {record['op']}: {record['cause']}, retry {record['retry']} in {record['delay_s']}s")
        elif kind == "task_end":
            mark = ("✓", "green") if record["terminal"] == "Completed" else ("✗", "red")
            rules = ", ".join(record["rule_ids"]) or "none"
            self._print(
                "  ", mark, f" {record['id']} {record['terminal']} after {record['iterations']} turn(s); rules: {rules}"
            )
        elif kind == "terminal":
            self.close()

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _show(self, text: str) -> None:
        if not self.live:
            return
        if self._status is None:
            self._status = self.console.status(Text(text))
            self._status.start()
        else:
            self._status.update(Text(text))

    def _print(self, *parts: Part) -> None:
        """Styled on a terminal; the agent's and the host's words are never read as markup."""
        if self.live:
            self.console.print(Text.assemble(*parts))
        else:
            self.stream.write("".join(part if isinstance(part, str) else part[0] for part in parts) + "\n")


def _budget_line(budget: dict[str, Any] | None) -> str:
    """`turn cur/max · total cur/max · cont cur/max` (the budget header of the progress line)."""
    if not budget:
        return "turn"
    return " · ".join(f"{key} {budget[key][0]}/{budget[key][1]}" for key in ("turn", "total", "cont"))


def _budget_event(record: dict[str, Any]) -> str:
    if record["event"] == "tripped":
        reason = record["reason"]
        if "stop_code" not in reason:  # a question that needs a person
            return f"{reason['kind']}: {reason.get('why', '')}"
        return f"{reason['stop_code']}: {reason['current']} of {reason['limit']} ({reason['key']}, {reason['source']})"
    if record["event"] == "new_segment":
        return f"new segment ({record['why']}): continuation {record['continuation']}/{record['limit']}"
    return f"{record['event']} sent to the agent"


def summary_table(result: RunResult) -> Table:
    """task, terminal, rule ids used, tokens, time."""
    table = Table(title=f"{result.terminal.value}: {result.reason.get('kind')}", title_justify="left")
    for column in ("task", "terminal", "rule ids used", "tokens", "time"):
        table.add_column(column, justify="right" if column in ("tokens", "time") else "left")
    for task in result.tasks:
        tokens = str(task.tokens.get("totalTokens", task.tokens.get("used", ""))) if task.tokens else "-"
        table.add_row(task.id, task.terminal.value, ", ".join(task.rule_ids) or "-", tokens, f"{task.seconds:.1f} s")
    return table
