"""One task's budgets, watched while the agent works: the client hands it every update of the running
turn (in wire order, never awaiting), the run asks it at each turn boundary. When a cap trips mid-turn
it resolves `interrupt`; the agent link then cancels the turn (session/cancel, the grace period) and the run
ends with the stop, or starts a new segment.

Changes are measured from git at the tool-call boundaries after which something may have changed, and at the
end of every turn, whatever the agent announced (an agent that changes files without a word is measured too).
A boundary is the next tool call announced after a call of a kind that may write (anything but read, search,
think and fetch), or the next permission, write or command the kernel is asked for after such a call ended, or
after the kernel itself ran a command or wrote what may break a change cap (its writes since the last measure,
bounded from above: a file each, and the old file's size plus the new content's length in lines, over what is
left): the request after a write that broke a cap is the one refused (issue 30), and writes far below the caps
cost no measure. Measuring there rather than as the call ends stops the same work (the kernel refuses the next
effect either way) and counts what was written in between; a one-call turn is measured once, not twice. A
measure the worktree's inotify queue answers (no event since the last) costs one read of it; one that reads
git and finds it as it was, about 0.1 ms (see _changes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from acp.schema import AgentMessageChunk, ToolCallProgress, ToolCallStart

from ..record._records import RecordType
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript
from ._budget import Account, NewSegment
from ._changes import ChangeMeter
from ._questions import Choice, Option, choose

__all__ = ["TaskWatch"]

READ_ONLY_KINDS = frozenset({"read", "search", "think", "fetch"})


class TaskWatch:
    def __init__(self, account: Account, meter: ChangeMeter | None, transcript: Transcript) -> None:
        self.account = account
        self.meter = meter
        self.transcript = transcript
        # Done when a cap trips in the running turn: a future, not an Event, so that the agent link waits for
        # it beside the prompt without a task of its own per turn.
        self.interrupt: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tripped: Stop | NewSegment | None = None
        self.ledger: list[Choice] = []  # questions the kernel answered in this task
        self.notes: list[tuple[str, str]] = []  # (name, text) the next prompt carries: a nudge
        self._restated = 0  # ledger entries the agent has been told of
        self.said = False  # the agent sent message text in this turn
        self._dirty = False  # something may have changed since the last measure
        self._ended = False  # ... and a call that may have written has ended since
        self._acted_files = self._acted_lines = 0  # ... the kernel's own writes since, at most (a bound)
        self._acted_unbounded = False  # ... the kernel ran a command since: what it changed has no bound
        self._unmeasured: str | None = None  # why git could not measure (said once)

    # --- from the client (sync, wire order) ------------------------------------------------------

    def begin_turn(self) -> None:
        self.said = False
        if isinstance(self.tripped, NewSegment):
            self.tripped = None  # handled: the run started the new segment
        if self.tripped is None and self.interrupt.done():  # a stop that came between turns keeps its interrupt
            self.interrupt = asyncio.get_running_loop().create_future()

    def on_update(self, update: Any) -> None:
        if isinstance(update, ToolCallStart):
            if self._dirty:  # a call that may have written came before this one: what it changed counts first
                self._trip(self.measure())
            fields = {"title": update.title, "kind": update.kind, "rawInput": update.raw_input,
                      "locations": _locations(update.locations)}  # fmt: skip
            if (update.kind or "other") not in READ_ONLY_KINDS:
                self._dirty = True
            self._trip(self.account.tool_call(update.tool_call_id, fields, now=time.monotonic()))
            if update.status in ("completed", "failed"):  # announced already ended
                self._trip(self.account.tool_update(update.tool_call_id, {"status": update.status}))
                self._ended = self._dirty
        elif isinstance(update, ToolCallProgress):
            fields = {"title": update.title, "kind": update.kind, "rawInput": update.raw_input,
                      "locations": _locations(update.locations), "status": update.status}  # fmt: skip
            self._trip(self.account.tool_update(update.tool_call_id, fields))
            if update.status in ("completed", "failed"):
                self._ended = self._dirty
        elif isinstance(update, AgentMessageChunk):
            self.said = True

    def decide(self, choice: Choice) -> None:
        """A question the kernel answered: on the ledger, and re-stated in the next prompt."""
        self.ledger.append(choice)

    def answer(self, via: str, question: str, options: list[Option]) -> Choice | None:
        """Answer an agent's question by the auto-answer heuristic (`_questions.choose`); None when the run must
        wait for a person instead (answering is off, or nothing to choose from): the turn is then stopped."""
        if not self.account.autonomy.questions.auto_answer or not options:
            why = "autonomy.questions.auto_answer is off" if options else "the question offers no options"
            self.unanswerable(via, question, why)
            return None
        choice = choose(question, options)
        self.transcript.record(RecordType.QUESTION, via=via, question=question, outcome="answered",
                               choice=choice.option.id, confidence=choice.confidence, rationale=choice.rationale,
                               low_confidence=choice.low_confidence)  # fmt: skip
        self.decide(choice)
        return choice

    def unanswerable(self, via: str, question: str, why: str) -> None:
        """A question no choice can answer: the run ends BlockedAwaitingInput with kind `question`."""
        self.transcript.record(RecordType.QUESTION, via=via, question=question, outcome="unanswered", why=why)
        reason = {"kind": "question", "via": via, "question": question, "why": why}
        self._trip(Stop(Terminal.BLOCKED_AWAITING_INPUT, reason))

    def take_decisions(self) -> list[Choice]:
        new, self._restated = self.ledger[self._restated :], len(self.ledger)
        return new

    def before_effect(self) -> None:
        """The kernel is asked to serve a request: a boundary, if a call that may write has ended or the kernel
        acted for the agent since the last measure."""
        if self._ended or self._acted_may_trip():
            still_open = not self._ended  # the kernel acted inside a call that may go on writing: measure it again
            self._trip(self.measure())
            self._dirty = still_open

    def kernel_acted(self, lines: int | None = None) -> None:
        """The kernel wrote a file that may charge at most `lines` lines, or (None) started a command."""
        self._dirty = True
        if lines is None:
            self._acted_unbounded = True
        else:
            self._acted_files += 1
            self._acted_lines += lines

    def _acted_may_trip(self) -> bool:
        """What the kernel did since the last measure may break a change cap."""
        if self._acted_unbounded:
            return True
        if not self._acted_files:
            return False
        caps, counts = self.account.autonomy.budget.changes, self.account.counts
        files, lines = counts.files + self._acted_files, counts.lines + self._acted_lines
        return files > caps.files_total or lines > caps.lines_total

    # --- from the run ----------------------------------------------------------------------------

    def turn_ended(self, *, tool_calls: int) -> Stop | None:
        """After a turn that ended on its own: its last change measure, then the stall rules on turns; the
        stop, if one tripped now or as the turn ended. A nudge goes into `notes` for the next prompt."""
        self._trip(self.measure())
        if not isinstance(self.tripped, Stop):
            stalled = self.account.turn_ended(tool_calls=tool_calls, said=self.said)
            if isinstance(stalled, str):
                self.notes.append(("nudge", stalled))
            else:
                self._trip(stalled)
        return self.tripped if isinstance(self.tripped, Stop) else None

    def measure(self) -> Stop | None:
        if self.meter is None:
            return None
        self._dirty = self._ended = self._acted_unbounded = False
        self._acted_files = self._acted_lines = 0
        try:
            changes = self.meter.measure()
        except Exception as exc:  # a broken repository: say so once, the other budgets still hold
            if self._unmeasured is None:
                self._unmeasured = f"{type(exc).__name__}: {exc}"
                self.transcript.record(RecordType.BUDGET, event="changes_unmeasured", error=self._unmeasured)
            return None
        return self.account.changes(changes.files, changes.lines)

    def _trip(self, outcome: Stop | NewSegment | None) -> None:
        """The first stop wins; a stop replaces a new segment not yet started, never the other way round."""
        if outcome is None or isinstance(self.tripped, Stop):
            return
        if isinstance(outcome, NewSegment) and self.tripped is not None:
            return
        self.tripped = outcome
        if isinstance(outcome, Stop):
            self.transcript.record(RecordType.BUDGET, event="tripped", reason=dict(outcome.reason))
        else:
            self.transcript.record(RecordType.BUDGET, event="segment_ceiling", why=outcome.why,
                                   continuation=outcome.continuation, limit=outcome.limit)  # fmt: skip
        if not self.interrupt.done():
            self.interrupt.set_result(None)


def _locations(locations: Any) -> list[Mapping[str, Any]] | None:
    if not locations:
        return None
    return [{"path": loc.path, "line": loc.line} for loc in locations]
