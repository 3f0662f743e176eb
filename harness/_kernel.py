"""The loop kernel: one agent, one workspace, a queue of tasks, one terminal per run.

    run
     ├─ activate: preconditions (static, host, git)    → BlockedPrecondition
     ├─ start the agent (AgentLink), initialize         → Failed
     └─ per task (a session each), per turn (a session/prompt):
          the stop reason + what the turn did → the next prompt, or the task's terminal

The link maps agent faults, deadlines and cancels to stops; `HostCalls` maps
host trouble (retries, back-off) to Blocked* stops. Every message and decision
lands in the transcript, and the terminal is its last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import secrets
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pygit2

from ._agent_link import VERSION, AgentLink
from ._client import InteractiveHandler, KernelClient
from ._commit import commit_task
from ._completed import CompletedTasks
from ._config import Config
from ._egress import Egress
from ._exceptions import ConfigError
from ._exec import ExecHost
from ._hostcalls import HostCalls
from ._policy import Policy
from ._preconditions import GitState, blocked, check_git, find_git_dir, read_git_state
from ._recovery import TOKEN_VARIABLE, ActiveRuns
from ._results import RunResult, TaskResult
from ._sandbox import PROXY_PORT, Sandbox, SandboxError, find_bwrap, plan_sandbox, sandbox_unavailable
from ._terminals import Stop, Terminal
from ._transcript import Transcript
from ._transport import agent_environment
from ._turns import PromptKind, TurnOutcome, after_turn, before_turn
from .queues import QueueProvider, Task, make_provider

__all__ = ["Kernel", "default_transcript_path"]

#: Terminals a refusal recorded after the fact overrides (a fault or a cancel says more).
_SUCCESS = frozenset({Terminal.IDLE, Terminal.COMPLETED, Terminal.END_TURN, Terminal.MAX_ITERATIONS,
                      Terminal.BLOCKED_AWAITING_INPUT})  # fmt: skip


def default_transcript_path(config: Config) -> Path:
    """`<transcripts>/run-<UTC time>-<random>.jsonl`, by default under the XDG state dir."""
    base = config.transcripts
    if base is None:
        state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        base = Path(state) / "loop-harness" / "transcripts"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return base / f"run-{stamp}-{secrets.token_hex(3)}.jsonl"


class Kernel:
    """Runs one config: `await Kernel(config).run()` drains the queue once.

    Parameters:
        config: the validated run config.
        provider: the queue provider (default: the one the config names).
        interactive_handler: answers permission requests when the rule list is empty.
        transcript_path: where the JSONL transcript goes (default: `default_transcript_path`).
        observer: called with every transcript record as it is written (progress, tests).
        on_task_boundary: awaited between tasks, after a task completed and before the queue is listed
            again, with the number completed so far in this run (the soak samples and checks there).
    """

    def __init__(
        self,
        config: Config,
        *,
        provider: QueueProvider | None = None,
        interactive_handler: InteractiveHandler | None = None,
        transcript_path: Path | None = None,
        observer: Callable[[dict[str, Any]], None] | None = None,
        on_task_boundary: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.provider = provider or make_provider(config.queue, trigger=config.role.trigger)
        # The memory host forgets what it completed when its process ends: the kernel remembers (per
        # workspace and queue, beside the transcripts) for the provider it made itself from the config.
        self._remembers = provider is None and config.queue.provider == "memory"
        self.interactive_handler = interactive_handler
        self.transcript_path = transcript_path or default_transcript_path(config)
        self.observer = observer
        self.on_task_boundary = on_task_boundary
        self._status: dict[str, Any] = {"state": "new"}
        self._steering: list[str] = []
        self._cancel_requested = False
        self._cancel_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transcript: Transcript | None = None
        self._client: KernelClient | None = None
        self._link: AgentLink | None = None
        self._git_dir: Path | None = None
        self._repo: pygit2.Repository | None = None
        self._host_tools: Any = None  # a HostToolServer while the agent can reach the host tools
        self._active: ActiveRuns | None = None
        self._marker: Path | None = None
        self._token = ""  # carried by every process the run starts (see _recovery)
        self._run_dir: Path | None = None  # the sandbox's private HOME and temp dir live here; removed at the end
        self._egress: Egress | None = None
        self._tools_socket: socket.socket | None = None  # the host-tools port, bound before the agent starts

    @property
    def status(self) -> dict[str, Any]:
        """The loop status: state, current task and iteration, and the rule ids that decided its requests."""
        rule_ids = list(self._client.rule_ids) if self._client is not None else []
        return {**self._status, "rule_ids": rule_ids}

    @property
    def transcript_bytes(self) -> int:
        """Bytes written to this run's transcript so far."""
        return self._transcript.bytes_written if self._transcript is not None else 0

    def __repr__(self) -> str:
        status = ", ".join(f"{k}={v}" for k, v in self.status.items())
        return f"<Kernel [{status}]>"

    # --- control from outside (another task, a signal handler, another thread) -----------------

    def steer(self, text: str) -> None:
        """Queue advisory text for the agent; it is delivered at the next turn boundary."""
        self._call_in_loop(self._queue_steering, text)

    def cancel(self) -> None:
        """A user's cancel: the run ends `Cancelled` (after session/cancel, grace, kill)."""
        self._cancel_requested = True
        if self._cancel_event is not None:
            self._call_in_loop(self._cancel_event.set)

    def _call_in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or _running_loop() is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _queue_steering(self, text: str) -> None:
        self._steering.append(text)
        if self._transcript is not None and not self._transcript.closed:
            self._transcript.record("steer_queued", text=text, pending=len(self._steering))

    # --- the run -------------------------------------------------------------------------------

    async def run(self, *, task_id: str | None = None, prompt: str | None = None) -> RunResult:
        """Drain the queue (default), run one named task, or run a single prompt."""
        self._loop = asyncio.get_running_loop()
        self._cancel_event = asyncio.Event()
        if self._cancel_requested:
            self._cancel_event.set()
        active = ActiveRuns(self.transcript_path.parent)
        try:
            recovered = active.recover()  # runs whose kernel died: ended Failed/restarted
            transcript = self._transcript = Transcript(self.transcript_path, observer=self.observer)
            self._marker, self._token, trust = active.begin(self.transcript_path)
        except OSError as exc:
            raise ConfigError("transcripts", f"cannot write {self.transcript_path}: {exc.strerror or exc}") from None
        self._active = active
        mode = "prompt" if prompt is not None else "task" if task_id is not None else "queue"
        transcript.record(
            "run_start",
            mode=mode,
            kernel_version=VERSION,
            workspace=str(self.config.workspace),
            config=str(self.config.source) if self.config.source else None,
            agent=self.config.agent.command,
            provider=self.provider.name,
            rules=[r.id for r in self.config.policy.rules],
            **trust,  # what recovery checks a marker against, should this kernel die
        )
        for run in recovered:
            transcript.record("recovered", **run)
        tasks: list[TaskResult] = []
        self._status = {"state": "running", "mode": mode}
        try:
            stop = await self._run(tasks, task_id=task_id, prompt=prompt)
        except asyncio.CancelledError:
            await self._teardown()
            self._finish(Stop(Terminal.CANCELLED, {"kind": "interrupted"}), tasks)
            raise
        except Exception as exc:  # a kernel fault still ends the run in a terminal
            transcript.record("kernel_error", error=repr(exc), traceback=traceback.format_exc())
            stop = Stop(Terminal.FAILED, {"kind": "kernel_error", "error": repr(exc)})
        await self._teardown()  # a call the agent made after its last turn has been answered by now
        refused = self._refused()
        if refused is not None and stop.terminal in _SUCCESS:
            stop = refused
        return self._finish(stop, tasks)

    def _finish(self, stop: Stop, tasks: list[TaskResult]) -> RunResult:
        assert self._transcript is not None
        self._status = {"state": "ended", "terminal": stop.terminal.value}
        self._transcript.record(
            "terminal",
            terminal=stop.terminal.value,
            reason=dict(stop.reason),
            tasks=[t.to_json() for t in tasks],
            steering_undelivered=len(self._steering),
        )
        self._transcript.close()
        if self._active is not None and self._marker is not None:
            self._active.end(self._marker)
        return RunResult(stop, tasks, self.transcript_path)

    async def _run(self, tasks: list[TaskResult], *, task_id: str | None, prompt: str | None) -> Stop:
        assert self._transcript is not None
        self._git_dir = find_git_dir(self.config.workspace)
        policy = Policy(
            self.config.policy.rules,
            self.config.workspace,
            protected_globs=self.config.policy.protected_paths,
            protected_files=self._protected_files(),
            masked_reads=self.config.sandbox.mode != "off",  # commands run where read denies are masked
        )
        host = HostCalls(self.config.queue, self._transcript, self._sleep_or_cancel)
        if prompt is None:
            stop = await self._activate(policy, host)
            if stop is not None:
                return stop
        sandbox = self._plan_sandbox()
        if isinstance(sandbox, Stop):
            return sandbox
        if sandbox is not None:
            sandbox = await self._open_egress(sandbox, policy)
        self._client = KernelClient(
            policy=policy,
            transcript=self._transcript,
            exec_host=ExecHost(
                self._confine({**agent_environment(), "GIT_TERMINAL_PROMPT": "0", TOKEN_VARIABLE: self._token}, policy),
                sandbox=sandbox,
            ),
            interactive_handler=self.interactive_handler,
        )
        self._link = AgentLink(
            self.config.agent,
            self.config.limits,
            cwd=self.config.source.parent if self.config.source else Path.cwd(),
            transcript=self._transcript,
            client=self._client,
            token=self._token,
            on_spawn=self._agent_spawned,
            confine=lambda env: self._confine(env, policy),
            sandbox=sandbox,
        )
        stop = await self._link.start()
        if stop is not None:
            return stop
        await self._start_host_tools(host)
        if prompt is not None:
            self._transcript.record("task_start", task={"id": None, "title": "single prompt"})
            return (await self._session(prompt, task=None))[0]
        return await self._drain(tasks, host, only=task_id)

    def _completed_store(self) -> CompletedTasks | None:
        if not self._remembers:
            return None
        # The queue: this config, as written (an edited config is a fresh record), and what it drains.
        written = hashlib.sha256(self.config.model_dump_json(exclude={"source", "role_source"}).encode()).hexdigest()
        queue = f"{self.config.role.trigger}:{self.config.source or 'inline'}:{written}"
        return CompletedTasks(self.transcript_path.parent, workspace=self.config.workspace, git_dir=self._git_dir,
                              queue=queue)  # fmt: skip

    def _transcript_record(self, type: str, **fields: Any) -> None:
        assert self._transcript is not None
        self._transcript.record(type, **fields)

    def _confine(self, env: dict[str, str], policy: Policy) -> dict[str, str]:
        """No directory on PATH the agent could plant a program in (`.venv/bin/git` under `write **`)."""
        if "PATH" in env:
            kept = policy.search_path(env["PATH"])
            if kept != env["PATH"] and self._transcript is not None:
                dropped = [e for e in env["PATH"].split(os.pathsep) if e not in kept.split(os.pathsep)]
                self._transcript.record("search_path_confined", dropped=dropped)
            env["PATH"] = kept
        return env

    def _plan_sandbox(self) -> Sandbox | Stop | None:
        """The OS sandbox for this run, or a BlockedPrecondition saying why it cannot start: never a silent
        run without one."""
        assert self._transcript is not None
        settings = self.config.sandbox
        if settings.mode == "off":
            self._transcript.record("sandbox", mode="off")
            return None
        bwrap = find_bwrap(settings.bwrap)
        cause = sandbox_unavailable(bwrap)
        if cause is None and bwrap is not None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="loop-harness-run-"))
            git_dirs = [self._git_dir, *_common_dir(self._git_dir)] if self._git_dir else []
            try:
                sandbox = plan_sandbox(settings, bwrap=bwrap, worktree=self.config.workspace,
                                       rules=self.config.policy.rules,
                                       protected_globs=(".git", ".git/**", *self.config.policy.protected_paths),
                                       protected_files=[*self._protected_files(), self.transcript_path.parent],
                                       git_dirs=git_dirs,
                                       run_dir=self._run_dir, agent_env=self.config.agent.env)  # fmt: skip
            except (SandboxError, OSError) as exc:
                cause = f"the sandbox could not be planned: {exc}"
            else:
                return sandbox
        return blocked("sandbox_available", f"{cause}; to run without the OS sandbox set sandbox: {{mode: off}}",
                       mode=settings.mode)  # fmt: skip

    async def _open_egress(self, sandbox: Sandbox, policy: Policy) -> Sandbox:
        """The sandbox's ways out, all through the kernel: the filtering proxy (when a network rule allows a
        host) and the host-tools port, bound now so the agent's sandbox can relay it before the server runs."""
        assert self._transcript is not None and self._run_dir is not None
        self._egress = Egress(self._run_dir, policy.judge_host, self._transcript.record)
        await self._egress.start()
        self._tools_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tools_socket.bind(("127.0.0.1", 0))
        port = self._tools_socket.getsockname()[1]
        proxy = any(r.kind == "network" and r.decision == "allow" for r in policy.rules)
        sandbox = dataclasses.replace(sandbox, proxy=(PROXY_PORT, self._egress.proxy_socket) if proxy else None,
                                      tools=(port, self._egress.tools_socket))  # fmt: skip
        self._transcript.record("sandbox", **sandbox.describe())
        return sandbox

    async def _remove_run_dir(self) -> None:
        if self._tools_socket is not None:  # never served
            self._tools_socket.close()
        if self._run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._run_dir, True)

    def _agent_spawned(self, pid: int) -> None:
        if self._active is not None and self._marker is not None:
            self._active.agent_started(self._marker, pid)

    def _protected_files(self) -> list[Path]:
        """The run's own files: its config, its role, its transcript (and their directory, when the
        transcripts are kept inside the worktree)."""
        files = [p for p in (self.config.source, self.config.role_source, self.transcript_path) if p]
        transcripts = self.transcript_path.resolve().parent
        if transcripts.is_relative_to(self.config.workspace.resolve()):
            files.append(transcripts)
        return files

    async def _activate(self, policy: Policy, host: HostCalls) -> Stop | None:
        if not self.config.agent.supports_permission_requests:
            return blocked(
                "agent_permission_support",
                "the bound agent does not declare that it asks before acting "
                "(set agent.supports_permission_requests: true for an agent that sends permission requests)",
            )
        if policy.interactive:
            return blocked("policy_non_empty", "the policy has no rules: an empty policy is the interactive path")
        return await host.authorize(self.provider) or self._check_git(left_by_task=None)

    def _check_git(self, *, left_by_task: str | None, state: GitState | None = None) -> Stop | None:
        assert self._transcript is not None
        state = state or self._git_state()
        if state is None:
            return blocked("git_worktree", f"{self.config.workspace} is not a git worktree")
        stop = check_git(state, left_by_task=left_by_task)
        self._transcript.record("preconditions", ok=stop is None, failed=dict(stop.reason) if stop else None)
        return stop

    def _git_state(self) -> GitState | None:
        if self._git_dir is None:
            return None
        if self._repo is None:
            self._repo = pygit2.Repository(str(self._git_dir))
        return read_git_state(self.config.workspace, self._git_dir, self._repo)

    async def _start_host_tools(self, host: HostCalls) -> None:
        """Serve the host's tools over MCP when the agent can use an HTTP MCP server."""
        assert self._transcript is not None and self._link is not None
        if not self._link.supports_http_mcp:
            self._transcript.record("host_tools", served=False, why="the agent does not advertise mcpCapabilities.http")
            return
        from ._host_tools import HostTools  # the MCP server costs ~0.5 s to import: only when it is used
        from ._mcp_host import HostToolServer

        tools = HostTools(self.provider, workspace=self.config.workspace, git_dir=self._git_dir,
                          base_branch=self.config.queue.base_branch, host_calls=host.call)  # fmt: skip
        self._host_tools = HostToolServer(tools, self._transcript)
        sock, self._tools_socket = self._tools_socket, None
        await self._host_tools.start(sock)
        if self._egress is not None:
            self._egress.tools_port = self._host_tools.port
        self._transcript.record("host_tools", served=True, port=self._host_tools.port,
                                allowlist=self.config.role.tools or "all")  # fmt: skip

    async def _teardown(self) -> None:
        """Each step runs whatever the one before did: stop serving the agent, then release its terminals."""
        steps = [
            ("agent", self._link.close() if self._link else None),
            ("terminals", self._client.exec_host.release_all() if self._client else None),
            ("host_tools", self._host_tools.stop() if self._host_tools else None),
            ("provider", self.provider.aclose()),
            ("egress", self._egress.close() if self._egress else None),
            ("sandbox", self._remove_run_dir() if self._run_dir else None),
        ]
        for name, step in steps:
            if step is None:
                continue
            try:
                await step
            except Exception as exc:
                if self._transcript is not None and not self._transcript.closed:
                    self._transcript.record("teardown_error", step=name, error=f"{type(exc).__name__}: {exc}")

    # --- the queue -----------------------------------------------------------------------------

    async def _drain(self, tasks: list[TaskResult], host: HostCalls, *, only: str | None) -> Stop:
        completed: set[str] = set()
        store = self._completed_store()
        earlier = store.load() if store is not None else {}
        skipped: set[str] = set()
        last: TaskResult | None = None
        while True:
            if last is not None and self.on_task_boundary is not None:
                await self.on_task_boundary(len(completed))
            if self._cancel_requested:
                return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "task_boundary"})
            refused = self._refused()
            if refused is not None:
                return refused
            listing = await host.call("list_tasks", self.provider.list_tasks)
            if isinstance(listing, Stop):
                return listing
            waiting = [t for t in listing if t.id not in completed and (only is None or t.id == only)]
            for task in [t for t in waiting if t.id in earlier and t.id not in skipped]:  # said once per run
                skipped.add(task.id)
                reason = {"kind": "completed_earlier", **earlier[task.id]}
                tasks.append(TaskResult(task.id, task.title, Terminal.COMPLETED, reason))
                self._transcript_record("task_skipped", task={"id": task.id, "title": task.title}, reason=reason)
                if only is not None:
                    return Stop(Terminal.COMPLETED, reason)
            waiting = [t for t in waiting if t.id not in skipped]
            state = self._git_state() if last is not None else None  # one read per boundary
            if last is not None:
                last.left_changes = list(state.changes) if state else []
            if not waiting:
                if only is not None:
                    return blocked("task_assigned", f"task {only!r} is not in the queue", task=only)
                if store is not None:
                    store.clear()  # the queue is drained: the next run of it starts afresh
                idle = {"kind": "queue_empty", "completed": len(completed)}
                return Stop(Terminal.IDLE, {**idle, "skipped_completed_earlier": len(skipped)} if skipped else idle)
            if last is not None:
                stop = await host.authorize(self.provider) or self._check_git(left_by_task=last.id, state=state)
                if stop is not None:
                    return stop
            task = waiting[0]
            result = await self._run_task(task)
            tasks.append(result)
            if result.terminal is not Terminal.COMPLETED:
                return Stop(result.terminal, result.reason)
            if self.config.commit is not None:  # the kernel owns git: commit (and push) what the task did
                committed = await commit_task(self.config.workspace, self.config.commit, task.id, task.title)
                self._transcript_record("commit", task=task.id, **committed)
            completed.add(task.id)  # skipped from now on, even if the host cannot mark it done
            if store is not None:
                try:
                    store.add(task.id, self.transcript_path)  # and by the next run of this queue
                except OSError as exc:
                    self._transcript_record("completion_not_kept", task=task.id, error=exc.strerror or str(exc))
            outcome = await host.call("mark_done", self.provider.mark_done, task)
            if isinstance(outcome, Stop):
                result.mark_done_error = dict(outcome.reason)
            if only is not None:  # a single-task run ends with its task
                state = self._git_state()
                result.left_changes = list(state.changes) if state else []
                return Stop(Terminal.COMPLETED, result.reason)
            last = result

    async def _run_task(self, task: Task) -> TaskResult:
        assert self._transcript is not None and self._client is not None
        self._status = {"state": "running", "task": task.id, "iteration": 0}
        self._transcript.record("task_start", task={"id": task.id, "title": task.title})
        started = time.monotonic()
        if self._host_tools is None:
            self._client.begin_task()
            stop, iterations = await self._session(_task_prompt(self.config.role.prompt, task), task=task)
            used: list[str] = []
        else:
            binding = self._host_tools.tools.bind(task, self.config.role.tools)
            self._client.begin_task(binding.allowed)
            with self._host_tools.serving(binding) as entry:
                stop, iterations = await self._session(
                    _task_prompt(self.config.role.prompt, task), task=task, mcp_servers=[entry]
                )
            used = binding.used
        stop = self._check_termination(stop, used, host_stops=binding.host_stops if self._host_tools else {})
        result = TaskResult(
            id=task.id,
            title=task.title,
            terminal=stop.terminal,
            reason=stop.reason,  # type: ignore[arg-type]  # built for this task, not shared
            rule_ids=list(self._client.rule_ids),
            iterations=iterations,
            tokens=self._tokens(),
            seconds=time.monotonic() - started,
        )
        self._transcript.record("task_end", **result.to_json())
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

    async def _session(
        self, first_prompt: str, *, task: Task | None, mcp_servers: list[dict[str, Any]] | None = None
    ) -> tuple[Stop, int]:
        """Run one session to its end: the stop, and the number of prompt rounds."""
        assert self._link is not None and self._client is not None and self._transcript is not None
        assert self._cancel_event is not None
        meta = {"loopHarness": {"taskId": task.id, "title": task.title}} if task else {}
        session_id = await self._link.new_session(self.config.workspace, meta, mcp_servers or [])
        if isinstance(session_id, Stop):
            return session_id, 0
        limits = self.config.limits
        text, kind = first_prompt, str(PromptKind.TASK)
        standing = iterations = 0
        try:
            while True:
                stop = before_turn(iterations=iterations, max_iterations=limits.max_iterations,
                                   cancel_requested=self._cancel_requested)  # fmt: skip
                if stop is not None:
                    return stop, iterations
                iterations += 1
                self._status = {"state": "running", "task": task.id if task else None, "iteration": iterations}
                text, kind = self._with_steering(text, kind)
                turn = self._client.begin_turn(session_id)
                self._transcript.record("turn", iteration=iterations, prompt_kind=kind)
                answer = await self._link.prompt(session_id, text, cancel=self._cancel_event)
                if isinstance(answer, Stop):
                    return answer, iterations
                refused = self._refused()
                outcome = TurnOutcome(answer, turn.tool_calls, turn.client_calls, refused.reason if refused else None)
                step = after_turn(outcome, single_prompt=task is None, standing=standing,
                                  standing_answers=limits.standing_answers)  # fmt: skip
                if isinstance(step, Stop):
                    return step, iterations
                text, kind, standing = step.text, str(step.kind), step.standing
        finally:
            await self._client.exec_host.release_session(session_id)
            await self._link.end_session(session_id)

    def _refused(self) -> Stop | None:
        """A refusal stops the run wherever it happened: in a turn, or in a call that came late."""
        if self._client is None or not self._client.refusals:
            return None
        return Stop(Terminal.BLOCKED_POLICY, self._client.refusals[0])

    def _tokens(self) -> dict[str, Any] | None:
        """The task's token usage: the prompt answer's, else the last `usage_update` (Codex reports only
        that: context tokens `used` of `size`)."""
        if self._link is not None and self._link.last_usage:
            return self._link.last_usage
        usage = self._client.context_usage if self._client else None
        return dict(usage) if usage else None

    def _with_steering(self, text: str, kind: str) -> tuple[str, str]:
        if not self._steering:
            return text, kind
        notes, self._steering = self._steering, []
        assert self._transcript is not None
        self._transcript.record("steer_delivered", count=len(notes))
        steering = "\n".join(f"- {n}" for n in notes)
        return f"{text}\n\nSteering from the operator (advisory):\n{steering}", f"{kind}+steering"

    async def _sleep_or_cancel(self, seconds: float) -> bool:
        """Sleep; True if a user cancel arrived meanwhile."""
        assert self._cancel_event is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cancel_event.wait(), seconds)
        return self._cancel_event.is_set()


def _common_dir(git_dir: Path) -> list[Path]:
    """A linked worktree's git dir names the repository's shared one in `commondir`."""
    try:
        return [(git_dir / (git_dir / "commondir").read_text().strip()).resolve()]
    except OSError:
        return []


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
