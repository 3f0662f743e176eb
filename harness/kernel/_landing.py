"""What lands: a task's changes judged at the boundary (git's change set, or the overlay's upper layer) and
applied, kept or set aside; a refused change ends the task `BlockedPolicy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pygit2

from ..policy._change_set import (
    HEAD_NOW,
    ChangeSetUnreadable,
    judge_change_set,
    judge_overlay,
    read_change_set,
    refusal_reason,
    unreadable_reason,
)
from ..record._records import RecordType
from ..record._results import TaskResult
from ..record._terminals import Stop, Terminal
from ..sandbox._overlay import OverlayChange, OverlayUnreadable
from ._parts import Agent, RunParts

__all__ = ["Landing"]


class Landing(RunParts):
    """The seam of a `Run` that judges and lands what a task changed."""

    def _judge_changes(self, result: TaskResult) -> Stop | None:
        """The task's whole change set judged by the policy, as write requests are (`_change_set`): None when
        every change is allowed, else the task ends BlockedPolicy naming the refused paths. A change set that
        cannot be read (no change meter, its start not read, git unreadable) fails closed the same way. With an
        overlay the task's whole change was judged already (`_land_overlay`): only the agent's own commits
        (`git_writable`) remain to judge, so git is read here only then."""
        if self._overlay is not None and not self.config.sandbox.git_writable:
            return None
        meter = self._meter
        try:
            if meter is None or not meter.started:
                raise ChangeSetUnreadable("where the task started from was not read")
            # the agent's own commits are its change where it could make one (`.git` writable, or no sandbox); under
            # the sandbox HEAD moves only by someone else (the boundary's git checks see that)
            commits = self.config.sandbox.mode == "off" or self.config.sandbox.git_writable
            changes = read_change_set(meter.repo, start_head=meter.start_head if commits else HEAD_NOW,
                                      ignored_at_start=meter.ignored_at_start)  # fmt: skip
            top = meter.repo.workdir
            assert top is not None  # read_change_set raised otherwise
            reason = refusal_reason(judge_change_set(changes, self.policy, meter.ignored_at_start, top))
        except (ChangeSetUnreadable, pygit2.GitError, OSError, KeyError, ValueError) as exc:
            reason = unreadable_reason(f"{type(exc).__name__}: {exc}")
        return None if reason is None else self._refuse_changes(result, reason)

    def _land_overlay(self, result: TaskResult) -> Stop | None:
        """With an overlay: the task's changes (its upper layer) judged, then applied to the worktree whole, or,
        one path refused, set aside beside the transcript and the task ends BlockedPolicy (the worktree as it
        was). None when there is no overlay or everything landed; the git reads and the commit follow as ever."""
        if self._overlay is None:
            return None
        reason = self._land(result.id, judged=True)
        return None if reason is None else self._refuse_changes(result, reason)

    async def land_prompt(self, agent: Agent, stop: Stop) -> Stop:
        """A single prompt's changes, with an overlay: judged and applied when it ended EndTurn, set aside
        otherwise or when one path is refused (then the run ends BlockedPolicy). Without one, `stop` as it is.
        On the interactive path (no rules) a person answered each request: what the turn did lands unjudged,
        as it would have without the overlay."""
        if self._overlay is None:
            return stop
        await agent.link.session_closed()  # what it wrote as the session closed is in the upper layer now
        if stop.terminal is not Terminal.END_TURN:
            aside = self._aside_unlanded("prompt")
            return Stop(stop.terminal, {**stop.reason, "set_aside": aside}) if aside else stop
        reason = self._land("prompt", judged=not self.policy.interactive)
        if reason is None:
            return stop
        self._record_refused(reason, task=None)
        return Stop(Terminal.BLOCKED_POLICY, reason)

    def _land(self, name: str, *, judged: bool) -> dict[str, Any] | None:
        """The overlay's changes since the last landing, judged (unless `judged` is False) and applied to the
        worktree whole: None when they landed, else the refusal reason (one path refused: the changes set
        aside under `name`; unreadable; or not all applied, what was is in the tree for the clean-tree check)."""
        overlay = self._overlay
        assert overlay is not None
        try:
            changes = overlay.task_changes()
            reason = refusal_reason(judge_overlay(changes, overlay, self.policy)) if judged and changes else None
        except (OverlayUnreadable, OSError) as exc:
            return unreadable_reason(f"{type(exc).__name__}: {exc}")
        if reason is not None:
            reason["set_aside"] = self._set_aside(changes, name)
            return reason
        try:
            overlay.apply(changes)
        except OSError as exc:
            reason = unreadable_reason(f"{type(exc).__name__}: {exc}")
            reason["detail"] = f"the changes could not all be applied to the worktree: {exc}"
            return reason
        return None

    def _keep_unlanded(self, result: TaskResult) -> None:
        """A task that ended otherwise than Completed lands nothing: with an overlay, what it changed is set
        aside for a person (the reason says where) and the worktree stays as it was."""
        aside = self._aside_unlanded(result.id) if self._overlay is not None else None
        if aside and isinstance(result.reason, dict):
            result.reason = {**result.reason, "set_aside": aside}

    def _aside_unlanded(self, name: str) -> str | None:
        assert self._overlay is not None
        try:
            return self._set_aside(self._overlay.task_changes(), name)
        except OverlayUnreadable:
            return None

    def _set_aside(self, changes: list[OverlayChange], task_id: str) -> str | None:
        """Where a task's unlanded changes were copied: `<transcript>.aside/<task>/` (None if they could not be)."""
        assert self._overlay is not None
        if not changes:
            return None
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)
        destination = Path(f"{self.transcript_path}.aside") / name
        try:
            self._overlay.set_aside(changes, destination)
        except OSError as exc:
            self.transcript.record(RecordType.TEARDOWN_ERROR, step="set_aside", error=str(exc))
            return None
        return str(destination)

    def _refuse_changes(self, result: TaskResult, reason: dict[str, Any]) -> Stop:
        """The task ends BlockedPolicy for its changes (its `task_end` said how its session ended): one `policy`
        record per refused path named, and the task's result says it. The changes stay in the tree."""
        self._record_refused(reason, task=result.id)
        result.terminal, result.reason = Terminal.BLOCKED_POLICY, reason
        return Stop(Terminal.BLOCKED_POLICY, reason)

    def _record_refused(self, reason: dict[str, Any], *, task: str | None) -> None:
        """One `policy` record per refused change the reason names (of `task`, when a task's)."""
        whose = {"task": task} if task else {}
        for entry in reason["paths"]:
            self.transcript.record(RecordType.POLICY, source="change", decision="refuse",
                                   rule_ids=entry.get("rule_ids", []), reason={"kind": "change", "why": entry["why"]},
                                   outcome="refused", path=entry["path"], **whose)  # fmt: skip
