"""One run of the kernel: what it opened, and the loop over tasks and turns.

`Kernel.run()` makes a `Run` once its transcript is open; the run's parts are made in order, each
registering how it is closed with the run's `Teardown`:

    Run(...)                 policy, host calls, git dir              (never optional)
    run.prepare()            preconditions → sandbox → egress → client → agent link → host tools
                             → `Agent` (client, link, host tools), or the Stop that prevented it
    run.drain(agent, ...)    per task a session, per turn a prompt: `_turns` decides what follows
    run.teardown.close()     agent, terminals, host tools, provider, egress, sandbox dir: in that order
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2
from pygit2.enums import FileMode

from .._flag import Flag
from ..budget._budget import CONVERGE_PROMPT, Account, NewSegment, StopCode
from ..budget._changes import ChangeMeter
from ..budget._questions import restate
from ..budget._watch import TaskWatch
from ..config._config import Config
from ..git._commit import commit_task
from ..git._preconditions import GitState, blocked, check_git, find_git_dir, read_git_state, repository_dirs
from ..git._repository_events import RepositoryEvents
from ..git._upstreams import Upstreams
from ..git._worktree_events import WorktreeEvents
from ..git._worktree_lock import WorktreeBusy, lock_worktree
from ..host._hostcalls import HostCalls
from ..link._agent_link import AgentLink, Interrupted
from ..link._client import InteractiveHandler, KernelClient
from ..link._transport import agent_environment
from ..policy._change_set import (
    HEAD_NOW,
    ChangeSetUnreadable,
    change_refusal,
    judge_change_set,
    judge_overlay,
    read_change_set,
    refusal_reason,
    unreadable_reason,
)
from ..policy._policy import Policy
from ..queues import QueueProvider, Task
from ..record._records import RecordType
from ..record._recovery import TOKEN_VARIABLE, ActiveRuns
from ..record._results import TaskResult
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript
from ..sandbox._egress import Egress
from ..sandbox._exec import ExecHost
from ..sandbox._overlay import OverlayChange, OverlayUnreadable, WorktreeOverlay
from ..sandbox._sandbox import (
    PROXY_PORT,
    Sandbox,
    SandboxError,
    find_bwrap,
    plan_sandbox,
    runs_base,
    sandbox_unavailable,
)
from ._completed import CompletedTasks
from ._turns import SEGMENT_PROMPT, PromptKind, TurnOutcome, after_turn, before_turn

if TYPE_CHECKING:
    from ..host._mcp_host import HostToolServer

__all__ = ["Agent", "Controls", "Run", "RunState", "Teardown"]

#: Paths a `teardown_error` of the run's directory names (`left_count` says how many there were).
_LEFT_SHOWN = 20
#: Config fields that do not change which queue a run drains (its remembered completions stay).
_NOT_THE_QUEUE = {"source", "role_source", "autonomy", "autonomy_sources", "autonomy_warnings"}


class RunState(StrEnum):
    NEW = "new"  # made, not yet run
    RUNNING = "running"
    ENDED = "ended"  # its terminal is the transcript's last line


@dataclass
class Controls:
    """What reaches a run from outside (another task, a signal handler, another thread): a user's
    cancel, and steering for the next turn boundary. Made with the Kernel, before any event loop."""

    cancel_requested: bool = False
    steering: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _event: Flag | None = None
    _transcript: Transcript | None = None

    def bind(self, transcript: Transcript) -> Flag:
        """The running loop's cancel flag (set already if a cancel came first)."""
        self._loop, self._event, self._transcript = asyncio.get_running_loop(), Flag(), transcript
        if self.cancel_requested:
            self._event.set()
        return self._event

    def cancel(self) -> None:
        self.cancel_requested = True
        if self._event is not None:
            self._in_loop(self._event.set)

    def steer(self, text: str) -> None:
        self._in_loop(self._queue, text)

    def take_steering(self) -> list[str]:
        notes, self.steering = self.steering, []
        return notes

    def _queue(self, text: str) -> None:
        self.steering.append(text)
        if self._transcript is not None and not self._transcript.closed:
            self._transcript.record(RecordType.STEER_QUEUED, text=text, pending=len(self.steering))

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or _running_loop() is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)


class Teardown:
    """How to close what a run opened, in a fixed order whatever was opened: stop serving the agent,
    then release its terminals, ... Each step runs whatever the one before did; a failure is recorded."""

    ORDER = ("agent", "terminals", "host_tools", "provider", "egress", "sandbox", "changes", "repository_events",
             "completed", "worktree_lock")  # fmt: skip

    def __init__(self, transcript: Transcript) -> None:
        self.transcript = transcript
        self._steps: dict[str, Callable[[], Awaitable[None]]] = {}

    def add(self, name: str, close: Callable[[], Awaitable[None]]) -> None:
        assert name in self.ORDER, name
        self._steps[name] = close

    async def close(self) -> None:
        steps, self._steps = self._steps, {}
        for name in self.ORDER:
            if name not in steps:
                continue
            try:
                await steps[name]()
            except Exception as exc:
                if not self.transcript.closed:
                    self.transcript.record(RecordType.TEARDOWN_ERROR, step=name, error=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Agent:
    """The started agent: the client that serves its requests, its link, and the host tools' MCP
    server (None when the agent cannot use an HTTP MCP server)."""

    client: KernelClient
    link: AgentLink
    host_tools: HostToolServer | None


class Run:
    """One `Kernel.run()`: made once its transcript is open; see the module docstring."""

    def __init__(
        self,
        config: Config,
        provider: QueueProvider,
        *,
        transcript: Transcript,
        transcript_path: Path,
        active: ActiveRuns,
        marker: Path,
        token: str,
        controls: Controls,
        interactive_handler: InteractiveHandler | None,
        on_task_boundary: Callable[[int], Awaitable[None]] | None,
        remembers: bool,
        worktree_locked: bool = False,
        completions: Path | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.transcript = transcript
        self.transcript_path = transcript_path
        self.active = active
        self.marker = marker
        self.token = token  # carried by every process the run starts (see _recovery)
        self.controls = controls
        self.cancel_event = controls.bind(transcript)
        self.interactive_handler = interactive_handler
        self.on_task_boundary = on_task_boundary
        self.remembers = remembers
        self.completions = completions  # the caller's own record of completed tasks (the server's)
        self.worktree_locked = worktree_locked  # the caller holds the worktree's lock
        self.state = RunState.NEW
        self.position: dict[str, Any] = {}  # mode, or the current task and iteration
        self.teardown = Teardown(transcript)
        transcript.on_fault = self._stop_for_the_disk  # its disk filled: the run ends Failed, kind disk_full
        self.teardown.add("provider", provider.aclose)
        self.git_dir = find_git_dir(config.workspace)  # None: not a git worktree (a precondition says so)
        self._repo: pygit2.Repository | None = None  # opened at the first git state read
        self._upstreams: Upstreams | None = None  # with it
        self._meter: ChangeMeter | None = None  # opened at the first git read
        self._overlay: WorktreeOverlay | None = None  # the sandbox's copy-on-write worktree, when it has one
        self._repository_events: RepositoryEvents | None = None  # opened at the first read while closing
        self._repository_unwatched = False  # its watches could not be set up: no read while closing
        # The git read consults what no event queue watches: a submodule's git dir (the index holds a gitlink), or
        # the worktree beyond the workspace. None: not looked at yet.
        self._beyond_events: bool | None = None
        self._confined: dict[str, str] = {}  # PATH as given: PATH as the agent gets it
        self.last_counts: dict[str, Any] = {}  # the last session's budget counts (its task_end record)
        self.policy = Policy(
            config.policy.rules,
            config.workspace,
            protected_globs=config.policy.protected_paths,
            protected_files=self._protected_files(),
            masked_reads=config.sandbox.mode != "off",  # commands run where read denies are masked
        )
        self.host = HostCalls(config.queue, transcript, self._sleep_or_cancel)
        self.agent: Agent | None = None  # once prepare() started it

    # --- what the facade reads -----------------------------------------------------------------

    @property
    def rule_ids(self) -> list[str]:
        return list(self.agent.client.rule_ids) if self.agent is not None else []

    def refused(self) -> Stop | None:
        """A refusal stops the run wherever it happened: in a turn, or in a call that came late. So does a full
        disk under the transcript (after a refusal: the verdict on the agent comes first)."""
        if self.agent is not None and self.agent.client.refusals:
            return Stop(Terminal.BLOCKED_POLICY, self.agent.client.refusals[0])
        fault = self.transcript.fault
        return Stop(Terminal.FAILED, fault) if fault is not None else None

    def _stop_for_the_disk(self) -> None:
        """The transcript met a full disk: the running turn is stopped now, not when the agent ends it (a budget's
        interrupt; `refused()` then names the fault). Called wherever the transcript was written: any thread."""
        watch = self.agent.client.watch if self.agent is not None else None
        if watch is not None:
            watch.interrupt.get_loop().call_soon_threadsafe(_resolve, watch.interrupt)

    # --- preparing: preconditions, sandbox, agent ----------------------------------------------

    async def prepare(self, *, single_prompt: bool) -> Agent | Stop:
        """Everything before the first task: the started agent, or the Stop that prevented it."""
        busy = self._lock_worktree()
        if busy is not None:
            return busy
        if not single_prompt:
            stop = await self._activate()
            if stop is not None:
                return stop
        planned = self._plan_sandbox()
        if isinstance(planned, Stop):
            return planned
        sandbox, egress, tools_socket = None, None, None
        if planned is not None:
            sandbox, egress, tools_socket = await self._open_egress(*planned)
            self._overlay = sandbox.overlay
            if self._meter is not None:
                self._meter.overlay = self._overlay
        client = KernelClient(
            policy=self.policy,
            transcript=self.transcript,
            exec_host=ExecHost(
                self._confine({**agent_environment(), "GIT_TERMINAL_PROMPT": "0", TOKEN_VARIABLE: self.token}),
                sandbox=sandbox,
            ),
            interactive_handler=self.interactive_handler,
        )
        client.overlay = self._overlay
        self.teardown.add("terminals", client.exec_host.release_all)
        link = AgentLink(
            self.config.agent,
            self.config.limits,
            cwd=self.config.source.parent if self.config.source else Path.cwd(),
            transcript=self.transcript,
            client=client,
            token=self.token,
            on_spawn=lambda pid: self.active.agent_started(self.marker, pid),
            confine=self._confine,
            sandbox=sandbox,
        )
        self.teardown.add("agent", link.close)
        self.agent = Agent(client, link, None)  # its refusals count from now on, even if the start fails
        stop = await link.start()
        if stop is not None:
            return stop
        self.agent = Agent(client, link, await self._start_host_tools(link, egress, tools_socket))
        return self.agent

    def _lock_worktree(self) -> Stop | None:
        """One loop per worktree: taken before anything else, given back when the run's teardown ends."""
        if self.worktree_locked or self.git_dir is None:  # no git dir: the git precondition refuses the run
            return None
        try:
            lock = lock_worktree(self.git_dir)
        except WorktreeBusy as exc:
            return blocked("workspace_free", str(exc), lock=exc.lock_file)

        async def release() -> None:
            lock.release()

        self.teardown.add("worktree_lock", release)
        return None

    async def _activate(self) -> Stop | None:
        if not self.config.agent.supports_permission_requests:
            return blocked(
                "agent_permission_support",
                "the bound agent does not declare that it asks before acting "
                "(set agent.supports_permission_requests: true for an agent that sends permission requests)",
            )
        if self.policy.interactive:
            return blocked("policy_non_empty", "the policy has no rules: an empty policy is the interactive path")
        return await self.host.authorize(self.provider) or self._check_git(left_by_task=None)

    def _protected_files(self) -> list[Path]:
        """The run's own files: its config, its role, its transcript (and their directory, when the
        transcripts are kept inside the worktree)."""
        files = [p for p in (self.config.source, self.config.role_source, self.transcript_path) if p]
        transcripts = self.transcript_path.resolve().parent
        if transcripts.is_relative_to(self.config.workspace.resolve()):
            files.append(transcripts)
        return files

    def _confine(self, env: dict[str, str]) -> dict[str, str]:
        """No directory on PATH the agent could plant a program in (`.venv/bin/git` under `write **`)."""
        if "PATH" in env:
            if env["PATH"] not in self._confined:  # the same PATH twice a run (agent, terminals): listed once
                self._confined[env["PATH"]] = self.policy.search_path(env["PATH"])
            kept = self._confined[env["PATH"]]
            if kept != env["PATH"]:
                dropped = [e for e in env["PATH"].split(os.pathsep) if e not in kept.split(os.pathsep)]
                self.transcript.record(RecordType.SEARCH_PATH_CONFINED, dropped=dropped)
            env["PATH"] = kept
        return env

    def _plan_sandbox(self) -> tuple[Sandbox, Path] | Stop | None:
        """The OS sandbox for this run and its private directory, or a BlockedPrecondition saying why it
        cannot start: never a silent run without one (None: the config turned it off)."""
        settings = self.config.sandbox
        if settings.mode == "off":
            self.transcript.record(RecordType.SANDBOX, mode="off")
            return None
        bwrap = find_bwrap(settings.bwrap)
        cause = sandbox_unavailable(bwrap)
        if cause is None and bwrap is not None:
            try:
                run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=runs_base()))
            except (SandboxError, OSError) as exc:
                return blocked("sandbox_available", f"no private directory for the run: {exc}", mode=settings.mode)
            self.teardown.add("sandbox", lambda: self._remove_run_dir(run_dir))
            git_dirs = repository_dirs(self.git_dir) if self.git_dir else []
            try:
                sandbox = plan_sandbox(settings, bwrap=bwrap, worktree=self.config.workspace,
                                       rules=self.config.policy.rules,
                                       protected_globs=(".git", ".git/**", *self.config.policy.protected_paths),
                                       protected_files=[*self._protected_files(), self.transcript_path.parent],
                                       git_dirs=git_dirs, run_dir=run_dir, agent_env=self.config.agent.env)  # fmt: skip
                return sandbox, run_dir
            except (SandboxError, OSError) as exc:
                cause = f"the sandbox could not be planned: {exc}"
        return blocked("sandbox_available", f"{cause}; to run without the OS sandbox set sandbox: {{mode: off}}",
                       mode=settings.mode)  # fmt: skip

    async def _remove_run_dir(self, run_dir: Path) -> None:
        """The run's private directory, gone with whatever the agent left in it; what could not be removed is
        named in the transcript (a `teardown_error` of step `sandbox`), never left in silence."""
        if self._overlay is not None:
            self._overlay.close()
        left, error = await asyncio.to_thread(remove_tree, run_dir)
        if left and not self.transcript.closed:
            self.transcript.record(RecordType.TEARDOWN_ERROR, step="sandbox", left=left[:_LEFT_SHOWN],
                                   left_count=len(left),
                                   error=f"{len(left)} path(s) in {run_dir} could not be removed: {error}")  # fmt: skip

    async def _open_egress(self, sandbox: Sandbox, run_dir: Path) -> tuple[Sandbox, Egress, socket.socket]:
        """The sandbox's ways out, all through the kernel: the filtering proxy (when a network rule allows a
        host) and the host-tools port, bound now so the agent's sandbox can relay it before the server runs."""
        egress = Egress(run_dir, self.policy.judge_host, self.transcript.record)
        self.teardown.add("egress", egress.close)
        await egress.start()
        tools_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.teardown.add("host_tools", _closer(tools_socket))  # until the server takes it over
        tools_socket.bind(("127.0.0.1", 0))
        port = tools_socket.getsockname()[1]
        proxy = any(r.kind == "network" and r.decision == "allow" for r in self.policy.rules)
        sandbox = dataclasses.replace(sandbox, proxy=(PROXY_PORT, egress.proxy_socket) if proxy else None,
                                      tools=(port, egress.tools_socket))  # fmt: skip
        self.transcript.record(RecordType.SANDBOX, **sandbox.describe())
        return sandbox, egress, tools_socket

    async def _start_host_tools(
        self, link: AgentLink, egress: Egress | None, tools_socket: socket.socket | None
    ) -> HostToolServer | None:
        """Serve the host's tools over MCP when the agent can use an HTTP MCP server."""
        if not link.supports_http_mcp:
            self.transcript.record(
                RecordType.HOST_TOOLS, served=False, why="the agent does not advertise mcpCapabilities.http"
            )
            return None
        from ..host._host_tools import HostTools  # the MCP server costs ~0.5 s to import: only when it is used
        from ..host._mcp_host import HostToolServer

        tools = HostTools(self.provider, workspace=self.config.workspace, git_dir=self.git_dir,
                          base_branch=self.config.queue.base_branch, host_calls=self.host.call)  # fmt: skip
        server = HostToolServer(tools, self.transcript)
        self.teardown.add("host_tools", server.stop)
        await server.start(tools_socket)
        if egress is not None:
            egress.tools_port = server.port
        self.transcript.record(RecordType.HOST_TOOLS, served=True, port=server.port,
                               allowlist=self.config.role.tools or "all")  # fmt: skip
        return server

    # --- git at the boundaries -----------------------------------------------------------------

    def _check_git(
        self, *, left_by_task: str | None, state: GitState | None = None, while_closing: bool = False
    ) -> Stop | None:
        state = state or self._git_state()
        if state is None:
            return blocked("git_worktree", f"{self.config.workspace} is not a git worktree")
        stop = check_git(state, left_by_task=left_by_task)
        read = {"git_read": "while_closing"} if while_closing else {}
        self.transcript.record(RecordType.PRECONDITIONS, ok=stop is None, failed=dict(stop.reason) if stop else None,
                               **read)  # fmt: skip
        return stop

    def _git_state(self) -> GitState | None:
        if self.git_dir is None:
            return None
        meter = self._change_meter()
        if meter is not None:
            meter.before_boundary_read()
        state = self._read_git()
        if meter is not None:  # the next task's changes are counted from this read
            meter.boundary(clean=not state.changes, ignored=state.ignored, head=state.head)
        return state

    def _read_git(self) -> GitState:
        assert self.git_dir is not None
        if self._repo is None:
            self._repo = pygit2.Repository(str(self.git_dir))
            self._upstreams = Upstreams(self._repo, repository_dirs(self.git_dir))
        return read_git_state(self.config.workspace, self.git_dir, self._repo, self._upstreams)

    def _read_while_closing(self, agent: Agent) -> GitState | None:
        """The boundary's git read, taken while the agent closes the last session (it is otherwise idle then,
        and so is the agent while the kernel reads after the answer); None where it could not be confirmed.

        Only where the agent can change nothing the read depends on but the worktree's files: the OS sandbox
        on, with its private HOME and TMP and `.git` read-only (the agent cannot commit, switch branches or
        start a merge, nor write a configuration, exclude or hard-linked file outside), the workspace the
        worktree's root (its events cover all git reads) and no submodule (whose own git dir the read
        consults). Both event queues are emptied first: `_boundary_state` keeps the read only if neither had
        an event until the close was answered, so what the agent wrote as it closed the session is read again,
        after the answer. What raises no event is not: a write through a shared memory mapping or by Linux AIO
        made in that window is seen by the next full read (the next boundary's), as one made just after the
        answer always was."""
        sandbox, env = self.config.sandbox, self.config.agent.env
        private = sandbox.home is None and sandbox.tmp is None and not {"HOME", "XDG_CONFIG_HOME"} & set(env)
        if not agent.link.closing or sandbox.mode == "off" or sandbox.git_writable or not private:
            return None
        # with an overlay the worktree changes only when the kernel applies a task, after the close: its writes
        # are events, so `_boundary_state` reads git again whenever something was applied
        if self.git_dir is None:
            return None
        meter, repository = self._change_meter(), self._repository_watch()
        if meter is None or meter.events is None or meter.events.blind or repository is None or repository.blind:
            return None
        moved = repository.changed()  # also by someone else than the agent (a person's commit)
        if self._beyond_events and not moved:  # as last time: the read after the answer is the boundary's
            return None
        meter.before_boundary_read()
        try:
            state = self._read_git()
            assert self._repo is not None
            if moved or self._beyond_events is None:  # the index is read afresh by the status above
                workdir = self._repo.workdir
                self._beyond_events = (
                    workdir is None
                    or Path(workdir).resolve() != self.config.workspace.resolve()
                    or any(entry.mode == FileMode.COMMIT for entry in self._repo.index)
                )
        except (pygit2.GitError, OSError):  # judged after the answer, by the read then
            return None
        return None if self._beyond_events else state

    def _boundary_state(self, early: GitState | None) -> tuple[GitState | None, bool]:
        """The state the boundary judges: the read taken while closing when nothing has changed since (True),
        else a read now. Any worktree event counts, one beneath an ignored directory too."""
        meter, repository = self._meter, self._repository_events
        quiet = (early is not None and meter is not None and meter.events is not None and repository is not None
                 and not meter.events.changed(strict=True))  # fmt: skip
        if quiet and repository is not None and repository.changed():
            quiet, self._beyond_events = False, None  # the index may hold a gitlink now: looked at again next time
        if quiet:
            assert early is not None and meter is not None
            meter.boundary(clean=not early.changes, ignored=early.ignored, head=early.head)
            return early, True
        return self._git_state(), False

    def _repository_watch(self) -> RepositoryEvents | None:
        """The inotify watches on the repository's own directories (opened once; None where they cannot be)."""
        if self._repository_events is None and not self._repository_unwatched and self.git_dir is not None:
            try:
                self._repository_events = RepositoryEvents(repository_dirs(self.git_dir))
            except OSError:
                self._repository_unwatched = True
                return None
            self.teardown.add("repository_events", _closer(self._repository_events))
        return self._repository_events

    def _change_meter(self) -> ChangeMeter | None:
        """The run's change meter (opened at the first git read, its inotify watches with it); None when
        git cannot be read here (the git precondition says why)."""
        if self._meter is None and self.git_dir is not None:
            try:
                events: WorktreeEvents | None = WorktreeEvents(self.config.workspace)
            except OSError:  # no inotify here (or no descriptor left): every measure reads git
                events = None
            try:
                self._meter = ChangeMeter(self.config.workspace, self.git_dir, events)
                self._meter.overlay = self._overlay
            except (pygit2.GitError, OSError):
                if events is not None:
                    events.close()
                return None
            self.teardown.add("changes", _closer(self._meter))  # its inotify descriptor
        return self._meter

    # --- the queue -----------------------------------------------------------------------------

    def _completed_store(self) -> CompletedTasks | None:
        if self.completions is not None:
            return CompletedTasks(self.completions, forget_when_drained=False)
        if not self.remembers:
            return None
        # The queue: this config, as written (an edited config is a fresh record), and what it drains.
        written = hashlib.sha256(self.config.model_dump_json(exclude=_NOT_THE_QUEUE).encode()).hexdigest()
        queue = f"{self.config.role.trigger}:{self.config.source or 'inline'}:{written}"
        return CompletedTasks.beside(self.transcript_path.parent, workspace=self.config.workspace, git_dir=self.git_dir,
                              queue=queue)  # fmt: skip

    async def drain(self, agent: Agent, tasks: list[TaskResult], *, only: str | None) -> Stop:
        """Run the queue's tasks in order until it is empty (`only`: just that task)."""
        completed: set[str] = set()
        store = self._completed_store()
        earlier = store.load() if store is not None else {}
        if store is not None:

            async def close_store() -> None:
                store.close()

            self.teardown.add("completed", close_store)
        skipped: set[str] = set()
        last: TaskResult | None = None
        closing_read: GitState | None = None  # the read taken while the last task's session closed
        while True:
            early = closing_read or (self._read_while_closing(agent) if last is not None else None)
            closing_read = None
            # The last session/close answered before anything is judged at the boundary: a call the agent made
            # meanwhile was refused, and what it wrote is in the git read (read again if the early one missed it).
            await agent.link.session_closed()
            if last is not None and self.on_task_boundary is not None:
                await self.on_task_boundary(len(completed))
            if self.controls.cancel_requested:
                return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "task_boundary"})
            refused = self.refused()
            if refused is not None:
                return refused
            listing = await self.host.call("list_tasks", self.provider.list_tasks)
            if isinstance(listing, Stop):
                return listing
            if len(skipped) < len(earlier):  # tasks completed by an earlier run: each said once per run
                listed = [t for t in listing if t.id not in completed and (only is None or t.id == only)]
                for done in [t for t in listed if t.id in earlier and t.id not in skipped]:
                    skipped.add(done.id)
                    reason = {"kind": "completed_earlier", **earlier[done.id]}
                    tasks.append(TaskResult(done.id, done.title, Terminal.COMPLETED, reason))
                    self.transcript.record(
                        RecordType.TASK_SKIPPED, task={"id": done.id, "title": done.title}, reason=reason
                    )
                    if only is not None:
                        return Stop(Terminal.COMPLETED, reason)
            # the next task: the first one listed (a long queue is not copied at every boundary)
            task = next((t for t in listing if t.id not in completed and t.id not in skipped
                         and (only is None or t.id == only)), None)  # fmt: skip
            state, while_closing = self._boundary_state(early) if last is not None else (None, False)
            if last is not None:
                last.left_changes = list(state.changes) if state else []
            if task is None:
                if only is not None:
                    return blocked("task_assigned", f"task {only!r} is not in the queue", task=only)
                # never Idle with work left behind: the last task's changes stop the run as they stop a next task
                if last is not None and state is not None and check_git(state, left_by_task=last.id) is not None:
                    stop = self._check_git(left_by_task=last.id, state=state, while_closing=while_closing)
                    assert stop is not None
                    return stop
                if store is not None and store.forget_when_drained:
                    store.clear()  # the queue is drained: the next run of it starts afresh
                idle = {"kind": "queue_empty", "completed": len(completed)}
                return Stop(Terminal.IDLE, {**idle, "skipped_completed_earlier": len(skipped)} if skipped else idle)
            if last is not None:
                stop = await self.host.authorize(self.provider) or self._check_git(
                    left_by_task=last.id, state=state, while_closing=while_closing
                )
                if stop is not None:
                    return stop
            result = await self._run_task(agent, task)
            tasks.append(result)
            if result.terminal is not Terminal.COMPLETED:
                self._keep_unlanded(result)
                return Stop(result.terminal, result.reason)
            # the boundary's git read, taken while the agent closes the session (kept at the boundary below only if
            # nothing changed since); what the agent wrote as it closed the session is judged too
            closing_read = self._read_while_closing(agent)
            await agent.link.session_closed()
            refusal = self._land_overlay(result) or self._judge_changes(result)  # what lands is what the rules allow
            if refusal is not None:
                return refusal
            if self.config.commit is not None:  # the kernel owns git: commit (and push) what the task did
                # what the policy allows of the task's changes; what was ignored when it started is not one
                start_ignored = self._meter.ignored_at_start if self._meter is not None else frozenset()
                committed = await commit_task(
                    self.config.workspace, self.config.commit, task.id, task.title,
                    policy=self.policy, ignored=start_ignored, git_dir=self.git_dir,
                )  # fmt: skip
                self.transcript.record(RecordType.COMMIT, task=task.id, **committed)
                if committed.get("refused"):  # a refused change written after the boundary judged: none of it
                    late = change_refusal(committed["refused"], committed["refused_total"])
                    return self._refuse_changes(result, late)
            completed.add(task.id)  # skipped from now on, even if the host cannot mark it done
            if store is not None:
                try:
                    store.add(task.id, self.transcript_path)  # and by the next run of this queue
                except OSError as exc:
                    self.transcript.record(RecordType.COMPLETION_NOT_KEPT, task=task.id, error=exc.strerror or str(exc))
            outcome = await self.host.call("mark_done", self.provider.mark_done, task)
            if isinstance(outcome, Stop):
                result.mark_done_error = dict(outcome.reason)
            if only is not None:  # a single-task run ends with its task
                await agent.link.session_closed()
                state = self._git_state()
                result.left_changes = list(state.changes) if state else []
                # never Completed with work left behind: the changes stop it as they would stop a next task
                return self._check_git(left_by_task=task.id, state=state) or Stop(Terminal.COMPLETED, result.reason)
            last = result

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

    async def _run_task(self, agent: Agent, task: Task) -> TaskResult:
        self.position = {"task": task.id, "iteration": 0}
        self.transcript.record(RecordType.TASK_START, task={"id": task.id, "title": task.title})
        started = time.monotonic()
        prompt = _task_prompt(self.config.role.prompt, task)
        host_stops: dict[str, Stop] = {}
        watch = self._new_watch()
        if agent.host_tools is None:
            agent.client.begin_task()
            stop, iterations = await self.session(agent, prompt, task=task, watch=watch)
            used: list[str] = []
        else:
            binding = agent.host_tools.tools.bind(task, self.config.role.tools)
            binding.ask = lambda question, options: watch.answer("ask_question", question, options)
            agent.client.begin_task(binding.allowed)
            with agent.host_tools.serving(binding) as entry:
                stop, iterations = await self.session(agent, prompt, task=task, mcp_servers=[entry], watch=watch)
                await agent.link.session_closed()  # its tools are served, and their use counted, until then
            used, host_stops = binding.used, binding.host_stops
        stop = self._check_termination(stop, used, host_stops=host_stops)
        result = TaskResult(
            id=task.id,
            title=task.title,
            terminal=stop.terminal,
            reason=dict(stop.reason),  # built for this task, not shared
            rule_ids=list(agent.client.rule_ids),
            iterations=iterations,
            tokens=self._tokens(agent),
            seconds=time.monotonic() - started,
            failed_tool_calls=self.last_counts.get("failed_tool_calls", 0),
        )
        # the budget counts go on the record only: a run keeps one TaskResult per task in memory
        self.transcript.record(RecordType.TASK_END, **result.to_json(), budget=self.last_counts)
        return result

    def _check_termination(self, stop: Stop, used: list[str], *, host_stops: dict[str, Stop]) -> Stop:
        """After Completed, the role's termination must be met, or the run waits for a person; when the
        tool it needs could not reach the host (rate limit, outage), that is why, and its terminal ends it."""
        termination = self.config.role.termination
        if stop.terminal is not Terminal.COMPLETED or termination is None:
            return stop
        needed = {"ProposalOpened": "open_proposal", "ReviewSubmitted": "submit_review"}[termination]
        if needed in used:
            return stop
        if needed in host_stops:
            return host_stops[needed]
        reason = {
            "kind": "termination",
            "stop_reason": "termination",
            "termination": termination,
            "detail": f"the task completed without a successful {needed}",
            "completed": dict(stop.reason),
        }
        return Stop(Terminal.BLOCKED_AWAITING_INPUT, reason)

    # --- a session, turn by turn ---------------------------------------------------------------

    async def session(
        self,
        agent: Agent,
        first_prompt: str,
        *,
        task: Task | None,
        mcp_servers: list[dict[str, Any]] | None = None,
        watch: TaskWatch | None = None,
    ) -> tuple[Stop, int]:
        """Run one session to its end: the stop, and the number of prompt rounds."""
        meta = {"loopHarness": {"taskId": task.id, "title": task.title}} if task else {}
        session_id = await agent.link.new_session(self.config.workspace, meta, mcp_servers or [])
        if isinstance(session_id, Stop):
            return session_id, 0
        watch = watch or self._new_watch()
        agent.client.watch = watch
        text, kind = first_prompt, str(PromptKind.TASK)
        standing = iterations = 0
        try:
            while True:
                budget = watch.tripped if isinstance(watch.tripped, Stop) else watch.account.before_turn()
                step = before_turn(budget=budget, cancel_requested=self.controls.cancel_requested)
                if isinstance(step, Stop):
                    return step, iterations
                if isinstance(step, NewSegment):
                    self.transcript.record(RecordType.BUDGET, event="new_segment", why=step.why,
                                           continuation=step.continuation, limit=step.limit)  # fmt: skip
                iterations += 1
                converge = watch.account.converge_now()  # before the round is counted: the rounds left
                watch.account.turn_started()
                counts = self._counts(watch)
                self.position = {"task": task.id if task else None, "iteration": iterations, **counts}
                text, kind = self._with_notes(watch, text, kind, converge=converge)
                turn = agent.client.begin_turn(session_id)
                self.transcript.record(RecordType.TURN, iteration=iterations, prompt_kind=kind, budget=counts)
                answer = await agent.link.prompt(session_id, text, cancel=self.cancel_event, interrupt=watch.interrupt)
                if isinstance(answer, Stop):
                    return answer, iterations
                refused = self.refused()
                if isinstance(answer, Interrupted):  # a budget cancelled the turn
                    if refused is not None:
                        return refused, iterations
                    stop = _interrupted(watch.tripped, answer)
                    if stop is not None:
                        return stop, iterations
                    text, kind = SEGMENT_PROMPT, str(PromptKind.CONTINUE_NEW_SEGMENT)
                    continue
                if refused is None:  # a refusal says more than a budget
                    stop = watch.turn_ended(tool_calls=turn.tool_calls)
                    if stop is not None:
                        return stop, iterations
                outcome = TurnOutcome(answer, turn.tool_calls, turn.client_calls, refused.reason if refused else None)
                next_ = after_turn(outcome, single_prompt=task is None, standing=standing,
                                   standing_answers=self.config.limits.standing_answers)  # fmt: skip
                if isinstance(next_, Stop):
                    return next_, iterations
                text, kind, standing = next_.text, str(next_.kind), next_.standing
        finally:
            self.last_counts = self._counts(watch)
            agent.client.watch = None
            await agent.client.exec_host.release_session(session_id)
            await agent.link.end_session(session_id)

    def _new_watch(self) -> TaskWatch:
        """A fresh account for a session, its change meter started on the tree as it is now."""
        account = Account(self.config.autonomy, self.config.autonomy_sources,
                          max_iterations=self.config.limits.max_iterations)  # fmt: skip
        meter = self._change_meter()
        if meter is not None:
            try:
                meter.start()
            except (pygit2.GitError, OSError) as exc:
                self.transcript.record(RecordType.BUDGET, event="changes_unmeasured", error=str(exc))
                return TaskWatch(account, None, self.transcript)
        return TaskWatch(account, meter, self.transcript)

    def _with_notes(self, watch: TaskWatch, text: str, kind: str, *, converge: bool) -> tuple[str, str]:
        """The prompt with the operator's steering, the kernel's nudges and the decisions it took."""
        text, kind = self._with_steering(text, kind)
        if converge:
            watch.notes.append(("convergence", CONVERGE_PROMPT))
        notes, watch.notes = watch.notes, []
        for name, note in notes:
            self.transcript.record(RecordType.BUDGET, event=name, **self._counts(watch))
            text, kind = f"{text}\n\n{note}", f"{kind}+{name}"
        decisions = watch.take_decisions()
        if decisions:
            text, kind = f"{text}\n\n{restate(decisions)}", f"{kind}+decisions"
        return text, kind

    @staticmethod
    def _counts(watch: TaskWatch) -> dict[str, Any]:
        """What the progress line shows: turn cur/max · total cur/max · cont cur/max, and tool calls."""
        counts, budget = watch.account.counts, watch.account.autonomy.budget
        return {
            "turn": [counts.segment_turns, budget.model_turns.per_segment],
            "total": [counts.model_turns, budget.model_turns.total],
            "cont": [counts.continuations, budget.model_turns.continuations],
            "tool_calls": [counts.segment_tool_calls, budget.tool_calls.per_segment],
            "files": counts.files,
            "lines": counts.lines,
            "failed_tool_calls": counts.failed_tool_calls,
        }

    def _tokens(self, agent: Agent) -> dict[str, Any] | None:
        """The task's token usage: the prompt answer's, else the last `usage_update` (Codex reports only
        that: context tokens `used` of `size`)."""
        if agent.link.last_usage:
            return agent.link.last_usage
        usage = agent.client.context_usage
        return dict(usage) if usage else None

    def _with_steering(self, text: str, kind: str) -> tuple[str, str]:
        notes = self.controls.take_steering()
        if not notes:
            return text, kind
        self.transcript.record(RecordType.STEER_DELIVERED, count=len(notes))
        steering = "\n".join(f"- {n}" for n in notes)
        return f"{text}\n\nSteering from the operator (advisory):\n{steering}", f"{kind}+steering"

    async def _sleep_or_cancel(self, seconds: float) -> bool:
        """Sleep; True if a user cancel arrived meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.cancel_event.wait(), seconds)
        return self.cancel_event.is_set()


def _interrupted(tripped: Stop | NewSegment | None, answer: Interrupted) -> Stop | None:
    """The stop a budget interrupt ends the task with; None: a new segment goes on."""
    detail = {"agent_stop_reason": answer.agent_stop_reason, "killed": answer.killed}
    if isinstance(tripped, Stop):
        return Stop(tripped.terminal, {**tripped.reason, **detail})
    assert tripped is not None
    if answer.killed:  # it ignored session/cancel: there is no session left to continue
        reason = {"kind": "budget", "stop_code": str(StopCode.AGGREGATE_TOOL_CALL_LIMIT),
                  "key": "budget.tool_calls.per_segment",
                  "detail": "the agent did not stop for session/cancel at a segment ceiling", **detail}  # fmt: skip
        return Stop(Terminal.MAX_ITERATIONS, reason)
    return None


def _closer(thing: socket.socket | ChangeMeter | RepositoryEvents) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        thing.close()  # a socket: a no-op once the host-tools server has taken it over and closed it

    return close


def remove_tree(root: Path) -> tuple[list[str], str | None]:
    """Remove `root` and all in it, what its owner made unremovable too (a directory without write or search
    permission: chmod 500, 000): the directory that holds a refused entry, and a directory that could not be
    opened, get owner rwx back and the entry is removed again, once. Returns what is still there (and the first
    error). The agent has ended by now (its teardown step comes first): nothing swaps a path for a symlink
    between the check and the chmod, and no chmod follows one."""
    left: dict[str, str] = {}  # path: why (a directory is tried again after what is in it: each named once)
    tried: set[str] = set()

    def again(function: Callable[..., Any], path: str, exc: Any) -> None:
        error = exc[1] if isinstance(exc, tuple) else exc  # onerror's exc_info, or onexc's exception
        if isinstance(error, FileNotFoundError):
            return
        try:
            if path in tried:
                raise error
            tried.add(path)
            if path != str(root):  # never the directory `root` is in
                _grant(os.path.dirname(path))
            if _grant(path):  # a directory that could not be opened, or emptied
                _rmtree(path, again)
            else:
                os.unlink(path)
        except FileNotFoundError:  # gone meanwhile (with its parent)
            return
        except OSError as failed:
            left.setdefault(path, f"{type(failed).__name__}: {failed}")

    if os.path.lexists(root):
        try:
            _rmtree(str(root), again)
        except RecursionError:  # deeper than Python's stack: say so rather than end the teardown
            left.setdefault(str(root), "RecursionError: nested too deep to remove")
    return list(left), next(iter(left.values()), None)


def _grant(path: str) -> bool:
    """Owner read, write and search on `path` if it is a directory (never through a symlink); True if it is one."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        return False
    os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXU)
    return True


def _rmtree(path: str, handler: Callable[[Callable[..., Any], str, Any], None]) -> None:
    if sys.version_info >= (3, 12):  # onerror is deprecated there
        shutil.rmtree(path, onexc=handler)
    else:
        shutil.rmtree(path, onerror=handler)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _task_prompt(prefix: str, task: Task) -> str:
    parts = [prefix.strip()] if prefix.strip() else []
    parts.append(f"Task {task.id}: {task.title}".rstrip(": "))
    if task.body:
        parts.append(task.body)
    return "\n\n".join(parts)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
