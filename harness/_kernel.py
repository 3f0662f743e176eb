"""The loop kernel: one agent, one workspace, a queue of tasks, one terminal per run.

    run
     ├─ activate: preconditions (static, host, git) → BlockedPrecondition
     ├─ spawn the agent, initialize                 → Failed
     └─ per task (a session each), per turn (a session/prompt):
          stop reason + what the turn did → next prompt, or the task's terminal
          turn deadline / user cancel → session/cancel, grace, kill the group

Host calls go through `HostCalls` (retries, back-off, Blocked* terminals).
Every message and decision lands in the transcript; the terminal is its last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation, InitializeResponse

from ._client import InteractiveHandler, KernelClient, TurnState
from ._config import Config
from ._exec import ExecHost
from ._hostcalls import HostCalls
from ._policy import Policy
from ._preconditions import GitState, blocked, check_git, find_git_dir, read_git_state
from ._terminals import EXIT_CODE, Stop, Terminal
from ._transcript import Transcript
from ._transport import AgentProcess, agent_environment
from .queues import QueueProvider, Task, make_provider

__all__ = ["CONTINUE_PROMPT", "STANDING_PROMPT", "Kernel", "RunResult", "TaskResult", "default_transcript_path"]

VERSION = "0.1.0"
STANDING_PROMPT = (
    "Continue without waiting for input; policy decides permissions. If the task is finished, say so and end your turn."
)
CONTINUE_PROMPT = "Continue."


@dataclass
class TaskResult:
    id: str
    title: str
    terminal: Terminal
    reason: dict[str, Any]
    rule_ids: list[str] = field(default_factory=list)
    iterations: int = 0
    mark_done_error: dict[str, Any] | None = None
    left_changes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "terminal": self.terminal.value,
            "reason": self.reason,
            "rule_ids": self.rule_ids,
            "iterations": self.iterations,
        }
        if self.mark_done_error:
            data["mark_done_error"] = self.mark_done_error
        if self.left_changes:
            data["left_changes"] = self.left_changes
        return data


@dataclass
class RunResult:
    stop: Stop
    tasks: list[TaskResult]
    transcript: Path

    @property
    def terminal(self) -> Terminal:
        return self.stop.terminal

    @property
    def reason(self) -> dict[str, Any]:
        return dict(self.stop.reason)

    @property
    def exit_code(self) -> int:
        return EXIT_CODE[self.stop.terminal]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.stop.to_json(),
            "tasks": [t.to_json() for t in self.tasks],
            "transcript": str(self.transcript),
        }


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
    """

    def __init__(
        self,
        config: Config,
        *,
        provider: QueueProvider | None = None,
        interactive_handler: InteractiveHandler | None = None,
        transcript_path: Path | None = None,
        observer: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.config = config
        self.provider = provider or make_provider(config.queue)
        self.interactive_handler = interactive_handler
        self.transcript_path = transcript_path or default_transcript_path(config)
        self.observer = observer
        self._status: dict[str, Any] = {"state": "new"}
        self._steering: list[str] = []
        self._cancel_requested = False
        self._cancel_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transcript: Transcript | None = None
        self._agent: AgentProcess | None = None
        self._conn: ClientSideConnection | None = None
        self._client: KernelClient | None = None
        self._init: InitializeResponse | None = None
        self._git_dir: Path | None = None
        self._last_session: str | None = None

    @property
    def status(self) -> dict[str, Any]:
        """The loop status: state, current task and iteration, and the rule ids that decided its requests."""
        rule_ids = list(self._client.rule_ids) if self._client is not None else []
        return {**self._status, "rule_ids": rule_ids}

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
        transcript = Transcript(self.transcript_path, observer=self.observer)
        self._transcript = transcript
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
        )
        tasks: list[TaskResult] = []
        self._status = {"state": "running", "mode": mode}
        try:
            stop = await self._run(tasks, task_id=task_id, prompt=prompt)
        except asyncio.CancelledError:
            stop = Stop(Terminal.CANCELLED, {"kind": "interrupted"})
            await self._teardown()
            self._finish(stop, tasks)
            raise
        except Exception as exc:  # a kernel fault still ends the run in a terminal
            transcript.record("kernel_error", error=repr(exc), traceback=traceback.format_exc())
            stop = Stop(Terminal.FAILED, {"kind": "kernel_error", "error": repr(exc)})
        await self._teardown()
        return self._finish(stop, tasks)

    def _finish(self, stop: Stop, tasks: list[TaskResult]) -> RunResult:
        assert self._transcript is not None
        result = RunResult(stop, tasks, self.transcript_path)
        self._status = {"state": "ended", "terminal": stop.terminal.value}
        self._transcript.record(
            "terminal",
            terminal=stop.terminal.value,
            reason=dict(stop.reason),
            tasks=[t.to_json() for t in tasks],
            steering_undelivered=len(self._steering),
        )
        self._transcript.close()
        return result

    async def _run(self, tasks: list[TaskResult], *, task_id: str | None, prompt: str | None) -> Stop:
        self._git_dir = find_git_dir(self.config.workspace)
        policy = Policy(
            self.config.policy.rules,
            self.config.workspace,
            protected_globs=self.config.policy.protected_paths,
            protected_files=[p for p in (self.config.source, self.config.role_source) if p],
            git_dir=self._git_dir,
        )
        assert self._transcript is not None
        host = HostCalls(self.config.queue, self._transcript, self._sleep_or_cancel)
        if prompt is None:
            stop = await self._activate(policy, host)
            if stop is not None:
                return stop
        stop = await self._start_agent(policy)
        if stop is not None:
            return stop
        if prompt is not None:
            return await self._single_prompt(prompt)
        return await self._drain(tasks, host, only=task_id)

    async def _activate(self, policy: Policy, host: HostCalls) -> Stop | None:
        if not self.config.agent.supports_permission_requests:
            return blocked(
                "agent_permission_support",
                "the bound agent does not declare that it asks before acting "
                "(set agent.supports_permission_requests: true for an agent that sends permission requests)",
            )
        if policy.interactive:
            return blocked("policy_non_empty", "the policy has no rules: an empty policy is the interactive path")
        stop = await host.authorize(self.provider)
        if stop is not None:
            return stop
        return self._check_git(left_by_task=None)

    def _check_git(self, *, left_by_task: str | None, state: GitState | None = None) -> Stop | None:
        state = state or self._git_state()
        if state is None:
            return blocked("git_worktree", f"{self.config.workspace} is not a git worktree")
        stop = check_git(state, left_by_task=left_by_task)
        assert self._transcript is not None
        self._transcript.record(
            "preconditions",
            ok=stop is None,
            failed=dict(stop.reason) if stop else None,
        )
        return stop

    def _left_changes(self) -> list[str]:
        state = self._git_state()
        return list(state.changes) if state else []

    def _git_state(self) -> GitState | None:
        if self._git_dir is None:
            return None
        return read_git_state(self.config.workspace, self._git_dir)

    # --- the agent -----------------------------------------------------------------------------

    async def _start_agent(self, policy: Policy) -> Stop | None:
        assert self._transcript is not None
        agent = self.config.agent
        base_dir = self.config.source.parent if self.config.source else Path.cwd()
        try:
            self._agent = await AgentProcess.spawn(
                agent.command,
                cwd=str(base_dir),
                env=agent_environment(agent.env),
                transcript=self._transcript,
            )
        except OSError as exc:
            return Stop(Terminal.FAILED, {"kind": "agent_start_failed", "argv": agent.command, "error": str(exc)})
        exec_env = {**agent_environment(), "GIT_TERMINAL_PROMPT": "0"}
        self._client = KernelClient(
            policy=policy,
            transcript=self._transcript,
            exec_host=ExecHost(exec_env),
            interactive_handler=self.interactive_handler,
        )
        self._conn = ClientSideConnection(self._client, self._agent)
        capabilities = ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=True
        )
        try:
            self._init = await self._request(
                self._conn.initialize(
                    protocol_version=PROTOCOL_VERSION,
                    client_capabilities=capabilities,
                    client_info=Implementation(name="loop-harness", version=VERSION),
                ),
                "initialize",
            )
        except _AgentFault as fault:
            return fault.stop
        if self._init.protocol_version != PROTOCOL_VERSION:
            return Stop(
                Terminal.FAILED,
                {"kind": "protocol_version", "expected": PROTOCOL_VERSION, "got": self._init.protocol_version},
            )
        return None

    async def _request(self, awaitable: Any, what: str) -> Any:
        """Await a setup request (initialize, session/new) within init_timeout; faults → `_AgentFault`."""
        request = asyncio.ensure_future(awaitable)
        await self._wait_or_exit(request, timeout=self.config.limits.init_timeout_s)
        if not request.done():
            await _discard(request)
            if self._agent is not None and self._agent.exited.is_set():
                raise _AgentFault(await self._agent_failure())
            raise _AgentFault(
                Stop(
                    Terminal.FAILED,
                    {"kind": "agent_timeout", "request": what, "timeout_s": self.config.limits.init_timeout_s},
                )
            )
        try:
            return request.result()
        except ConnectionError:
            raise _AgentFault(await self._agent_failure()) from None
        except RequestError as exc:
            raise _AgentFault(
                Stop(
                    Terminal.FAILED,
                    {"kind": "agent_error", "request": what, "code": exc.code, "message": str(exc), "data": exc.data},
                )
            ) from None
        except ValueError as exc:  # the SDK's pydantic validation of a malformed answer
            raise _AgentFault(
                Stop(Terminal.FAILED, {"kind": "protocol_error", "request": what, "error": str(exc)[:500]})
            ) from None

    async def _wait_or_exit(self, future: asyncio.Future[Any], *also: Any, timeout: float) -> None:
        """Wait for `future`, for any of `also`, for the agent process to exit, or for `timeout`."""
        assert self._agent is not None
        watchers = [asyncio.ensure_future(a) for a in (*also, self._agent.exited.wait())]
        try:
            await asyncio.wait({future, *watchers}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in watchers:
                watcher.cancel()

    async def _agent_failure(self) -> Stop:
        """The agent's stdout ended: name the framing error, or the exit status and stderr tail."""
        agent = self._agent
        assert agent is not None
        if agent.failure is not None:
            return Stop(Terminal.FAILED, {**agent.failure, "stderr_tail": agent.stderr_tail()})
        status = await agent.wait_exit(3.0)
        reason: dict[str, Any] = {"kind": "agent_exited", "exit_status": status, "stderr_tail": agent.stderr_tail()}
        if status is None:
            reason["detail"] = "the agent closed stdout but kept running"
        return Stop(Terminal.FAILED, reason)

    async def _teardown(self) -> None:
        with contextlib.suppress(Exception):
            if self._client is not None:
                await self._client.exec_host.release_all()
        agent = self._agent
        if self._conn is not None and agent is not None and not (agent.disconnected.is_set() or agent.exited.is_set()):
            await self._close_last_session()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        if self._agent is not None:
            await self._agent.stop(grace=2.0)
        with contextlib.suppress(Exception):
            await self.provider.aclose()

    async def _close_last_session(self) -> None:
        """`session/close` where the agent supports it: some agents exit only then."""
        caps = self._init.agent_capabilities if self._init else None
        sessions = caps.session_capabilities if caps else None
        if self._last_session is None or sessions is None or sessions.close is None:
            return
        assert self._conn is not None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close_session(session_id=self._last_session), 2.0)

    # --- the queue -----------------------------------------------------------------------------

    async def _drain(self, tasks: list[TaskResult], host: HostCalls, *, only: str | None) -> Stop:
        completed: set[str] = set()
        last: TaskResult | None = None
        while True:
            if self._cancel_requested:
                return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "task_boundary"})
            listing = await host.call("list_tasks", self.provider.list_tasks)
            if isinstance(listing, Stop):
                return listing
            waiting = [t for t in listing if t.id not in completed and (only is None or t.id == only)]
            state = self._git_state() if last is not None else None  # one read per boundary
            if last is not None:
                last.left_changes = list(state.changes) if state else []
            if not waiting:
                if only is not None:
                    return blocked("task_assigned", f"task {only!r} is not in the queue", task=only)
                return Stop(Terminal.IDLE, {"kind": "queue_empty", "completed": len(completed)})
            if last is not None:
                stop = await host.authorize(self.provider) or self._check_git(left_by_task=last.id, state=state)
                if stop is not None:
                    return stop
            task = waiting[0]
            result = await self._run_task(task)
            tasks.append(result)
            if result.terminal is not Terminal.COMPLETED:
                return Stop(result.terminal, result.reason)
            completed.add(task.id)  # skipped from now on, even if the host cannot mark it done
            outcome = await host.call("mark_done", self.provider.mark_done, task, retry=True)
            if isinstance(outcome, Stop):
                result.mark_done_error = dict(outcome.reason)
            if only is not None:  # a single-task run ends with its task
                result.left_changes = self._left_changes()
                return Stop(Terminal.COMPLETED, result.reason)
            last = result

    async def _run_task(self, task: Task) -> TaskResult:
        assert self._transcript is not None and self._client is not None
        self._status = {"state": "running", "task": task.id, "iteration": 0}
        self._transcript.record("task_start", task={"id": task.id, "title": task.title})
        self._client.begin_task()
        first = _task_prompt(self.config.role.prompt, task)
        stop, iterations = await self._session(first, task=task)
        result = TaskResult(
            id=task.id,
            title=task.title,
            terminal=stop.terminal,
            reason=dict(stop.reason),
            rule_ids=list(self._client.rule_ids),
            iterations=iterations,
        )
        self._transcript.record("task_end", **result.to_json())
        return result

    async def _single_prompt(self, prompt: str) -> Stop:
        assert self._transcript is not None
        self._transcript.record("task_start", task={"id": None, "title": "single prompt"})
        stop, _ = await self._session(prompt, task=None)
        return stop

    # --- a session, turn by turn ---------------------------------------------------------------

    async def _session(self, first_prompt: str, *, task: Task | None) -> tuple[Stop, int]:
        """Run one session to its end. Returns the stop and the number of prompt rounds."""
        assert self._conn is not None and self._client is not None
        meta = {"loopHarness": {"taskId": task.id, "title": task.title}} if task else {}
        try:
            session = await self._request(
                self._conn.new_session(cwd=str(self.config.workspace), mcp_servers=[], **meta), "session/new"
            )
        except _AgentFault as fault:
            return fault.stop, 0
        session_id = session.session_id
        self._last_session = session_id
        limits = self.config.limits
        text, kind = first_prompt, "task"
        standing = 0
        iterations = 0
        try:
            while True:
                if iterations >= limits.max_iterations:
                    return Stop(
                        Terminal.MAX_ITERATIONS,
                        {"kind": "iterations", "current": iterations + 1, "limit": limits.max_iterations},
                    ), iterations
                if self._cancel_requested:
                    return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn_boundary"}), iterations
                iterations += 1
                self._status = {"state": "running", "task": task.id if task else None, "iteration": iterations}
                text, kind = self._with_steering(text, kind)
                turn, outcome = await self._turn(session_id, text, kind=kind, iteration=iterations)
                if isinstance(outcome, Stop):
                    return outcome, iterations
                if turn.refusals:  # whatever stop reason followed the refusal
                    return Stop(Terminal.BLOCKED_POLICY, turn.refusals[0]), iterations
                if outcome == "refusal":
                    return Stop(Terminal.FAILED, {"kind": "refusal", "stop_reason": outcome}), iterations
                if outcome == "cancelled":
                    return Stop(Terminal.CANCELLED, {"kind": "agent_cancelled", "stop_reason": outcome}), iterations
                if outcome in ("max_tokens", "max_turn_requests"):
                    text, kind = CONTINUE_PROMPT, f"continue_after_{outcome}"
                    continue
                # end_turn
                if task is None:
                    return Stop(Terminal.END_TURN, {"kind": "end_turn", "acted": turn.acted}), iterations
                if turn.acted:
                    return Stop(
                        Terminal.COMPLETED,
                        {"kind": "end_turn", "tool_calls": turn.tool_calls, "client_calls": turn.client_calls},
                    ), iterations
                if standing >= limits.standing_answers:
                    return Stop(
                        Terminal.BLOCKED_AWAITING_INPUT,
                        {"kind": "no_tool_call", "standing_answers": standing, "limit": limits.standing_answers},
                    ), iterations
                standing += 1
                text, kind = STANDING_PROMPT, "standing_policy"
        finally:
            await self._client.exec_host.release_session(session_id)

    def _with_steering(self, text: str, kind: str) -> tuple[str, str]:
        if not self._steering:
            return text, kind
        notes, self._steering = self._steering, []
        assert self._transcript is not None
        self._transcript.record("steer_delivered", count=len(notes))
        steering = "\n".join(f"- {n}" for n in notes)
        return f"{text}\n\nSteering from the operator (advisory):\n{steering}", f"{kind}+steering"

    async def _turn(self, session_id: str, text: str, *, kind: str, iteration: int) -> tuple[TurnState, Stop | str]:
        """One session/prompt round: its state, and a stop reason string or a Stop."""
        assert self._conn is not None and self._client is not None and self._transcript is not None
        assert self._cancel_event is not None
        turn = self._client.begin_turn()
        self._transcript.record("turn", iteration=iteration, prompt_kind=kind)
        prompt = asyncio.ensure_future(self._conn.prompt(session_id=session_id, prompt=[text_block(text)]))
        await self._wait_or_exit(prompt, self._cancel_event.wait(), timeout=self.config.limits.turn_timeout_s)
        if prompt.done():
            return turn, await self._prompt_outcome(prompt)
        if self._agent is not None and self._agent.exited.is_set():  # dead, stdout held open by a grandchild
            await _discard(prompt)
            return turn, await self._agent_failure()
        why = "user_cancel" if self._cancel_event.is_set() else "turn_timeout"
        agent_stop, killed = await self._cancel_turn(session_id, prompt)
        self._transcript.record("turn_cancelled", why=why, agent_stop_reason=agent_stop, killed=killed)
        detail = {"agent_stop_reason": agent_stop, "killed": killed}
        if why == "user_cancel":
            return turn, Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn", **detail})
        return turn, Stop(
            Terminal.FAILED, {"kind": "turn_timeout", "timeout_s": self.config.limits.turn_timeout_s, **detail}
        )

    async def _prompt_outcome(self, prompt: asyncio.Future[Any]) -> Stop | str:
        try:
            return str(prompt.result().stop_reason)
        except ConnectionError:
            return await self._agent_failure()
        except RequestError as exc:
            return Stop(
                Terminal.FAILED,
                {
                    "kind": "agent_error",
                    "request": "session/prompt",
                    "code": exc.code,
                    "message": str(exc),
                    "data": exc.data,
                },
            )
        except ValueError as exc:
            return Stop(
                Terminal.FAILED, {"kind": "protocol_error", "request": "session/prompt", "error": str(exc)[:500]}
            )

    async def _cancel_turn(self, session_id: str, prompt: asyncio.Future[Any]) -> tuple[str | None, bool]:
        """session/cancel, answer parked permissions `cancelled`, wait the grace, then kill the group."""
        assert self._conn is not None and self._client is not None and self._agent is not None
        self._client.cancel_pending()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.cancel(session_id=session_id), 1.0)
        done, _ = await asyncio.wait({prompt}, timeout=self.config.limits.cancel_grace_s)
        if done:
            try:
                return str(prompt.result().stop_reason), False
            except Exception as exc:  # an error after a cancel counts as cancelled
                return f"error: {type(exc).__name__}", False
        self._agent.kill_group()
        prompt.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await prompt
        return None, True

    async def _sleep_or_cancel(self, seconds: float) -> bool:
        """Sleep; True if a user cancel arrived meanwhile."""
        assert self._cancel_event is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cancel_event.wait(), seconds)
        return self._cancel_event.is_set()


class _AgentFault(Exception):
    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.reason.get("kind"))
        self.stop = stop


async def _discard(future: asyncio.Future[Any]) -> None:
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await future


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
