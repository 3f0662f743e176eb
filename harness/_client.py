"""The kernel's side of ACP: every request the agent makes passes the policy here.

`KernelClient` answers `session/request_permission` from the policy (or hands
it, untouched, to an interactive handler when the rule list is empty), and
serves `fs/*` and `terminal/*` under the same policy, so a cooperating agent
cannot reach a file or command its permission request could not. Each
decision is recorded in the transcript with its rule ids, and a refusal is
remembered on the turn: the kernel ends the run `BlockedPolicy` after it.

`session_update` never awaits, so updates are counted in wire order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import shutil
import stat
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import RequestError
from acp.schema import (
    AllowedOutcome,
    CreateTerminalResponse,
    DeniedOutcome,
    EnvVariable,
    KillTerminalResponse,
    PermissionOption,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    ToolCallStart,
    ToolCallUpdate,
    UsageUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

from ._config import HOST_SERVER_NAME
from ._exec import ExecHost, TerminalGone
from ._policy import Policy, Verdict
from ._transcript import Transcript

__all__ = ["POLICY_REFUSED", "InteractiveHandler", "KernelClient", "TurnState"]

#: JSON-RPC error code the kernel answers a refused `fs/*` or `terminal/*` request with.
POLICY_REFUSED = -32010

#: Given the raw `session/request_permission` params; returns the raw `outcome` object.
InteractiveHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]] | dict[str, Any]]

# The only variables an agent may set for a command: anything else can change what an allowed
# command runs (LD_PRELOAD, PATH, HOME -> a .gitconfig with core.fsmonitor, BASH_FUNC_git%%, ...).
# CLAUDECODE=1 is the marker claude-code-acp sets on every command it runs.
_SAFE_ENV = re.compile(r"^(LANG|LANGUAGE|LC_[A-Z_]+|TERM|NO_COLOR|FORCE_COLOR|CI|COLUMNS|LINES|TZ|CLAUDECODE)$")
_SHELL = shutil.which("bash") or "/bin/sh"
#: A command with no args that holds any of these is a shell script, not a program's name.
_SCRIPT_CHARS = frozenset(" \t\n;&|<>()'\"")
_HOST_TOOL_TITLE = re.compile(rf"mcp__{re.escape(HOST_SERVER_NAME)}__([a-z_]+)")
MAX_READ_BYTES = 8 << 20
SMALL_FILE_BYTES = 256 << 10  # read or written on the event loop; bigger files go to a worker thread


@dataclass
class TurnState:
    """What happened during one prompt turn."""

    tool_calls: int = 0  # tool_call updates, of any kind
    client_calls: int = 0  # fs/* and terminal/create requests
    refusals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def acted(self) -> bool:
        return self.tool_calls + self.client_calls > 0


class KernelClient:
    def __init__(
        self,
        *,
        policy: Policy,
        transcript: Transcript,
        exec_host: ExecHost,
        interactive_handler: InteractiveHandler | None = None,
    ) -> None:
        self.policy = policy
        self.transcript = transcript
        self.exec_host = exec_host
        self.interactive_handler = interactive_handler
        self.turn = TurnState()
        self.rule_ids: list[str] = []  # rule ids used in the current task, first use first
        self.host_tools: frozenset[str] = frozenset()
        self.context_usage: dict[str, Any] | None = None  # the task's last usage_update (context tokens)
        self.cancelling = False
        self.session_id: str | None = None  # requests for other sessions, or between turns, are refused
        self.in_turn = False
        self._parked: set[asyncio.Future[dict[str, Any]]] = set()

    def on_connect(self, conn: Any) -> None:
        return None

    def begin_task(self, host_tools: frozenset[str] = frozenset()) -> None:
        """A task starts; `host_tools` are the kernel's own MCP tools its role lets the agent call."""
        self.rule_ids = []
        self.host_tools = host_tools
        self.context_usage = None

    def begin_turn(self, session_id: str) -> TurnState:
        self.turn = TurnState()
        self.cancelling = False
        self.session_id = session_id
        self.in_turn = True
        self.policy.forget_approvals()
        return self.turn

    def end_turn(self) -> None:
        self.in_turn = False

    def cancel_pending(self) -> int:
        """Answer every parked permission request `cancelled` (the spec's rule on cancel)."""
        self.cancelling = True
        parked = [f for f in self._parked if not f.done()]
        for future in parked:
            future.set_result({"outcome": "cancelled"})
        return len(parked)

    # --- session/update -----------------------------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, ToolCallStart):  # any kind, `think` included: the design counts tool calls
            self.turn.tool_calls += 1
        elif isinstance(update, UsageUpdate):
            self.context_usage = {"used": update.used, "size": update.size}

    # --- session/request_permission ------------------------------------------------------------

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        raw_call = tool_call.model_dump(mode="json", by_alias=True, exclude_none=True)
        if self.cancelling:
            self._record("session/request_permission", raw_call, None, outcome="cancelled")
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if self.policy.interactive:
            return await self._ask_interactive(session_id, raw_call, options, kwargs)
        verdict = self._host_tool_verdict(raw_call) or self.policy.judge_tool_call(raw_call)
        if verdict.allowed:
            option = _pick(options, ("allow_once",))
            if option is None:  # never allow_always: an agent may persist it as its own rule
                verdict = Verdict(False, (), {"kind": "no_allow_once_option", "allowed_by": list(verdict.rule_ids)})
        if not verdict.allowed:
            self._refused("session/request_permission", verdict, raw_call)
            option = _pick(options, ("reject_once", "reject_always"))
            if option is None:
                return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
            return _selected(option)
        self._record("session/request_permission", raw_call, verdict, outcome=option.option_id)
        return _selected(option)

    def _host_tool_verdict(self, raw_call: Mapping[str, Any]) -> Verdict | None:
        """A request to call one of the kernel's own host tools (Claude titles an MCP tool
        `mcp__<server>__<tool>`, kind `other`): the role's allowlist already decided it."""
        match = _HOST_TOOL_TITLE.fullmatch(str(raw_call.get("title") or ""))
        if match is None or raw_call.get("kind") not in (None, "other") or match[1] not in self.host_tools:
            return None
        return Verdict(True, ("builtin:host-tool",), {"kind": "host_tool", "tool": match[1]})

    async def _ask_interactive(
        self, session_id: str, raw_call: dict[str, Any], options: list[PermissionOption], meta: dict[str, Any]
    ) -> RequestPermissionResponse:
        params: dict[str, Any] = {
            "sessionId": session_id,
            "toolCall": raw_call,
            "options": [o.model_dump(mode="json", by_alias=True, exclude_none=True) for o in options],
        }
        if meta:
            params["_meta"] = meta
        if self.interactive_handler is None:
            outcome: dict[str, Any] = {"outcome": "cancelled"}
        else:
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._parked.add(future)
            answer = asyncio.ensure_future(_maybe_await(self.interactive_handler(params)))
            answer.add_done_callback(lambda t: _settle(future, t))
            try:
                outcome = await future
            finally:
                self._parked.discard(future)
                if not answer.done():
                    answer.cancel()
        chosen = next((o for o in options if o.option_id == outcome.get("optionId")), None)
        if outcome.get("outcome") == "selected" and chosen is not None and chosen.kind.startswith("allow"):
            self.policy.approve(raw_call)  # fs/* and terminal/* may now reach what the person allowed
        self.transcript.record(
            "policy",
            source="session/request_permission",
            decision="interactive",
            rule_ids=[],
            outcome=outcome,
            tool_call_id=raw_call.get("toolCallId"),
        )
        return RequestPermissionResponse.model_validate({"outcome": outcome})

    # --- fs/* --------------------------------------------------------------------------------

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        self._in_this_turn("fs/read_text_file", session_id, {"path": path})
        self.turn.client_calls += 1
        verdict = self._enforce("fs/read_text_file", self.policy.judge_read(path), {"path": path})
        real = self.policy.worktree / verdict.paths[0]  # the file that was judged, not a second resolution
        try:
            small = real.stat().st_size <= SMALL_FILE_BYTES  # stat never blocks, even on a FIFO
            text = _read_regular_file(real) if small else await asyncio.to_thread(_read_regular_file, real)
        except FileNotFoundError:
            raise RequestError.resource_not_found(path) from None
        except OSError as exc:
            raise RequestError.internal_error({"path": path, "error": exc.strerror or str(exc)}) from None
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start : start + limit if limit is not None else None])
        self._record("fs/read_text_file", {"path": path}, verdict)
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        self._in_this_turn("fs/write_text_file", session_id, {"path": path})
        self.turn.client_calls += 1
        verdict = self._enforce("fs/write_text_file", self.policy.judge_write(path), {"path": path})
        relative = verdict.paths[0]
        try:
            if len(content) <= SMALL_FILE_BYTES:
                _write_regular_file(self.policy.worktree, relative, content)
            else:
                await asyncio.to_thread(_write_regular_file, self.policy.worktree, relative, content)
        except OSError as exc:
            raise RequestError.internal_error({"path": path, "error": exc.strerror or str(exc)}) from None
        self._record("fs/write_text_file", {"path": path, "bytes": len(content)}, verdict)
        return WriteTextFileResponse()

    # --- terminal/* --------------------------------------------------------------------------

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[EnvVariable] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        target = {"command": command, "args": args or [], "cwd": cwd}
        self._in_this_turn("terminal/create", session_id, target)
        self.turn.client_calls += 1
        # No args and a command like "git status && git log": a script for the shell, as editors run it
        # (claude-code-acp 0.16 sends its Bash tool's command this way). It is judged as the script it is,
        # command by command, exactly as the permission request that preceded it was.
        script = not args and isinstance(command, str) and not _SCRIPT_CHARS.isdisjoint(command)
        argv = [_SHELL, "-c", command] if script else [command, *(args or [])]
        variables = {v.name: v.value for v in env or ()}
        unsafe = sorted(name for name in variables if not _SAFE_ENV.match(name))
        verdict = (
            Verdict(False, (), {"kind": "unsafe_env", "names": unsafe})
            if unsafe
            else self.policy.judge_execute(command, None if script else args or [], cwd=cwd)
        )
        self._enforce("terminal/create", verdict, target)
        relative = self.policy.resolve(cwd) if cwd else "."
        workdir = self.policy.worktree / (relative or ".")
        try:
            terminal_id = await self.exec_host.create(
                session_id,
                argv,
                cwd=str(workdir),
                env=variables,
                output_byte_limit=output_byte_limit,
            )
        except (OSError, RuntimeError) as exc:
            raise RequestError.internal_error({"command": command, "error": str(exc)}) from None
        self._record("terminal/create", {**target, "terminalId": terminal_id}, verdict)
        return CreateTerminalResponse(terminal_id=terminal_id)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        with _terminal_errors(terminal_id):
            out = self.exec_host.output(terminal_id)
        status = out["exitStatus"]
        return TerminalOutputResponse(
            output=out["output"],
            truncated=out["truncated"],
            exit_status=TerminalExitStatus(exit_code=status["exitCode"], signal=status["signal"]) if status else None,
        )

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        with _terminal_errors(terminal_id):
            status = await self.exec_host.wait_for_exit(terminal_id)
        return WaitForTerminalExitResponse(exit_code=status["exitCode"], signal=status["signal"])

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> KillTerminalResponse | None:
        with _terminal_errors(terminal_id):
            self.exec_host.kill(terminal_id)
        return KillTerminalResponse()

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse | None:
        with _terminal_errors(terminal_id):
            await self.exec_host.release(terminal_id)
        return ReleaseTerminalResponse()

    # --- methods we do not offer: say so, never answer null ------------------------------------

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("elicitation/create")

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        return None

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    # --- helpers -------------------------------------------------------------------------------

    def _in_this_turn(self, source: str, session_id: str, target: Mapping[str, Any]) -> None:
        """fs/* and terminal/* only for the session whose turn is running: nothing late, nothing stray."""
        if self.in_turn and session_id == self.session_id:
            return
        why = "outside_turn" if session_id == self.session_id else "unknown_session"
        verdict = Verdict(False, (), {"kind": why, "session": session_id})
        self._record(source, target, verdict, outcome="refused")
        raise RequestError(POLICY_REFUSED, "Refused: no turn of this session is running", dict(verdict.reason))

    def _enforce(self, source: str, verdict: Verdict, target: Mapping[str, Any]) -> Verdict:
        if not verdict.allowed:
            self._refused(source, verdict, target)
            raise RequestError(POLICY_REFUSED, "Refused by the workspace policy", dict(verdict.reason))
        return verdict

    def _refused(self, source: str, verdict: Verdict, target: Mapping[str, Any]) -> None:
        refusal = {
            "kind": "policy_refusal",
            "source": source,
            "rule_id": verdict.rule_ids[0] if verdict.rule_ids else None,
            "refusal": dict(verdict.reason),
            **_describe(target),
        }
        self.turn.refusals.append(refusal)
        self._record(source, target, verdict, outcome="refused")

    def _record(
        self, source: str, target: Mapping[str, Any], verdict: Verdict | None, *, outcome: str | None = None
    ) -> None:
        if verdict is not None:  # the rule that decided, allow or deny (the design: every auto-resolved request)
            for rule_id in verdict.rule_ids:
                if rule_id not in self.rule_ids:
                    self.rule_ids.append(rule_id)
        self.transcript.record(
            "policy",
            source=source,
            decision="allow" if verdict is not None and verdict.allowed else "refuse",
            rule_ids=list(verdict.rule_ids) if verdict else [],
            reason=dict(verdict.reason) if verdict else {"kind": "cancelled"},
            outcome=outcome,
            **_describe(target),
        )


def _describe(target: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields that say what a request was about (not its whole payload)."""
    renamed = {"title": "tool", "kind": "tool_kind"}  # `kind` is the reason's own key
    keys = ("toolCallId", "title", "kind", "path", "command", "args", "cwd", "terminalId", "bytes")
    return {renamed.get(k, k): target[k] for k in keys if k in target and target[k] is not None}


def _pick(options: list[PermissionOption], kinds: tuple[str, ...]) -> PermissionOption | None:
    for kind in kinds:
        for option in options:
            if option.kind == kind:
                return option
    return None


def _selected(option: PermissionOption) -> RequestPermissionResponse:
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))


async def _maybe_await(value: Awaitable[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    return await value if inspect.isawaitable(value) else value


def _settle(future: asyncio.Future[dict[str, Any]], task: asyncio.Future[dict[str, Any]]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.set_result({"outcome": "cancelled"})
    elif task.exception() is not None:
        future.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        future.set_result(task.result())


def _read_regular_file(path: Path) -> str:
    """Read a regular file (never a FIFO or device, which could block forever), within a size cap."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise OSError(f"{path.name} is larger than {MAX_READ_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _write_regular_file(worktree: Path, relative: str, content: str) -> None:
    """Write the judged path without following a symlink swapped in at its last component."""
    target = worktree / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(target, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{relative} is not a regular file")
        f.write(content)


@contextlib.contextmanager
def _terminal_errors(terminal_id: str) -> Iterator[None]:
    """Map an unknown terminal id to invalid params instead of an internal error."""
    try:
        yield
    except TerminalGone:
        raise RequestError.invalid_params({"terminalId": terminal_id, "error": "no such terminal"}) from None
