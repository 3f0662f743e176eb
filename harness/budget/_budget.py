"""A task's accounting against its budgets and stall rules (docs/budgets.md). Pure: the kernel feeds it what it
sees (turn boundaries, tool calls and their statuses, the changes git reports) and the time; each feed
returns what follows: nothing, a `Stop` (the run ends `MaxIterations` with a stop code), a new segment,
or a note for the next prompt.

Units: a model turn is one `session/prompt` round; a tool call is one `tool_call`
the agent announces. Budgets allow their count (the call after the last one allowed stops the task, so a
stop says `current = limit + 1`); stall rules stop when their count is reached (`current = limit`).

Stop codes (the `stop_code` of a `{kind: "budget" | "stall"}` reason):

    MODEL_TURN_TOTAL_LIMIT      budget.model_turns.total prompt rounds in the task
    MODEL_TURN_SEGMENT_LIMIT    budget.model_turns.per_segment rounds, no continuation left
    AGENT_MODEL_TURN_LIMIT      limits.max_iterations rounds (the agent's own cap)
    AGGREGATE_TOOL_CALL_LIMIT   budget.tool_calls.per_segment calls, no continuation left
    PER_TOOL_CALL_LIMIT         budget.tool_calls.per_tool.<kind or title> calls in the task
    TOOL_CALL_RATE_LIMIT        more than budget.tool_calls.rate.count calls in window_seconds
    FILE_CHANGE_LIMIT           budget.changes.files_total files changed since the task started
    LINE_CHANGE_LIMIT           budget.changes.lines_total lines changed since the task started
    STALL_REPEATED_TOOL_CALLS   the same 1-4 calls (name and arguments) stall.repeated_cycles times in a row
    STALL_TOOL_ONLY_TURNS       stall.tool_only_turns turns in a row that called tools and said nothing
    STALL_CONSECUTIVE_ERRORS    stall.max_consecutive_errors failed calls in a row
    STALL_FAILED_MUTATIONS      stall.failed_mutation_attempts failed edit/delete/move calls in the task
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..config._limits import AutonomyConfig
from ..record._terminals import Stop, Terminal

__all__ = [
    "CONVERGE_PROMPT",
    "NUDGE_PROMPT",
    "Account",
    "Counts",
    "NewSegment",
    "StopCode",
    "convergence_window",
    "repeated_cycle",
]

NUDGE_PROMPT = (
    "You have called tools for several turns without saying anything. Say what you have found, what is "
    "left, and then either finish the task or stop and say why."
)
CONVERGE_PROMPT = (
    "You are close to this task's model-turn budget. Stop broad exploration. Finish the change in flight or "
    "leave it in a safe state, run the targeted check that verifies it, and report truthfully what is done "
    "and what is not."
)
MUTATING_KINDS = frozenset({"edit", "delete", "move"})
_CANONICAL = json.JSONEncoder(sort_keys=True, default=str)  # one encoder, not one a call
CYCLE_LENGTHS = range(1, 5)


class StopCode(StrEnum):
    MODEL_TURN_TOTAL_LIMIT = "MODEL_TURN_TOTAL_LIMIT"
    MODEL_TURN_SEGMENT_LIMIT = "MODEL_TURN_SEGMENT_LIMIT"
    AGENT_MODEL_TURN_LIMIT = "AGENT_MODEL_TURN_LIMIT"
    AGGREGATE_TOOL_CALL_LIMIT = "AGGREGATE_TOOL_CALL_LIMIT"
    PER_TOOL_CALL_LIMIT = "PER_TOOL_CALL_LIMIT"
    TOOL_CALL_RATE_LIMIT = "TOOL_CALL_RATE_LIMIT"
    FILE_CHANGE_LIMIT = "FILE_CHANGE_LIMIT"
    LINE_CHANGE_LIMIT = "LINE_CHANGE_LIMIT"
    STALL_REPEATED_TOOL_CALLS = "STALL_REPEATED_TOOL_CALLS"
    STALL_TOOL_ONLY_TURNS = "STALL_TOOL_ONLY_TURNS"
    STALL_CONSECUTIVE_ERRORS = "STALL_CONSECUTIVE_ERRORS"
    STALL_FAILED_MUTATIONS = "STALL_FAILED_MUTATIONS"


@dataclass(frozen=True)
class NewSegment:
    """A segment ceiling with a continuation left: the kernel starts a new segment and carries on."""

    why: str  # "model_turns" or "tool_calls"
    continuation: int  # this is the n-th continuation
    limit: int  # of this many


@dataclass
class Counts:
    """What the task has used so far (the task_end record's `budget`)."""

    model_turns: int = 0
    segment_turns: int = 0
    continuations: int = 0
    tool_calls: int = 0
    segment_tool_calls: int = 0
    per_tool: dict[str, int] = field(default_factory=dict)
    files: int = 0
    lines: int = 0
    tool_only_turns: int = 0
    consecutive_errors: int = 0
    failed_mutations: int = 0
    failed_tool_calls: int = 0  # every call that ended `failed` in the task (the task record says so)


def convergence_window(total: int) -> int:
    """How many turns before the total ceiling the convergence instruction goes out: at most the final 50,
    scaled down for a small budget (a fifth of it, at least 1)."""
    return min(50, max(1, total // 5))


def repeated_cycle(history: Sequence[Hashable], repeats: int) -> int | None:
    """The length (1-4) of a cycle of calls that ends `history` repeated `repeats` times in a row, if any."""
    for length in CYCLE_LENGTHS:
        span = length * repeats
        if len(history) < span:
            return None
        tail = history[-span:]
        if all(tail[i] == tail[i % length] for i in range(span)):
            return length
    return None


class Account:
    """One task's accounting. `sources` maps a key (`budget.tool_calls.per_segment`, `limits.max_iterations`)
    to where its value came from; every stop names the source of the limit it hit."""

    def __init__(self, autonomy: AutonomyConfig, sources: Mapping[str, str], *, max_iterations: int) -> None:
        self.autonomy = autonomy
        self.sources = sources
        self.max_iterations = max_iterations
        self.counts = Counts()
        self.converge_sent = False
        self._calls: dict[str, dict[str, Any]] = {}  # tool call id -> its merged fields, until it ends
        self._history: list[int] = []  # signatures of ended calls, the last 16
        self._times: deque[float] = deque()  # announcement times inside the rate window

    # --- model turns (before each prompt round) --------------------------------------------------

    def before_turn(self) -> Stop | NewSegment | None:
        """Whether the next prompt round may start; a segment ceiling with a continuation left starts a new
        segment (the kernel records it and goes on)."""
        turns, counts = self.autonomy.budget.model_turns, self.counts
        if counts.model_turns >= turns.total:
            return self._stop("budget", StopCode.MODEL_TURN_TOTAL_LIMIT, counts.model_turns + 1, turns.total,
                              "budget.model_turns.total")  # fmt: skip
        if counts.model_turns >= self.max_iterations:
            return self._stop("budget", StopCode.AGENT_MODEL_TURN_LIMIT, counts.model_turns + 1,
                              self.max_iterations, "limits.max_iterations")  # fmt: skip
        if counts.segment_turns >= turns.per_segment:
            if counts.continuations >= turns.continuations:
                return self._stop("budget", StopCode.MODEL_TURN_SEGMENT_LIMIT, counts.segment_turns + 1,
                                  turns.per_segment, "budget.model_turns.per_segment")  # fmt: skip
            return self._new_segment("model_turns")
        return None

    def turn_started(self) -> None:
        self.counts.model_turns += 1
        self.counts.segment_turns += 1

    def converge_now(self) -> bool:
        """True once, when the next round is inside the window before the total ceiling."""
        total = self.autonomy.budget.model_turns.total
        if self.converge_sent or total - self.counts.model_turns > convergence_window(total):
            return False
        self.converge_sent = True
        return True

    def turn_ended(self, *, tool_calls: int, said: bool) -> Stop | str | None:
        """After a round: a stall stop, the nudge to add to the next prompt, or nothing."""
        stall = self.autonomy.stall
        if tool_calls > 0 and not said:
            self.counts.tool_only_turns += 1
        else:
            self.counts.tool_only_turns = 0
        if self.counts.tool_only_turns >= stall.tool_only_turns:
            return self._stop("stall", StopCode.STALL_TOOL_ONLY_TURNS, self.counts.tool_only_turns,
                              stall.tool_only_turns, "stall.tool_only_turns")  # fmt: skip
        if self.counts.tool_only_turns == stall.tool_only_nudge:
            return NUDGE_PROMPT
        return None

    # --- tool calls (as they are announced and end) ----------------------------------------------

    def tool_call(self, call_id: str, fields: Mapping[str, Any], *, now: float) -> Stop | NewSegment | None:
        """A `tool_call` the agent announced: the budgets it may break."""
        calls, counts = self.autonomy.budget.tool_calls, self.counts
        self._calls[call_id] = dict(fields)
        counts.tool_calls += 1
        counts.segment_tool_calls += 1
        if counts.segment_tool_calls > calls.per_segment:
            if counts.continuations >= self.autonomy.budget.model_turns.continuations:
                return self._stop("budget", StopCode.AGGREGATE_TOOL_CALL_LIMIT, counts.segment_tool_calls,
                                  calls.per_segment, "budget.tool_calls.per_segment")  # fmt: skip
            return self._new_segment("tool_calls")
        for key in _tool_keys(fields, calls.per_tool) if calls.per_tool else ():
            used = counts.per_tool[key] = counts.per_tool.get(key, 0) + 1
            if used > calls.per_tool[key]:
                return self._stop("budget", StopCode.PER_TOOL_CALL_LIMIT, used, calls.per_tool[key],
                                  f"budget.tool_calls.per_tool.{key}", tool=key)  # fmt: skip
        if calls.rate is not None:
            self._times.append(now)
            while self._times and self._times[0] <= now - calls.rate.window_seconds:
                self._times.popleft()
            if len(self._times) > calls.rate.count:
                return self._stop("budget", StopCode.TOOL_CALL_RATE_LIMIT, len(self._times), calls.rate.count,
                                  "budget.tool_calls.rate.count",
                                  window_seconds=calls.rate.window_seconds)  # fmt: skip
        return None

    def tool_update(self, call_id: str, fields: Mapping[str, Any]) -> Stop | None:
        """A `tool_call_update`: fields merge into the call; a final status feeds the stall rules. An update
        of a call never announced is not kept (a flood of fresh ids would otherwise grow without bound)."""
        status = fields.get("status")
        if call_id not in self._calls and status not in ("completed", "failed"):
            return None
        call = self._calls.setdefault(call_id, {})
        call.update({k: v for k, v in fields.items() if v is not None and k != "status"})
        if status not in ("completed", "failed"):
            return None
        del self._calls[call_id]
        stall, counts = self.autonomy.stall, self.counts
        if status == "failed":
            counts.failed_tool_calls += 1
            counts.consecutive_errors += 1
            if call.get("kind") in MUTATING_KINDS:
                counts.failed_mutations += 1
        else:
            counts.consecutive_errors = 0
        if counts.consecutive_errors >= stall.max_consecutive_errors:
            return self._stop("stall", StopCode.STALL_CONSECUTIVE_ERRORS, counts.consecutive_errors,
                              stall.max_consecutive_errors, "stall.max_consecutive_errors")  # fmt: skip
        if counts.failed_mutations >= stall.failed_mutation_attempts:
            return self._stop("stall", StopCode.STALL_FAILED_MUTATIONS, counts.failed_mutations,
                              stall.failed_mutation_attempts, "stall.failed_mutation_attempts")  # fmt: skip
        self._history = [*self._history[-15:], _signature(call)]
        cycle = repeated_cycle(self._history, stall.repeated_cycles)
        if cycle is not None:
            return self._stop("stall", StopCode.STALL_REPEATED_TOOL_CALLS, stall.repeated_cycles,
                              stall.repeated_cycles, "stall.repeated_cycles", cycle_length=cycle,
                              call=call.get("title"))  # fmt: skip
        return None

    # --- changes (from git) ----------------------------------------------------------------------

    def changes(self, files: int, lines: int) -> Stop | None:
        changes, counts = self.autonomy.budget.changes, self.counts
        counts.files, counts.lines = files, lines
        if files > changes.files_total:
            return self._stop("budget", StopCode.FILE_CHANGE_LIMIT, files, changes.files_total,
                              "budget.changes.files_total")  # fmt: skip
        if lines > changes.lines_total:
            return self._stop("budget", StopCode.LINE_CHANGE_LIMIT, lines, changes.lines_total,
                              "budget.changes.lines_total")  # fmt: skip
        return None

    # --- helpers ---------------------------------------------------------------------------------

    def _new_segment(self, why: str) -> NewSegment:
        counts = self.counts
        counts.continuations += 1
        counts.segment_turns = counts.segment_tool_calls = 0
        return NewSegment(why, counts.continuations, self.autonomy.budget.model_turns.continuations)

    def _stop(self, kind: str, code: StopCode, current: int, limit: int, key: str, **facts: Any) -> Stop:
        source = self.sources.get(key) or self.sources.get(key.rsplit(".", 1)[0], "default")
        reason = {"kind": kind, "stop_code": str(code), "current": current, "limit": limit, "key": key,
                  "source": source, **facts}  # fmt: skip
        return Stop(Terminal.MAX_ITERATIONS, reason)


def _tool_keys(fields: Mapping[str, Any], per_tool: Mapping[str, int]) -> list[str]:
    """The per_tool caps a call counts against: its ACP kind, and its title (exactly, ignoring case)."""
    kind = str(fields.get("kind") or "other")
    title = str(fields.get("title") or "").strip().lower()
    return [key for key in per_tool if key.lower() in (kind, title)]


def _signature(call: Mapping[str, Any]) -> int:
    """A call's name and arguments, as merged from its announcement and updates, hashed (arguments may be
    large; the history lives in one process, so Python's 64-bit string hash will do)."""
    parts = (call.get("title"), call.get("kind"), call.get("rawInput"), call.get("locations"))
    return hash(_CANONICAL.encode(parts))
