"""The eleven typed terminals a run (and each task in it) can end in.

The kernel *returns* a `Stop`; it never raises one. Every `Stop` carries a
machine-readable reason: a JSON object whose `kind` says what happened, plus
the facts a caller needs (the rule id for a policy stop, the failed check for
a precondition, the exit status and stderr tail for a crashed agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["EXIT_CODE", "REASON_KINDS", "Stop", "Terminal"]


class Terminal(StrEnum):
    COMPLETED = "Completed"  # a task (or a single-task run) finished
    END_TURN = "EndTurn"  # a single-prompt run: the agent ended its turn
    CANCELLED = "Cancelled"  # a user's cancel, or the agent cancelled the turn itself
    MAX_ITERATIONS = "MaxIterations"  # a budget or stall rule stopped the task (a stop code says which)
    BLOCKED_POLICY = "BlockedPolicy"  # the policy refused a request during the turn
    BLOCKED_AWAITING_INPUT = "BlockedAwaitingInput"  # no-tool turns outlasted the standing answers
    BLOCKED_RATE_LIMITED = "BlockedRateLimited"  # the host kept rate-limiting past the retry budget
    BLOCKED_PRECONDITION = "BlockedPrecondition"  # a precondition failed at activation or a task boundary
    BLOCKED_HOST_UNAVAILABLE = "BlockedHostUnavailable"  # the host stayed unreachable past the budget
    FAILED = "Failed"  # the agent crashed, broke framing, refused, or timed out; the disk filled
    IDLE = "Idle"  # the queue is empty

    def __str__(self) -> str:
        return self.value


#: Exit status of `loop-harness run` for each terminal; 2 is reserved for a bad config.
EXIT_CODE: Mapping[Terminal, int] = {t: 0 if t in (Terminal.IDLE, Terminal.COMPLETED) else 1 for t in Terminal}


#: Every reason `kind` a terminal may carry (a task's or a run's).
REASON_KINDS: Mapping[Terminal, frozenset[str]] = {
    Terminal.COMPLETED: frozenset({"end_turn", "completed_earlier"}),
    Terminal.END_TURN: frozenset({"end_turn"}),
    Terminal.CANCELLED: frozenset({"user_cancel", "agent_cancelled", "interrupted"}),
    Terminal.MAX_ITERATIONS: frozenset({"budget", "stall"}),
    Terminal.BLOCKED_POLICY: frozenset({"policy_refusal"}),
    Terminal.BLOCKED_AWAITING_INPUT: frozenset({"no_tool_call", "termination", "question"}),
    Terminal.BLOCKED_RATE_LIMITED: frozenset({"rate_limited"}),
    Terminal.BLOCKED_PRECONDITION: frozenset({"precondition"}),
    Terminal.BLOCKED_HOST_UNAVAILABLE: frozenset({"host_unavailable", "host_rejected"}),
    Terminal.FAILED: frozenset(
        {
            "agent_start_failed",
            "agent_exited",
            "agent_error",
            "agent_timeout",
            "turn_timeout",
            "framing_error",
            "protocol_error",
            "protocol_version",
            "refusal",
            "kernel_error",
            "disk_full",
            "restarted",
        }
    ),
    Terminal.IDLE: frozenset({"queue_empty"}),
}


@dataclass(frozen=True)
class Stop:
    """One terminal plus its machine-readable reason (always has a `kind`)."""

    terminal: Terminal
    reason: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "kind" not in self.reason:
            raise ValueError(f"a Stop reason needs a 'kind' (got {dict(self.reason)!r})")
        if self.reason["kind"] not in REASON_KINDS[self.terminal]:  # register it (and in the schema) first
            raise ValueError(f"{self.reason['kind']!r} is not a reason kind of {self.terminal} (see REASON_KINDS)")

    def to_json(self) -> dict[str, Any]:
        return {"terminal": self.terminal.value, "reason": dict(self.reason)}
