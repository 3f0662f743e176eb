"""The loops the server runs: one kernel per active workspace, drained in the background.

One workspace is never driven by two loops: inside a server the live table says so, and across servers on
one machine a lock file in the workspace's `.git/info` does (held for the whole run; read-only to agents).
A loop's end is written to the session history; a server stopping cancels its loops (each ends `Cancelled`).

An activation may keep draining: past `Idle` the loop waits, lists the queue every `every_s` seconds (longer
after a failed listing, doubling up to `_MAX_BACKOFF_S`, and never before a rate limit's reset) and starts a
new session when a task it has not completed is there; it ends at deactivation or at any other terminal.
Completed task ids are kept per workspace and queue identity (`completed/<identity>.jsonl` under the
workspace's state directory), past `Idle`, restarts, edits and other workspaces' registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from .._paths import overlaps
from ..config._config import Config
from ..config._exceptions import RateLimited
from ..git._preconditions import check_git, find_git_dir, read_git_state, repository_dirs
from ..git._worktree_lock import WorktreeBusy, lock_worktree
from ..kernel._completed import CompletedTasks
from ..kernel._kernel import Kernel
from ..queues import make_provider
from ..record._recovery import ActiveRuns
from ._modules import BindingError, agent_section
from ._pending import Pending
from ._state import State, StateError, Workspace
from ._workspace_config import WorkspaceConfigError, queue_identity, run_config

__all__ = ["Loop", "Loops"]

_MAX_BACKOFF_S = 3600.0  # the longest wait between listings after failures
_PLACEHOLDER_AGENT = {"command": ["true"]}  # validates a config before any agent is bound


@dataclass
class Loop:
    run_id: str  # the current (or last) session
    workspace_id: str
    module: str
    binding: dict[str, Any]  # the binding it started with: another one may not replace it while it runs
    kernel: Kernel
    lock: FileLock
    version: int = 1  # the workspace config's version it runs
    task: asyncio.Task[None] | None = None
    ended: dict[str, Any] = field(default_factory=dict)
    pending: Pending | None = None  # an interactive session's requests waiting for a person
    prompt: str | None = None  # a single-prompt session's prompt
    keep_draining_s: float | None = None  # past Idle, list the queue again every so often
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[str, Any] | None = None  # between sessions: next check, checks made, the last failure
    stopped_by: str = "deactivated"  # why `stop` was called

    @property
    def live(self) -> bool:
        return self.task is not None and not self.task.done()

    def stop(self, why: str = "deactivated") -> None:
        """Deactivate: the session in progress is cancelled (`Cancelled`) and no other starts. `why` is the
        reason a loop stopped between sessions records (deactivated, user_cancel, autonomy_disabled,
        server_stopping)."""
        if not self.stopping.is_set():
            self.stopped_by = why
        self.stopping.set()
        self.kernel.cancel()


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
        """At start: loops that were active when the server died end `Failed/restarted` (with the tasks they
        completed), and what their agents left running is ended (the kernel's own recovery)."""
        for workspace_id in self.state.restarted(self.completed_by):
            with contextlib.suppress(StateError, OSError):
                ActiveRuns(self.transcripts(self.state.workspace(workspace_id))).recover()

    # --- the workspace's config and completed tasks ---------------------------------------------

    def validate(self, path: str, sections: dict[str, Any]) -> Config:
        """The sections as a run config with a stand-in agent: a StateError (422) naming the key."""
        try:
            return run_config(path, sections, agent=_PLACEHOLDER_AGENT, transcripts=self.state.directory / "x",
                              hide=[], base_dir=self.state.directory)  # fmt: skip
        except WorkspaceConfigError as exc:
            raise StateError("invalid", str(exc), status=422, key=exc.key) from None

    def completions(self, workspace: Workspace, config: Config) -> Path:
        return self._completed_dir(workspace.id) / f"{queue_identity(config)}.jsonl"

    def _completed_dir(self, workspace_id: str) -> Path:
        return self.state.directory / "workspaces" / workspace_id / "completed"

    def completed_listing(self, workspace: Workspace) -> dict[str, Any]:
        """The ids completed on the workspace's current queue, each with its session's transcript and time."""
        path = self.completions(workspace, self.validate(workspace.path, workspace.config))
        done = CompletedTasks(path).load()
        return {"queue": path.stem, "completed": [{"id": k, **v} for k, v in done.items()]}

    def completed_by(self, workspace_id: str, transcript: str) -> list[dict[str, Any]]:
        """The tasks a session completed, from the record the kernel wrote before acting on each."""
        tasks = []
        for path in sorted(self._completed_dir(workspace_id).glob("*.jsonl")):
            for task_id, entry in CompletedTasks(path).load().items():
                if entry.get("transcript") == transcript:
                    reason = {"kind": "end_turn", "from": "completion_record"}  # the details died with the server
                    tasks.append({"id": task_id, "terminal": "Completed", "reason": reason, "at": entry.get("at")})
        return tasks

    def forget_completed(self, workspace: Workspace) -> int:
        """Every queue's completed ids of this workspace forgotten; how many there were."""
        directory = self._completed_dir(workspace.id)
        count = sum(len(CompletedTasks(p).load()) for p in directory.glob("*.jsonl"))
        shutil.rmtree(directory, ignore_errors=True)
        return count

    def forget(self, workspace_id: str) -> None:
        """A deleted workspace: its loop entry and completion records go (transcripts stay)."""
        self.loops.pop(workspace_id, None)
        shutil.rmtree(self._completed_dir(workspace_id), ignore_errors=True)

    async def activate(self, workspace: Workspace, keep_draining_s: float | None = None) -> Loop:
        """Every precondition checked, each failure a typed StateError (409); then the loop starts."""
        live = self.live(workspace.id)
        if live is not None and live.prompt is None and live.stopping.is_set():
            raise StateError("session_ending", f"session {live.run_id} is being deactivated: activate again once "
                             "it has ended", session=live.run_id)  # fmt: skip
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
        return await self._start(workspace, agent, keep_draining_s=keep_draining_s)

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
                     pending: Pending | None = None, keep_draining_s: float | None = None) -> Loop:  # fmt: skip
        assert workspace.binding is not None
        if workspace.id in self.starting:  # a second request while the first reads git: one loop per workspace
            raise StateError("session_live", f"a session of workspace {workspace.id} is starting")
        self.starting.add(workspace.id)
        try:  # git is read (and the lock taken) off the event loop: a slow disk must not stall every client
            lock = await asyncio.to_thread(_lock_worktree, Path(workspace.path))
            try:  # until the loop's task owns the lock, any failure gives it back
                config = await asyncio.to_thread(self._config, workspace, agent)
                # while git was read, the binding, config or switch may have changed: start what is asked now or nothing
                now = self.state.workspace(workspace.id)
                if now.binding != workspace.binding:
                    raise StateError("binding_changed", "the binding changed while the session was starting")
                if now.version != workspace.version:
                    raise StateError("config_changed", "the config was edited while the session was starting")
                if prompt is None and not self.state.autonomy_enabled:
                    raise StateError("autonomy_disabled", "the server's autonomy switch went off while the loop "
                                     "was starting")  # fmt: skip
                kernel = self._kernel(workspace, config, pending)
                loop = Loop(uuid.uuid4().hex[:12], workspace.id, workspace.binding["module"], dict(workspace.binding),
                            kernel, lock, workspace.version, pending=pending, prompt=prompt,
                            keep_draining_s=keep_draining_s)  # fmt: skip
                self._begin(loop)
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
        hide = [str(p) for p in self._hidden_from(workspace)]  # beside the workspace's own
        try:
            return run_config(workspace.path, workspace.config, agent=agent, transcripts=self.transcripts(workspace),
                              hide=hide, base_dir=self.state.directory)  # fmt: skip
        except WorkspaceConfigError as exc:
            raise StateError("config", str(exc), key=exc.key) from None

    def _kernel(self, workspace: Workspace, config: Config, pending: Pending | None) -> Kernel:
        return Kernel(config, interactive_handler=pending.handler if pending is not None else None,
                      worktree_locked=True,  # this server holds the lock for the loop
                      completions=self.completions(workspace, config))  # fmt: skip

    def _begin(self, loop: Loop) -> None:
        options = {"keep_draining": {"every_s": loop.keep_draining_s}} if loop.keep_draining_s is not None else None
        self.state.begin_run(loop.run_id, loop.workspace_id, loop.module, str(loop.kernel.transcript_path),
                             version=loop.version, options=options)  # fmt: skip

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
            while True:
                await self._session(loop)
                if loop.keep_draining_s is None or loop.ended.get("terminal") != "Idle" or loop.stopping.is_set():
                    return
                if not await self._wait_for_work(loop):  # deactivated, cancelled or stopping while it waited
                    self._ended_waiting(loop, "Cancelled", {"kind": loop.stopped_by, "waiting": True})
                    return
                try:
                    await self._next_session(loop)
                except StateError as exc:  # the switch went off, the binding went, the config no longer parses
                    self._ended_waiting(loop, "Failed", {"kind": exc.kind, "error": str(exc), "waiting": True})
                    return
        finally:
            try:
                loop.waiting = None
                self.state.set_active(loop.workspace_id, False)
            finally:
                loop.lock.release()

    def _ended_waiting(self, loop: Loop, terminal: str, reason: dict[str, Any]) -> None:
        """A loop kept draining that ends between sessions: the history says so (a row with no transcript)."""
        loop.ended = {"terminal": terminal, "reason": reason}
        self.state.add_ended_run(loop.workspace_id, loop.module, terminal, reason, version=loop.version,
                                 options={"keep_draining": {"every_s": loop.keep_draining_s}})  # fmt: skip

    async def _session(self, loop: Loop) -> None:
        try:
            result = await loop.kernel.run(prompt=loop.prompt)
            loop.ended = {"terminal": result.terminal.value, "reason": result.reason}
            self.state.end_run(loop.run_id, result.terminal.value, result.reason, [t.to_json() for t in result.tasks])
        except Exception as exc:  # the kernel's own fault: the history still says how the loop ended
            loop.ended = {"terminal": "Failed", "reason": {"kind": "kernel_error", "error": repr(exc)}}
            self.state.end_run(loop.run_id, "Failed", loop.ended["reason"], [])

    async def _wait_for_work(self, loop: Loop) -> bool:
        """Past Idle: list the queue every `keep_draining_s` until a task not completed is there (True) or the
        loop is deactivated (False). A failed listing waits longer (doubling, capped), a rate limit until its
        reset; either is shown in the status, and neither ends the loop."""
        assert loop.keep_draining_s is not None
        config = loop.kernel.config
        provider = make_provider(config.queue, trigger=config.role.trigger)
        completions = CompletedTasks(self.completions(self.state.workspace(loop.workspace_id), config))
        failures, not_before, checks = 0, 0.0, 0
        failure: dict[str, Any] | None = None  # the last listing's error, until one succeeds
        try:
            while True:
                backoff = loop.keep_draining_s * 2 ** min(failures, 32)  # capped: weeks of failures stay a number
                delay = min(backoff, max(_MAX_BACKOFF_S, loop.keep_draining_s))
                delay = max(delay, not_before - time.time())
                loop.waiting = {"next_check": time.time() + delay, "every_s": loop.keep_draining_s, "checks": checks,
                                "failure": failure}  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(loop.stopping.wait(), delay)
                    return False
                checks += 1
                try:
                    tasks = await provider.list_tasks()
                except Exception as exc:  # a rate limit, an outage, a refusal: tried again later
                    failures += 1
                    not_before = (exc.reset_at if isinstance(exc, RateLimited) else None) or 0.0
                    failure = {"error": f"{type(exc).__name__}: {exc}", "failures": failures, "at": time.time()}
                    continue
                failures, not_before, failure = 0, 0.0, None
                done = completions.load()
                if any(task.id not in done for task in tasks):
                    return True
        finally:
            with contextlib.suppress(Exception):
                await provider.aclose()

    async def _next_session(self, loop: Loop) -> None:
        """A new session of an activation kept draining: the same checks as an activation, the lock kept."""
        workspace = self.state.workspace(loop.workspace_id)
        if not self.state.autonomy_enabled:
            raise StateError("autonomy_disabled", "the server's autonomy switch is off")
        if workspace.binding != loop.binding:
            raise StateError("binding_changed", "the binding changed while the loop waited")
        config = await asyncio.to_thread(self._config, workspace, _bound_agent(workspace))
        loop.kernel = self._kernel(workspace, config, None)
        loop.run_id, loop.version, loop.waiting = uuid.uuid4().hex[:12], workspace.version, None
        if loop.stopping.is_set():
            raise StateError("deactivated", "deactivated before the session started")
        self._begin(loop)

    async def stop_all(self) -> None:
        """The server is stopping: every loop is cancelled (`Cancelled`) and awaited."""
        live = [loop for loop in self.loops.values() if loop.live]
        for loop in live:
            loop.stop("server_stopping")
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
