"""The agent subprocess and the JSON-RPC framing on its stdio.

`AgentProcess` is an `acp` message transport (send / receive / close) over a
process the kernel started itself, so the kernel owns what the SDK's
`spawn_agent_process` gets wrong for unattended use:

* stderr is drained into a bounded ring buffer (an unread pipe deadlocks
  after ~64 KiB); its tail goes into a crashed agent's terminal reason;
* every stdout line must be one JSON-RPC 2.0 object: anything else is a
  framing error that ends the connection at once (the SDK would log it and
  read on, and text without a newline would hang the next request);
* lines of any size up to `max_line` are read (20 MB lines are legal);
* the agent runs in its own process group, so stopping it ends grandchildren too;
* it gets a trimmed environment plus what the config passes;
* inside the OS sandbox it keeps the same contract (`spawn_in`): only the agent holds its stdout, signals go
  to its own process group, and its exit status is its own, not bwrap's (beside it in `agent_exit`).

Every frame in both directions is written to the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from .._flag import Flag
from ..record._records import RecordType
from ..record._recovery import end_processes
from ..record._transcript import Transcript, compact_json
from ..sandbox._sandbox import Sandbox
from ..sandbox._status import SandboxStatus

__all__ = ["ARRIVAL", "AgentProcess", "agent_environment"]

#: The session whose `session/prompt` was unanswered when the message being handled arrived, in
#: wire order. The SDK handles each incoming message in a task of its own, created right after
#: `receive()` returns it, and a task starts with a copy of the context it was created in: so a
#: handler sees the turn as it stood when its message arrived, not when the handler gets to run.
#: A call that arrives after the agent's answer to the prompt is therefore outside the turn.
ARRIVAL: ContextVar[str | None] = ContextVar("loop_harness_arrival", default=None)

_INHERITED_ENV = ("HOME", "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR",
                  "XDG_CACHE_HOME")  # fmt: skip
# The control server's bearer token: whoever holds it controls the server, so no agent ever gets it.
_NEVER_INHERITED = frozenset({"LOOP_HARNESS_SERVER_TOKEN"})
# Where pinned models live and how to reach them: the inference agent resolves its model with these.
_INHERITED_PREFIXES = ("LOOP_HARNESS_", "HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HOME")


def agent_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment an agent gets: a few basics from ours, plus what the config says, plus a git that
    never takes a directory for a bare repository of its own (see `pin_git`)."""
    env = {k: v for k, v in os.environ.items()
           if (k in _INHERITED_ENV or k.startswith(_INHERITED_PREFIXES)) and k not in _NEVER_INHERITED}  # fmt: skip
    env.update(extra or {})
    return pin_git(env)


def pin_git(env: dict[str, str]) -> dict[str, str]:
    """`safe.bareRepository=explicit` for every git run with this environment (git >= 2.38; older gits
    ignore it): git then finds no repository in a directory that merely looks like a bare one (`HEAD`,
    `objects/`, `refs/` and a `config` an agent wrote), so it never runs that config's programs. The
    setting goes through `GIT_CONFIG_COUNT`, after any the environment already has."""
    count = env.get("GIT_CONFIG_COUNT", "0")
    index = int(count) if count.isascii() and count.isdigit() else 0
    env.update({f"GIT_CONFIG_KEY_{index}": "safe.bareRepository", f"GIT_CONFIG_VALUE_{index}": "explicit",
                "GIT_CONFIG_COUNT": str(index + 1)})  # fmt: skip
    return env


class AgentProcess:
    """One agent subprocess speaking newline-delimited JSON-RPC on stdio."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        transcript: Transcript,
        *,
        max_line: int = 64 << 20,
        stderr_keep: int = 64 << 10,
        token: str = "",
        stdio: tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.ReadTransport] | None = None,
        sandbox: SandboxStatus | None = None,
    ) -> None:
        self.process = process
        # the agent's stdin and stdout: the subprocess's pipes, or (in the sandbox) pipes of the kernel's own
        self.stdin, self.stdout = (process.stdin, process.stdout) if stdio is None else stdio[:2]
        self._stdout_pipe = None if stdio is None else stdio[2]
        self.sandbox = sandbox  # where to signal the agent inside its sandbox, and its own exit status
        self.transcript = transcript
        self.token = token
        self.started = time.time()
        self.failure: dict[str, Any] | None = None  # set when the agent breaks framing
        self.disconnected = asyncio.Event()  # stdout ended: EOF or framing error
        self.stderr_bytes = 0
        self._max_line = max_line
        self._stderr = bytearray()
        self._stderr_keep = stderr_keep
        self._prompts: dict[Any, str] = {}  # unanswered session/prompt request ids -> their session
        self.exited = Flag()  # the process itself has exited (its pipes may live on)
        self.killed = False  # its group was sent a signal: it may not have exited yet, but it is done for
        self._stderr_task = asyncio.create_task(self._drain_stderr(), name="agent-stderr")
        self._exit_task = asyncio.create_task(self._watch_exit(), name="agent-exit")

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        transcript: Transcript,
        token: str = "",
        pass_fds: Sequence[int] = (),
    ) -> AgentProcess:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            limit=1 << 20,
            pass_fds=pass_fds,
        )
        transcript.record(RecordType.AGENT_START, pid=process.pid, argv=list(argv))
        return cls(process, transcript, token=token)

    @classmethod
    async def spawn_in(
        cls, sandbox: Sandbox, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], transcript: Transcript,
        token: str = "",
    ) -> AgentProcess:  # fmt: skip
        """The agent inside `sandbox`, on pipes the kernel made itself and only the agent holds the other end of:
        bwrap, its init and the bridge get /dev/null, so a stdout the agent closes is an EOF at once."""
        stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
        stdout_read, stdout_write = os.pipe2(os.O_CLOEXEC)
        ours = (stdin_write, stdout_read)
        status: SandboxStatus | None = None
        try:
            wrapped, inside, fds, status = sandbox.wrap_agent(argv, cwd=cwd, env=env, stdin=stdin_read,
                                                              stdout=stdout_write)  # fmt: skip
            try:
                process = await asyncio.create_subprocess_exec(
                    *wrapped, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE, cwd=cwd, env=inside, start_new_session=True, pass_fds=fds,
                )  # fmt: skip
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            for fd in (*ours, *(() if status else (stdin_read, stdout_write))):
                os.close(fd)
            if status is not None:
                status.close()
            raise
        transcript.record(RecordType.AGENT_START, pid=process.pid, argv=list(wrapped))
        return cls(process, transcript, token=token, stdio=await _streams(stdin_write, stdout_read), sandbox=status)

    @property
    def pid(self) -> int:
        return self.process.pid

    # --- acp.Transport -------------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        data = compact_json(message)
        stdin = self.stdin
        if stdin is None or stdin.is_closing():
            if "method" not in message:  # an answer the agent is no longer there to read: nothing is lost
                self.transcript.record(RecordType.RPC_UNDELIVERED, msg=message)
                return
            raise ConnectionError("agent stdin is closed")
        if message.get("method") == "session/prompt":
            self._prompts[message.get("id")] = str((message.get("params") or {}).get("sessionId"))
        self.transcript.record_rpc("out", message, data)
        try:
            stdin.write(data + b"\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            if "method" not in message:
                return  # the agent died before reading our answer: recorded above, nothing more to do
            raise ConnectionError(f"agent stdin is closed ({exc})") from None

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None at EOF or after a framing error (the SDK then disconnects)."""
        while not self.disconnected.is_set():
            line = await self._read_line()
            if line is None:
                self.disconnected.set()
                return None
            if line.isspace():  # a blank line between messages (no copy of the line to find out)
                continue
            parsed = self._parse(line)
            if parsed is None:
                self.disconnected.set()
                return None
            self.transcript.record_rpc("in", parsed, line)
            if "method" not in parsed:
                self._prompts.pop(parsed.get("id"), None)  # a prompt's answer ends its turn here
            ARRIVAL.set(next(iter(self._prompts.values()), None))
            return parsed
        return None

    def forget_prompts(self) -> None:
        """The kernel gave up on its prompt (cancel, timeout): whatever arrives now is outside a turn."""
        self._prompts.clear()

    async def close(self) -> None:
        stdin = self.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    # --- framing -------------------------------------------------------------------------------

    async def _read_line(self) -> bytes | None:
        stdout = self.stdout
        assert stdout is not None
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = await stdout.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                chunk = await stdout.readexactly(exc.consumed)
                size += len(chunk)
                chunks.append(chunk)
                if size > self._max_line:
                    self._fail(f"a line longer than {self._max_line} bytes", b"".join(chunks[:1]))
                    return None
                continue
            except asyncio.IncompleteReadError as exc:
                if not chunks and not exc.partial:
                    return None  # clean EOF
                chunks.append(exc.partial)  # a last frame without its newline
                return b"".join(chunks)
            except (ConnectionResetError, BrokenPipeError):
                return None
            chunks.append(chunk)
            return b"".join(chunks)

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        """The message, or None after a framing error."""
        try:
            text = line.decode("utf-8")  # strictly: json.loads(bytes) would also take UTF-16 and lone surrogates
            message = json.loads(text)
        except ValueError as exc:
            self._fail(f"stdout line is not JSON ({exc})", line)
            return None
        except RecursionError:
            self._fail("stdout line is JSON nested too deeply to read", line)
            return None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._fail("stdout line is not a JSON-RPC 2.0 object", line)
            return None
        if "method" not in message and "id" not in message:
            self._fail("JSON-RPC object has neither a method nor an id", line)
            return None
        if "method" in message and not (isinstance(message["method"], str) and message["method"]):
            # JSON-RPC wants a method name; a `"method": null` would be an answer to the SDK and a request
            # to anyone reading `"method" in message`: one message, two readings, is no message at all
            self._fail("JSON-RPC method is not a name", line)
            return None
        return message

    def _fail(self, error: str, line: bytes) -> None:
        head = line[:200].decode("utf-8", errors="replace")
        self.failure = {"kind": "framing_error", "error": error, "line_head": head, "line_bytes": len(line)}
        self.transcript.record(RecordType.FRAMING_ERROR, error=error, line_head=head, line_bytes=len(line))

    # --- stderr and exit -----------------------------------------------------------------------

    async def _drain_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while chunk := await stderr.read(64 << 10):
                self.stderr_bytes += len(chunk)
                self._stderr += chunk
                if len(self._stderr) > self._stderr_keep:
                    del self._stderr[: len(self._stderr) - self._stderr_keep]

    async def _watch_exit(self) -> None:
        # Poll returncode: in Python 3.11 Process.wait() also waits for the pipes, which a
        # grandchild that inherited them can hold open long after the agent died.
        while self.process.returncode is None:
            if self.sandbox is not None and self.sandbox.init_pid is None:
                self.sandbox.poll()  # the sandbox's init, held by pidfd while it surely lives
            await asyncio.sleep(0.05)
        self.exited.set()

    async def _drain_stdout(self) -> None:
        stdout = self.stdout
        assert stdout is not None
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while await stdout.read(64 << 10):
                pass

    def stderr_tail(self, limit: int = 2000) -> str:
        return bytes(self._stderr[-limit:]).decode("utf-8", errors="replace")

    async def wait_exit(self, timeout: float) -> int | None:
        """The agent's own exit status once the process (in the sandbox: bwrap) has exited, or None if it is still
        running."""
        loop = asyncio.get_running_loop()  # poll returncode, as _watch_exit does
        deadline = loop.time() + timeout
        while self.process.returncode is None and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self.process.returncode is not None:
            # Give the stderr drain a moment to collect the last words.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stderr_task), 0.5)
        return self.status

    @property
    def status(self) -> int | None:
        """The agent's own exit status (-N: signal N), None while it runs; in the sandbox not bwrap's but what
        the bridge reported of the agent (`harness/sandbox/_status.py`)."""
        code = self.process.returncode
        if self.sandbox is None or code is None:
            return code
        return self.sandbox.agent_status(code)

    @property
    def beside(self) -> int | None:
        """bwrap's own exit status, where it says something other than the agent's (None outside the sandbox)."""
        code = self.process.returncode
        return None if self.sandbox is None or code is None or code == self.status else code

    @property
    def gone(self) -> bool:
        """Nothing more can be asked of it: stdout ended, it exited, or it was killed."""
        return self.disconnected.is_set() or self.exited.is_set() or self.killed

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the agent's process group. In the sandbox that is the group of bwrap's init, which the agent
        is in, so its handler runs (to bwrap, a SIGTERM would end the sandbox and the agent with SIGKILL);
        SIGKILL, the last step, goes to bwrap's too, which ends the whole sandbox. Before bwrap's init has a
        group (the sandbox is being set up) every signal goes to bwrap."""
        self.killed = True
        inside = self.sandbox is not None and self.process.returncode is None and self.sandbox.signal(sig)
        if inside and sig != signal.SIGKILL:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def stop(self, grace: float = 2.0) -> int | None:
        """Close stdin, wait, SIGTERM the group, wait, SIGKILL the group."""
        signalled_before = self.killed  # a cancel or a budget already ended it: its exit says nothing of EOF
        await self.close()
        status = await self.wait_exit(grace)
        on_eof = status is not None and not signalled_before
        if status is None:
            self.kill_group(signal.SIGTERM)
            status = await self.wait_exit(2.0)
        self.kill_group(signal.SIGKILL)  # grandchildren too, even when the leader exited
        ended = end_processes(self.token, since=self.started) if self.token else []  # and those that left the group
        if status is None:
            status = await self.wait_exit(5.0)
        # Read stdout and stderr to EOF so their pipes close while the loop still runs (bounded:
        # only a grandchild that left our process group could hold them open now).
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(self._drain_stdout(), asyncio.shield(self._stderr_task)), 5.0)
        for task in (self._stderr_task, self._exit_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._stdout_pipe is not None:  # ours, not the subprocess's: closed here, at EOF or not
            self._stdout_pipe.close()
        left: dict[str, Any] = {"processes_ended": ended} if ended else {}
        if self.beside is not None:  # bwrap's, where it differs from the agent's own
            left["sandbox_status"] = self.beside
        if self.sandbox is not None:
            self.sandbox.close()
        self.transcript.record(RecordType.AGENT_EXIT, pid=self.pid, status=status, stderr_bytes=self.stderr_bytes,
                               on_eof=on_eof, grace_s=grace, **left)  # fmt: skip
        return status


async def _streams(stdin: int, stdout: int) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.ReadTransport]:
    """asyncio streams over the kernel's ends of the agent's pipes, as `create_subprocess_exec` makes them."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
    # each transport owns its file (and closes it with itself): no `with` could
    source, sink = os.fdopen(stdout, "rb", buffering=0), os.fdopen(stdin, "wb", buffering=0)
    read_pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), source)
    write_pipe, protocol = await loop.connect_write_pipe(lambda: asyncio.streams.FlowControlMixin(loop), sink)
    return asyncio.StreamWriter(write_pipe, protocol, None, loop), reader, read_pipe
