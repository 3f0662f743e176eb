"""What follows a turn: the next prompt, or the session's terminal. Pure: no agent, no I/O.

The kernel awaits the agent; these functions decide. Every branch of the table is tested in
`tests/scripted/test_turn_table.py` in milliseconds, and budgets add their checks here.

    before each turn:  a model-turn budget spent → MaxIterations (its stop code; see _budget)
                       a user's cancel → Cancelled;  a segment ceiling → a new segment, and on
    after each turn:   a refusal on record       → BlockedPolicy (whatever the stop reason)
                       stopReason refusal        → Failed
                       stopReason cancelled      → Cancelled
                       max_tokens / max_turn_requests → "Continue."
                       end_turn, single prompt   → EndTurn
                       end_turn after acting     → Completed
                       end_turn without acting   → the standing answer, until they are spent
                                                   → BlockedAwaitingInput
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..budget._budget import NewSegment
from ..record._terminals import Stop, Terminal

__all__ = [
    "CONTINUE_PROMPT",
    "SEGMENT_PROMPT",
    "STANDING_PROMPT",
    "NextPrompt",
    "PromptKind",
    "TurnOutcome",
    "after_turn",
    "before_turn",
]

STANDING_PROMPT = (
    "Continue without waiting for input; policy decides permissions. If the task is finished, say so and end your turn."
)
CONTINUE_PROMPT = "Continue."
SEGMENT_PROMPT = (
    "You reached this segment's tool-call budget and the turn was stopped; a new segment starts now. Continue "
    "the task where you left off, with fewer and more targeted tool calls."
)


class PromptKind(StrEnum):
    """Why a prompt was sent (the `prompt_kind` of a `turn` record, before any `+steering`)."""

    TASK = "task"
    STANDING_POLICY = "standing_policy"
    CONTINUE_AFTER_MAX_TOKENS = "continue_after_max_tokens"
    CONTINUE_AFTER_MAX_TURN_REQUESTS = "continue_after_max_turn_requests"
    CONTINUE_NEW_SEGMENT = "continue_new_segment"  # a tool-call segment ceiling cancelled the turn


@dataclass(frozen=True)
class TurnOutcome:
    """What one turn came to: the agent's stop reason and what the turn did."""

    stop_reason: str
    tool_calls: int = 0  # tool_call updates, of any kind
    client_calls: int = 0  # fs/* and terminal/* requests the kernel served
    refusal: Mapping[str, Any] | None = None  # the run's first policy refusal, if any is on record

    @property
    def acted(self) -> bool:
        return self.tool_calls + self.client_calls > 0


@dataclass(frozen=True)
class NextPrompt:
    """Send another prompt in the same session; `standing` counts the standing answers given so far."""

    text: str
    kind: PromptKind
    standing: int


def before_turn(*, budget: Stop | NewSegment | None, cancel_requested: bool) -> Stop | NewSegment | None:
    """Whether the next turn may start: `budget` is the model-turn budgets' answer (`Account.before_turn`)."""
    if isinstance(budget, Stop):
        return budget
    if cancel_requested:
        return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn_boundary"})
    return budget


def after_turn(outcome: TurnOutcome, *, single_prompt: bool, standing: int, standing_answers: int) -> Stop | NextPrompt:
    """The session's terminal, or the prompt that follows; `standing` answers were given before this turn."""
    if outcome.refusal is not None:  # whatever stop reason followed the refusal
        return Stop(Terminal.BLOCKED_POLICY, outcome.refusal)
    reason = outcome.stop_reason
    if reason == "refusal":
        return Stop(Terminal.FAILED, {"kind": "refusal", "stop_reason": reason})
    if reason == "cancelled":
        return Stop(Terminal.CANCELLED, {"kind": "agent_cancelled", "stop_reason": reason})
    if reason == "max_tokens":
        return NextPrompt(CONTINUE_PROMPT, PromptKind.CONTINUE_AFTER_MAX_TOKENS, standing)
    if reason == "max_turn_requests":
        return NextPrompt(CONTINUE_PROMPT, PromptKind.CONTINUE_AFTER_MAX_TURN_REQUESTS, standing)
    if single_prompt:  # end_turn of a single-prompt run
        return Stop(Terminal.END_TURN, {"kind": "end_turn", "acted": outcome.acted})
    if outcome.acted:
        return Stop(
            Terminal.COMPLETED,
            {"kind": "end_turn", "tool_calls": outcome.tool_calls, "client_calls": outcome.client_calls},
        )
    if standing >= standing_answers:
        reason_ = {"kind": "no_tool_call", "standing_answers": standing, "limit": standing_answers}
        return Stop(Terminal.BLOCKED_AWAITING_INPUT, reason_)
    return NextPrompt(STANDING_PROMPT, PromptKind.STANDING_POLICY, standing + 1)
