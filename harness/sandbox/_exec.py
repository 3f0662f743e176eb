"""The client side of ACP `terminal/*`: commands the agent runs through the kernel.

Each terminal is a subprocess in its own process group with a bounded output
buffer that keeps the end (as the spec says for `outputByteLimit`). The
policy has already judged the command before `create` is called. All of a
session's terminals are released when its task ends, so a run never leaks
processes or pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._sandbox import Sandbox

__all__ = ["ExecHost", "TerminalGone"]

DEFAULT_OUTPUT_LIMIT = 1 << 20
MAX_OUTPUT_LIMIT = 8 << 20  # what an agent may ask to keep of a command's output, per terminal


class TerminalGone(KeyError):
    """No live terminal has that id (never created, or released)."""


@dataclass
class _Terminal:
    session_id: str
    process: asyncio.subprocess.Process
    limit: int
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.read(64 << 10):
            self.output += chunk
            if len(self.output) > self.limit:
                del self.output[: len(self.output) - self.limit]
                self.truncated = True

    def text(self) -> str:
        # Cut at a character boundary: drop a partial UTF-8 sequence at the start.
        return bytes(self.output).decode("utf-8", errors="ignore")

    def exit_status(self) -> dict[str, Any] | None:
        code = self.process.returncode
        if code is None:
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:  # real-time signals have no name
                name = f"SIG{-code}"
            return {"exitCode": None, "signal": name}
        return {"exitCode": code, "signal": None}


class ExecHost:
    def __init__(self, base_env: Mapping[str, str], *, max_terminals: int = 16, sandbox: Sandbox | None = None) -> None:
        self._base_env = dict(base_env)
        self._sandbox = sandbox  # every command starts inside it
        self._terminals: dict[str, _Terminal] = {}
        self._ids = itertools.count(1)
        self._max = max_terminals

    def __len__(self) -> int:
        return len(self._terminals)

    async def create(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        output_byte_limit: int | None = None,
    ) -> str:
        live = sum(1 for t in self._terminals.values() if t.session_id == session_id)
        if live >= self._max:
            raise RuntimeError(f"too many open terminals in this session (limit {self._max})")
        run_env = {**self._base_env, **(env or {})}
        fds: tuple[int, ...] = ()
        if self._sandbox is not None:
            argv, run_env, fds = self._sandbox.wrap(argv, cwd=cwd, env=run_env)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=cwd if self._sandbox is None else "/",  # the sandbox changes to it inside (it may be only there)
                env=run_env,
                start_new_session=True,
                pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        limit = min(output_byte_limit or DEFAULT_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT)  # the agent's ask, capped
        terminal = _Terminal(session_id, process, limit)
        terminal.reader = asyncio.create_task(terminal.read(), name="terminal-output")
        terminal_id = f"term_{next(self._ids)}"
        self._terminals[terminal_id] = terminal
        return terminal_id

    def session_of(self, terminal_id: str) -> str:
        """The session that created a live terminal (TerminalGone if there is none)."""
        return self._get(terminal_id).session_id

    def output(self, terminal_id: str) -> dict[str, Any]:
        terminal = self._get(terminal_id)
        return {"output": terminal.text(), "truncated": terminal.truncated, "exitStatus": terminal.exit_status()}

    async def wait_for_exit(self, terminal_id: str) -> dict[str, Any]:
        terminal = self._get(terminal_id)
        # The command's exit, not its pipe's EOF: a backgrounded child (`server &`) may hold the pipe.
        while terminal.process.returncode is None:
            await asyncio.sleep(0.01)
        if terminal.reader is not None:  # collect what was written, briefly
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(terminal.reader), 0.5)
        status = terminal.exit_status()
        assert status is not None
        return status

    def kill(self, terminal_id: str) -> None:
        _kill_group(self._get(terminal_id).process)

    async def release(self, terminal_id: str) -> None:
        terminal = self._terminals.pop(terminal_id, None)
        if terminal is None:
            raise TerminalGone(terminal_id)
        await _reap(terminal)

    async def release_session(self, session_id: str) -> int:
        """Kill and forget every terminal of a session; returns how many were still open."""
        ids = [i for i, t in self._terminals.items() if t.session_id == session_id]
        for terminal_id in ids:
            await _reap(self._terminals.pop(terminal_id))
        return len(ids)

    async def release_all(self) -> None:
        for terminal_id in list(self._terminals):
            await _reap(self._terminals.pop(terminal_id))

    def _get(self, terminal_id: str) -> _Terminal:
        try:
            return self._terminals[terminal_id]
        except KeyError:
            raise TerminalGone(terminal_id) from None


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _reap(terminal: _Terminal) -> None:
    _kill_group(terminal.process)  # also ends grandchildren that outlived the command
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(terminal.process.wait(), 5.0)
    if terminal.reader is not None:
        # Read to EOF so the pipe closes now, not when the event loop is gone (bounded).
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(terminal.reader), 5.0)
        terminal.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await terminal.reader
