"""The loops the server runs: one kernel per active workspace, drained in the background.

One workspace is never driven by two loops: inside a server the live table says so, and across servers on
one machine a lock file in the workspace's `.git/info` does (held for the whole run; read-only to agents).
A loop's end is written to the session history; a server stopping cancels its loops (each ends `Cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from .._config import Config, parse_config
from .._exceptions import ConfigError
from .._kernel import Kernel
from .._paths import overlaps
from .._preconditions import check_git, find_git_dir, read_git_state, repository_dirs
from .._recovery import ActiveRuns
from .._worktree_lock import WorktreeBusy, lock_worktree
from ._modules import BindingError, agent_section
from ._pending import Pending
from ._state import State, StateError, Workspace

__all__ = ["Loop", "Loops"]


@dataclass
class Loop:
    run_id: str
    workspace_id: str
    module: str
    binding: dict[str, Any]  # the binding it started with: another one may not replace it while it runs
    kernel: Kernel
    lock: FileLock
    task: asyncio.Task[None] | None = None
    ended: dict[str, Any] = field(default_factory=dict)
    pending: Pending | None = None  # an interactive session's requests waiting for a person
    prompt: str | None = None  # a single-prompt session's prompt

    @property
    def live(self) -> bool:
        return self.task is not None and not self.task.done()


class Loops:
    def __init__(self, state: State) -> None:
        self.state = state
        self.loops: dict[str, Loop] = {}  # the latest loop of each workspace this server ran
        self.starting: set[str] = set()  # workspaces whose loop is being set up

    def live(self, workspace_id: str) -> Loop | None:
        loop = self.loops.get(workspace_id)
        return loop if loop is not None and loop.live else None

    def transcripts(self, workspace: Workspace) -> Path:
        return self.state.directory / "workspaces" / workspace.id / "transcripts"

    def recover(self) -> None:
        """At start: loops that were active when the server died end `Failed/restarted`, and what their
        agents left running is ended (the kernel's own recovery, from each workspace's transcripts)."""
        for workspace_id in self.state.restarted():
            with contextlib.suppress(StateError, OSError):
                ActiveRuns(self.transcripts(self.state.workspace(workspace_id))).recover()

    async def activate(self, workspace: Workspace) -> Loop:
        """Every precondition checked, each failure a typed StateError (409); then the loop starts."""
        live = self.live(workspace.id)
        if live is not None and live.prompt is None:
            return live  # already active: activating again changes nothing
        if live is not None:
            raise StateError("session_live", f"session {live.run_id} (a single prompt) is live: it must end "
                             "first", session=live.run_id)  # fmt: skip
        if not self.state.autonomy_enabled:
            raise StateError("autonomy_disabled", "the server's autonomy switch is off: PUT /api/autonomy first")
        agent = _bound_agent(workspace)
        if not agent["supports_permission_requests"]:
            module = (workspace.binding or {}).get("module")
            raise StateError("agent_permission_support", f"the bound module {module!r} does not declare "
                             "permission requests: autonomy needs them")  # fmt: skip
        if not workspace.policy.get("rules"):
            raise StateError("policy_non_empty", "the workspace's policy has no rule: autonomy needs at least one")
        if workspace.queue is None:
            raise StateError("no_host_connection", "the workspace has no host connection (queue)")
        return await self._start(workspace, agent)

    async def start_prompt(self, workspace: Workspace, text: str, countdown_s: float) -> Loop:
        """A single-prompt session (autonomy not needed): with no policy rule, the interactive path, whose
        permission requests wait in `loop.pending` for a person (or the allow-once countdown)."""
        live = self.live(workspace.id)
        if live is not None:
            raise StateError("session_live", f"session {live.run_id} is live", session=live.run_id)
        agent = _bound_agent(workspace)
        pending = None
        if not workspace.policy.get("rules"):
            sandbox_off = (workspace.sandbox or {}).get("mode") == "off"
            pending = Pending(countdown_s, lambda: self.state.autonomy_enabled and sandbox_off)
        return await self._start(workspace, agent, prompt=text, pending=pending)

    async def _start(self, workspace: Workspace, agent: dict[str, Any], *, prompt: str | None = None,
                     pending: Pending | None = None) -> Loop:  # fmt: skip
        assert workspace.binding is not None
        if workspace.id in self.starting:  # a second request while the first reads git: one loop per workspace
            raise StateError("session_live", f"a session of workspace {workspace.id} is starting")
        self.starting.add(workspace.id)
        try:  # git is read (and the lock taken) off the event loop: a slow disk must not stall every client
            lock = await asyncio.to_thread(_lock_worktree, Path(workspace.path))
            try:  # until the loop's task owns the lock, any failure gives it back
                config = await asyncio.to_thread(self._config, workspace, agent)
                # while git was read, the binding or the switch may have changed: start what is asked now or nothing
                if self.state.workspace(workspace.id).binding != workspace.binding:
                    raise StateError("binding_changed", "the binding changed while the session was starting")
                if prompt is None and not self.state.autonomy_enabled:
                    raise StateError("autonomy_disabled", "the server's autonomy switch went off while the loop "
                                     "was starting")  # fmt: skip
                run_id = uuid.uuid4().hex[:12]
                kernel = Kernel(
                    config, interactive_handler=pending.handler if pending is not None else None, worktree_locked=True
                )  # this server holds the lock for the loop
                loop = Loop(run_id, workspace.id, workspace.binding["module"], dict(workspace.binding), kernel,
                            lock, pending=pending, prompt=prompt)  # fmt: skip
                self.state.begin_run(run_id, workspace.id, loop.module, str(kernel.transcript_path))
                self.state.set_active(workspace.id, prompt is None)
            except BaseException:
                lock.release()
                raise
        finally:
            self.starting.discard(workspace.id)
        loop.task = asyncio.create_task(self._drive(loop), name=f"loop-{workspace.id}")
        self.loops[workspace.id] = loop
        return loop

    def _config(self, workspace: Workspace, agent: dict[str, Any]) -> Config:
        """The run config, with what this agent may not see hidden (StateError when it is not valid)."""
        data = {"workspace": workspace.path, "agent": agent, "policy": workspace.policy,
                "queue": workspace.queue or {}, "transcripts": str(self.transcripts(workspace))}  # fmt: skip
        own = (workspace.sandbox or {}).get("hide", [])  # the workspace's own, and what the server hides
        data["sandbox"] = {**(workspace.sandbox or {}), "hide": [*own, *map(str, self._hidden_from(workspace))]}
        try:
            return parse_config(data, base_dir=self.state.directory)
        except ConfigError as exc:
            raise StateError("config", str(exc), key=exc.key) from None

    def _hidden_from(self, workspace: Workspace) -> list[Path]:
        """What this workspace's agent may not read: the server's state directory (its database, token and
        every workspace's transcripts, also those registered later) and the other workspaces: their worktrees
        and git directories. A worktree nested in this one, or holding it, and a repository this one shares
        (linked worktrees), are left to the policy: hiding them would hide this one."""
        mine = [os.path.realpath(workspace.path), *_git_dirs(workspace.path)]
        hidden = [self.state.directory]
        for other in self.state.workspaces():
            if other.id == workspace.id:
                continue
            for theirs in (os.path.realpath(other.path), *_git_dirs(other.path)):
                if not any(overlaps(theirs, needed) for needed in mine):
                    hidden.append(Path(theirs))
        return hidden

    async def _drive(self, loop: Loop) -> None:
        try:
            result = await loop.kernel.run(prompt=loop.prompt)
            loop.ended = {"terminal": result.terminal.value, "reason": result.reason}
            self.state.end_run(loop.run_id, result.terminal.value, result.reason, [t.to_json() for t in result.tasks])
        except Exception as exc:  # the kernel's own fault: the history still says how the loop ended
            loop.ended = {"terminal": "Failed", "reason": {"kind": "kernel_error", "error": repr(exc)}}
            self.state.end_run(loop.run_id, "Failed", loop.ended["reason"], [])
        finally:
            try:
                self.state.set_active(loop.workspace_id, False)
            finally:
                loop.lock.release()

    async def stop_all(self) -> None:
        """The server is stopping: every loop is cancelled (`Cancelled`) and awaited."""
        live = [loop for loop in self.loops.values() if loop.live]
        for loop in live:
            loop.kernel.cancel()
        await asyncio.gather(*(loop.task for loop in live if loop.task is not None), return_exceptions=True)


def _lock_worktree(path: Path) -> FileLock:
    """The git checks, then the worktree's lock (StateError when either refuses)."""
    git_dir = find_git_dir(path)
    stop = check_git(read_git_state(path, git_dir)) if git_dir is not None else None
    if git_dir is None or stop is not None:
        reason = dict(stop.reason) if stop is not None else {"check": "git_worktree"}
        raise StateError("precondition", f"a precondition failed: {reason}", reason=reason)
    try:
        return lock_worktree(git_dir)
    except WorktreeBusy as exc:
        raise StateError("workspace_busy", str(exc), lock=exc.lock_file) from None


def _git_dirs(worktree: str) -> list[str]:
    git_dir = find_git_dir(Path(worktree))
    return [os.path.realpath(d) for d in repository_dirs(git_dir)] if git_dir is not None else []


def _bound_agent(workspace: Workspace) -> dict[str, Any]:
    """The bound module's `agent:` section, or the typed reason there is none."""
    if workspace.binding is None:
        raise StateError("not_bound", "no agent is bound: PUT .../agent/binding first")
    try:
        return agent_section(workspace.binding)
    except BindingError as exc:
        raise StateError("binding_unusable", str(exc), key=exc.key) from None
