"""What the soak's loops got done: tasks/s and completion tokens/s, per loop and for all of them together.

The tokens are what the agent reports for each task: `task_end.tokens.outputTokens` in the transcript, the
ACP `usage` of its prompt answers. The inference agent on an endpoint counts there the server's
`usage.completion_tokens`, summed over the task's steps (a server that reports no usage: its streamed chunks).
An agent that reports none (the scripted agent reports only the context it used) leaves the token figures
null, not zero. Every rate is over wall time from the soak's start: a loop's to its last task's end, the
aggregate to the end of the last loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoopCount", "aggregate", "output_tokens", "rate"]


def rate(amount: float | None, seconds: float) -> float | None:
    """`amount` per second to three significant figures (a model's 0.412 tasks/s and a script's 41.2 alike)."""
    if amount is None or seconds <= 0:
        return None
    return float(f"{amount / seconds:.3g}")


def output_tokens(record: Mapping[str, Any]) -> int | None:
    """The completion tokens a `task_end` record reports for its task, or None when the agent reported none."""
    tokens = record.get("tokens")
    value = tokens.get("outputTokens") if isinstance(tokens, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class LoopCount:
    """One loop's tasks and tokens, counted from its `task_end` records."""

    loop: int  # numbered from 1
    tasks: int  # its share of the soak's tasks
    done: int = 0  # tasks that ended
    seconds: float = 0.0  # from the soak's start to its last task's end
    output_tokens: int = 0
    reported: int = 0  # tasks whose agent reported completion tokens
    terminals: dict[str, int] = field(default_factory=dict)

    def count(self, record: Mapping[str, Any], seconds: float) -> None:
        """A `task_end` record, `seconds` after the soak started."""
        self.done += 1
        self.seconds = seconds
        self.terminals[record["terminal"]] = self.terminals.get(record["terminal"], 0) + 1
        tokens = output_tokens(record)
        if tokens is not None:
            self.output_tokens += tokens
            self.reported += 1

    @property
    def tokens(self) -> int | None:
        return self.output_tokens if self.reported else None

    def figures(self) -> dict[str, Any]:
        return {
            "loop": self.loop,
            "tasks": self.tasks,
            "done": self.done,
            "seconds": round(self.seconds, 2),
            "tasks_per_second": rate(self.done, self.seconds),
            "output_tokens": self.tokens,
            "tokens_per_second": rate(self.tokens, self.seconds),
            "terminals": dict(self.terminals),
        }


def aggregate(loops: Sequence[LoopCount], seconds: float) -> dict[str, Any]:
    """All the loops together over `seconds` of wall time: tasks and tokens summed, each a rate over that time
    (not the sum of the loops' rates: a loop that finished early does not count its idle end)."""
    done = sum(loop.done for loop in loops)
    reported = any(loop.reported for loop in loops)
    tokens = sum(loop.output_tokens for loop in loops) if reported else None
    return {
        "loops": len(loops),
        "done": done,
        "seconds": round(seconds, 2),
        "tasks_per_second": rate(done, seconds),
        "output_tokens": tokens,
        "tokens_per_second": rate(tokens, seconds),
        # tasks whose agent reported no tokens count none: say how many did
        "tasks_with_tokens": sum(loop.reported for loop in loops),
    }
