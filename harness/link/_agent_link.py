"""One agent process and its ACP connection, with every fault mapped to a `Failed` stop.

The kernel asks the link to start the agent, open sessions and play prompt
turns; the link owns what can go wrong on the way: a crash (exit status and
stderr tail), broken framing, an error answer, a malformed answer, a hung
request, a turn deadline or a user's cancel (session/cancel, parked
permissions answered `cancelled`, a grace period, then the process group is
killed), and a shutdown that ends grandchildren too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    ClientCapabilities,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    FileSystemCapabilities,
    Implementation,
    InitializeResponse,
    PromptResponse,
)

from .._flag import Flag
from ..config._config import AgentConfig, LimitsConfig
from ..record._records import RecordType
from ..record._recovery import TOKEN_VARIABLE
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript
from ..sandbox._sandbox import Sandbox
from ._client import KernelClient
from ._transport import AgentProcess, agent_environment

__all__ = ["VERSION", "AgentLink", "Interrupted"]

T = TypeVar("T")
R = TypeVar("R")

VERSION = "0.1.0"


class AgentLink:
    def __init__(
        self,
        agent: AgentConfig,
        limits: LimitsConfig,
        *,
        cwd: Path,
        transcript: Transcript,
        client: KernelClient,
        token: str = "",
        on_spawn: Callable[[int], None] | None = None,
        confine: Callable[[dict[str, str]], dict[str, str]] | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits
        self.cwd = cwd
        self.transcript = transcript
        self.client = client
        self.token = token  # the run's token: in the agent's environment, and what ends its leftovers
        self.on_spawn = on_spawn
        self.confine = confine or (lambda env: env)  # the kernel's last word on the agent's environment
        self.sandbox = sandbox  # the agent starts inside it: so does everything it runs
        self.process: AgentProcess | None = None
        self._conn: ClientSideConnection | None = None
        self._init: InitializeResponse | None = None
        self._open_session: str | None = None  # the one session not yet closed, if any
        self._closing: asyncio.Future[None] | None = None  # its session/close, sent, its answer not yet awaited
        self.last_usage: dict[str, Any] | None = None  # the agent's cumulative token usage for the session

    async def start(self) -> Stop | None:
        """Spawn the agent and `initialize`; a Stop if that fails."""
        try:
            env = self.confine(agent_environment({**self.agent.env, TOKEN_VARIABLE: self.token}))
            argv, cwd = self.agent.command, str(self.cwd)
            if self.sandbox is None:
                self.process = await AgentProcess.spawn(argv, cwd=cwd, env=env, transcript=self.transcript,
                                                        token=self.token)  # fmt: skip
            else:  # its stdout, its signals and its exit status its own there too
                self.process = await AgentProcess.spawn_in(self.sandbox, argv, cwd=cwd, env=env,
                                                           transcript=self.transcript, token=self.token)  # fmt: skip
            if self.sandbox is not None and self.sandbox.overlay is not None:
                await self.sandbox.overlay.attach()  # its namespaces and merged worktree, held by descriptor
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the argv or environment
            return Stop(Terminal.FAILED, {"kind": "agent_start_failed", "argv": self.agent.command, "error": str(exc)})
        if self.on_spawn is not None:  # before initialize: a kernel killed now still leaves a trail
            self.on_spawn(self.process.pid)
        # elicitation/create is in the SDK's unstable set: the kernel answers questions (question auto-answer)
        self._conn = ClientSideConnection(self.client, self.process, use_unstable_protocol=True)
        capabilities = ClientCapabilities(  # elicitation: forms only (questions the kernel answers itself)
            fs=FileSystemCapabilities(read_text_file=True, write_text_file=True),
            terminal=True,
            elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()),
        )
        initialize = self._conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=capabilities,
            client_info=Implementation(name="loop-harness", version=VERSION),
        )
        outcome = await self._request(initialize, "initialize")
        if isinstance(outcome, Stop):
            return outcome
        self._init = outcome
        if outcome.protocol_version != PROTOCOL_VERSION:
            return Stop(
                Terminal.FAILED,
                {"kind": "protocol_version", "expected": PROTOCOL_VERSION, "got": outcome.protocol_version},
            )
        return None

    @property
    def supports_http_mcp(self) -> bool:
        """The agent said it can use MCP servers over HTTP (how the host tools are served)."""
        caps = self._init.agent_capabilities if self._init else None
        return bool(caps and caps.mcp_capabilities and caps.mcp_capabilities.http)

    async def new_session(self, cwd: Path, meta: dict[str, Any], mcp_servers: list[dict[str, Any]]) -> str | Stop:
        """Open a session (one per task); its id, or a Stop."""
        assert self._conn is not None
        await self.session_closed()  # the last task's session first
        request = self._conn.new_session(cwd=str(cwd), mcp_servers=mcp_servers, **meta)  # type: ignore[arg-type]
        outcome = await self._request(request, "session/new")
        if isinstance(outcome, Stop):
            return outcome
        self._open_session = outcome.session_id
        self.last_usage = None
        return outcome.session_id

    async def end_session(self, session_id: str) -> None:
        """A task's session is over: `session/close` it where the agent supports that (Claude's adapter
        keeps a child process per open session, so a queue would otherwise pile them up).

        The request goes out now and its answer is awaited by `session_closed()`: the kernel does the
        task's bookkeeping while the agent closes the session (every read of the worktree waits for it)."""
        if self._open_session != session_id or self.process is None or self.process.gone:
            return
        if not self._closes_sessions:
            self._open_session = None
            return
        self._closing = asyncio.ensure_future(self._close_open_session())
        await asyncio.sleep(0)  # its first step sends the request: it goes out before the bookkeeping

    @property
    def closing(self) -> bool:
        """A `session/close` is out and its answer has not come yet."""
        return self._closing is not None and not self._closing.done()

    async def session_closed(self) -> None:
        """The last `session/close` has been answered, or given up on (its own 2 s limit)."""
        closing, self._closing = self._closing, None
        if closing is not None:
            await closing

    async def prompt(
        self, session_id: str, text: str, *, cancel: Flag, interrupt: asyncio.Future[None] | None = None
    ) -> str | Stop | Interrupted:
        """One `session/prompt` round: the agent's stop reason, a Stop for a fault, deadline or cancel, or
        `Interrupted` when `interrupt` (a budget) was resolved and the turn was cancelled for it."""
        assert self._conn is not None and self.process is not None
        try:
            return await self._prompt(session_id, text, cancel, interrupt)
        finally:
            self.process.forget_prompts()  # anything the agent sends from now on is outside the turn

    async def _prompt(
        self, session_id: str, text: str, cancel: Flag, interrupt: asyncio.Future[None] | None
    ) -> str | Stop | Interrupted:
        assert self._conn is not None and self.process is not None
        prompt = asyncio.ensure_future(self._conn.prompt(session_id=session_id, prompt=[text_block(text)]))
        await asyncio.sleep(0)  # its first step sends the request: the agent starts while the wait is set up
        wake = (cancel.future(),) if interrupt is None else (cancel.future(), interrupt)
        await self._wait_or_exit(prompt, wake=wake, timeout=self.limits.turn_timeout_s)
        if prompt.done():
            return await self._outcome(prompt, "session/prompt", self._stop_reason)
        if self.process.exited.is_set():  # dead, with its stdout held open by a grandchild
            await _discard(prompt)
            return await self.failure()
        why = "user_cancel" if cancel.is_set() else "budget" if interrupt and interrupt.done() else "turn_timeout"
        agent_stop, killed = await self._cancel_turn(session_id, prompt)
        self.transcript.record(RecordType.TURN_CANCELLED, why=why, agent_stop_reason=agent_stop, killed=killed)
        detail = {"agent_stop_reason": agent_stop, "killed": killed}
        if why == "user_cancel":
            return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn", **detail})
        if why == "budget":
            return Interrupted(agent_stop, killed)
        return Stop(Terminal.FAILED, {"kind": "turn_timeout", "timeout_s": self.limits.turn_timeout_s, **detail})

    def _stop_reason(self, response: PromptResponse) -> str:
        # Token usage (and what the agent reports in _meta) goes on the record for the task.
        if response.usage is not None or response.field_meta:
            usage = response.usage.model_dump(by_alias=True, exclude_none=True) if response.usage else None
            self.transcript.record(RecordType.USAGE, usage=usage, meta=response.field_meta)
            if usage:
                self.last_usage = usage
        return str(response.stop_reason)

    async def failure(self) -> Stop:
        """The agent is gone: name the framing error, or the exit status and stderr tail."""
        process = self.process
        assert process is not None
        if process.failure is not None:
            return Stop(Terminal.FAILED, {**process.failure, "stderr_tail": process.stderr_tail()})
        status = await process.wait_exit(3.0)
        reason: dict[str, Any] = {"kind": "agent_exited", "exit_status": status, "stderr_tail": process.stderr_tail()}
        if process.beside is not None:  # bwrap's, where it differs from the agent's own
            reason["sandbox_exit_status"] = process.beside
        if status is None:
            reason["detail"] = "the agent closed stdout but kept running"
        return Stop(Terminal.FAILED, reason)

    async def close(self) -> None:
        """session/close where supported, close the connection, then stop the process group."""
        process = self.process
        await self.session_closed()
        if self._conn is not None and process is not None and not process.gone:
            await self._close_open_session()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        if process is not None:
            # The grace to exit once stdin closes: the config's cancel grace, never under 2 s.
            await process.stop(grace=max(2.0, self.limits.cancel_grace_s))

    # --- internals -----------------------------------------------------------------------------

    async def _request(self, awaitable: Awaitable[T], what: str) -> T | Stop:
        """A setup request (initialize, session/new) within init_timeout_s: its answer, or a Stop.

        Awaited in this task, not a task of its own waited on beside the agent's exit (that cost about 20 us a
        request, one a task): the exit cancels this task instead, and only while the request is awaited."""
        assert self.process is not None
        task = asyncio.current_task()
        assert task is not None
        exited = self.process.exited.future()
        waiting, gone = True, False

        def on_exit(_: asyncio.Future[None]) -> None:
            nonlocal gone
            if waiting:  # a callback scheduled just as the request ended finds nothing to cancel
                gone = True
                task.cancel()

        exited.add_done_callback(on_exit)
        try:
            try:
                async with asyncio.timeout(self.limits.init_timeout_s):
                    answer = await awaitable
            finally:  # from here on the exit cancels nothing: what follows awaits too
                waiting = False
                exited.remove_done_callback(on_exit)
        except asyncio.CancelledError:
            if not gone:
                raise  # someone else's cancel (the run's): not ours to turn into a Stop
            task.uncancel()
            return await self.failure()
        except TimeoutError:
            if self.process.exited.is_set():
                return await self.failure()
            return Stop(
                Terminal.FAILED, {"kind": "agent_timeout", "request": what, "timeout_s": self.limits.init_timeout_s}
            )
        except Exception as exc:
            return await self._error(exc, what)
        return answer

    async def _outcome(self, request: asyncio.Future[T], what: str, value: Callable[[T], R]) -> R | Stop:
        try:
            return value(request.result())
        except Exception as exc:
            return await self._error(exc, what)

    async def _error(self, exc: Exception, what: str) -> Stop:
        """A request that failed: the agent gone, its JSON-RPC error, or an answer the SDK could not read."""
        if isinstance(exc, ConnectionError):
            return await self.failure()
        if isinstance(exc, RequestError):
            return Stop(
                Terminal.FAILED,
                {"kind": "agent_error", "request": what, "code": exc.code, "message": str(exc), "data": exc.data},
            )
        if isinstance(exc, ValueError):  # the SDK's validation of a malformed answer
            return Stop(Terminal.FAILED, {"kind": "protocol_error", "request": what, "error": str(exc)[:500]})
        raise exc

    async def _wait_or_exit(
        self, future: asyncio.Future[Any], *, wake: Iterable[asyncio.Future[None]] = (), timeout: float
    ) -> None:
        """Wait for `future`, for any of `wake` (someone else's futures, left as they are), for the agent
        process to exit, or for `timeout`. Futures only: no task is started to wait."""
        assert self.process is not None
        waiting = {future, self.process.exited.future(), *wake}
        await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)

    async def _cancel_turn(self, session_id: str, prompt: asyncio.Future[Any]) -> tuple[str | None, bool]:
        """session/cancel, answer parked permissions `cancelled`, wait the grace, then kill the group."""
        assert self._conn is not None and self.process is not None
        self.client.cancel_pending()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.cancel(session_id=session_id), 1.0)
        done, _ = await asyncio.wait({prompt}, timeout=self.limits.cancel_grace_s)
        if done:
            try:
                return str(prompt.result().stop_reason), False
            except Exception as exc:  # an error after a cancel counts as cancelled
                return f"error: {type(exc).__name__}", False
        self.process.kill_group()
        await _discard(prompt)
        return None, True

    @property
    def _closes_sessions(self) -> bool:
        caps = self._init.agent_capabilities if self._init else None
        sessions = caps.session_capabilities if caps else None
        return sessions is not None and sessions.close is not None

    async def _close_open_session(self) -> None:
        """`session/close` where the agent supports it: some agents exit only then."""
        session_id, self._open_session = self._open_session, None
        if session_id is None or not self._closes_sessions:
            return
        assert self._conn is not None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):  # in this task: wait_for would start one per session
                await self._conn.close_session(session_id=session_id)


@dataclass(frozen=True)
class Interrupted:
    """A turn the kernel cancelled for a budget: what the agent answered the cancel with, or that it was killed."""

    agent_stop_reason: str | None
    killed: bool


async def _discard(future: asyncio.Future[Any]) -> None:
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await future
