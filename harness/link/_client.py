"""The kernel's side of ACP: every request the agent makes is decided by the policy, then applied here.

`KernelClient` asks the `Policy` about each `session/request_permission`, `fs/*` and
`terminal/*` request, giving it the `Turn` as it stood when the request arrived (wire order, from
the transport), and applies the verdict: the option it names, the file it resolved, the argv it
allows. On the interactive path (an empty rule list) a person answers permission requests, and
what they allow becomes this turn's approvals. Each decision is recorded in the transcript with
its rule ids; a refusal is remembered on the turn and on the run, and the kernel ends the run
`BlockedPolicy` after it, wherever it happened.

A stop latches (issue 30): once a stop is decided for the turn (a budget or stall rule trips, a policy
refusal that ends the run, the turn's `session/cancel` goes out), the request that tripped it and every later
permission, `fs/*`, `terminal/create` and elicitation request is answered `cancelled` or refused, never
served, and each is on record as a `policy` refusal whose reason (kind `stopped`) names the stop.

`session_update` never awaits, so updates are counted in wire order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from acp import RequestError
from acp.schema import (
    AcceptElicitationResponse,
    AllowedOutcome,
    CancelElicitationResponse,
    CreateElicitationResponse,
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

from ..budget._questions import form_fields
from ..budget._watch import TaskWatch
from ..policy._policy import Policy, Turn, Verdict
from ..record._records import RecordType
from ..record._terminals import Stop
from ..record._transcript import Transcript
from ..sandbox._exec import ExecHost, TerminalGone
from ..sandbox._files import read_beneath, write_beneath
from ..sandbox._overlay import WorktreeOverlay
from ._transport import ARRIVAL

__all__ = ["POLICY_REFUSED", "InteractiveHandler", "KernelClient", "TurnState"]

#: JSON-RPC error code the kernel answers a refused `fs/*` or `terminal/*` request with.
POLICY_REFUSED = -32010

#: Given the raw `session/request_permission` params; returns the raw `outcome` object.
InteractiveHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]] | dict[str, Any]]

SMALL_FILE_BYTES = 256 << 10  # read or written on the event loop; bigger files go to a worker thread


@dataclass
class TurnState:
    """What happened during one prompt turn."""

    tool_calls: int = 0  # tool_call updates, of any kind
    client_calls: int = 0  # fs/* and terminal/create requests


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
        self.refusals: list[dict[str, Any]] = []  # every refusal of the run, in or out of a turn
        self.rule_ids: list[str] = []  # rule ids used in the current task, first use first
        self.host_tools: frozenset[str] = frozenset()
        self.context_usage: dict[str, Any] | None = None  # the task's last usage_update (context tokens)
        self.cancelling = False
        self.sessions: set[str] = set()  # every session this run opened
        self.approvals: frozenset[tuple[str, str]] = frozenset()  # interactive path: this turn's
        self.watch: TaskWatch | None = None  # the task's budgets (None: a single-prompt run)
        self.overlay: WorktreeOverlay | None = None  # the sandbox's copy-on-write worktree, when it has one
        self._parked: set[asyncio.Future[dict[str, Any]]] = set()

    def on_connect(self, conn: Any) -> None:
        return None

    def begin_task(self, host_tools: frozenset[str] = frozenset(), watch: TaskWatch | None = None) -> None:
        """A task starts; `host_tools` are the kernel's own MCP tools its role lets the agent call."""
        self.watch = watch
        self.rule_ids = []
        self.host_tools = host_tools
        self.context_usage = None

    def begin_turn(self, session_id: str) -> TurnState:
        self.turn = TurnState()
        self.cancelling = False
        self.sessions.add(session_id)
        self.approvals = frozenset()  # what a person approved in the last turn is not approved now
        if self.watch is not None:
            self.watch.begin_turn()
        return self.turn

    def cancel_pending(self) -> int:
        """Answer every parked permission request `cancelled` (the spec's rule on cancel)."""
        self.cancelling = True
        parked = [f for f in self._parked if not f.done()]
        for future in parked:
            future.set_result({"outcome": "cancelled"})
        return len(parked)

    def _moment(self) -> Turn:
        """The turn as it stood when the request being handled arrived."""
        return Turn(ARRIVAL.get(), self.sessions, self.host_tools, self.approvals)

    # --- session/update -----------------------------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if ARRIVAL.get() != session_id:  # an update of no running turn is not this turn's work
            return
        if isinstance(update, ToolCallStart):  # any kind, `think` included: the design counts tool calls
            self.turn.tool_calls += 1
        elif isinstance(update, UsageUpdate):
            self.context_usage = {"used": update.used, "size": update.size}
        if self.watch is not None:
            self.watch.on_update(update)

    # --- session/request_permission ------------------------------------------------------------

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        raw_call = tool_call.model_dump(mode="json", by_alias=True, exclude_none=True)
        if self._latched("session/request_permission", raw_call) is not None:  # the spec's answer after a cancel
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        choices = [(o.option_id, o.kind) for o in options]
        verdict = self.policy.permission(session_id, raw_call, choices, self._moment())
        if verdict.ask:
            return await self._ask_interactive(session_id, raw_call, options, kwargs)
        if not verdict.allowed:
            self._refused("session/request_permission", verdict, raw_call)
            if verdict.option_id is None:
                return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        else:
            self._record("session/request_permission", raw_call, verdict, outcome=verdict.option_id)
        assert verdict.option_id is not None
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=verdict.option_id))

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
            self.approvals |= self.policy.approvals(raw_call)  # fs/* and terminal/* may now reach it
        self.transcript.record(
            RecordType.POLICY,
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
        target = {"path": path}
        self._refuse_after_stop("fs/read_text_file", target, measure=False)  # a read changes nothing: no measure
        verdict = self._enforce("fs/read_text_file", self.policy.read(session_id, path, self._moment()), target)
        self.turn.client_calls += 1
        self._record("fs/read_text_file", target, verdict)  # the decision is on record before it is acted on
        relative = verdict.paths[0]  # the file that was judged, reached without a second resolution
        root = self._worktree()
        try:
            small = os.stat(os.path.join(root, relative)).st_size <= SMALL_FILE_BYTES  # stat never blocks
            text = read_beneath(root, relative) if small else await asyncio.to_thread(read_beneath, root, relative)
        except FileNotFoundError:
            raise RequestError.resource_not_found(path) from None
        except OSError as exc:
            raise RequestError.internal_error({"path": path, "error": exc.strerror or str(exc)}) from None
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start : start + limit if limit is not None else None])
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        target = {"path": path}
        self._refuse_after_stop("fs/write_text_file", {"path": path, "bytes": len(content)})
        verdict = self._enforce("fs/write_text_file", self.policy.write(session_id, path, self._moment()), target)
        self.turn.client_calls += 1
        self._record("fs/write_text_file", {"path": path, "bytes": len(content)}, verdict)  # before the write
        root, relative = self._worktree(), verdict.paths[0]
        if self.watch is not None:  # the lines it may charge, at most: the old file's, then the new content's
            self.watch.kernel_acted(_size(os.path.join(root, relative)) + len(content) + 2)
        try:
            if len(content) <= SMALL_FILE_BYTES:
                write_beneath(root, relative, content)
            else:
                await asyncio.to_thread(write_beneath, root, relative, content)
        except OSError as exc:
            raise RequestError.internal_error({"path": path, "error": exc.strerror or str(exc)}) from None
        return WriteTextFileResponse()

    def _worktree(self) -> str:
        """Where fs/* reads and writes: the worktree as the agent sees it (its overlay's merged view, when the
        sandbox has one: the agent's own changes are there, and a write lands with them, judged at the boundary)."""
        view = self.overlay.view if self.overlay is not None else None
        return view if view is not None else str(self.policy.worktree)

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
        self._refuse_after_stop("terminal/create", target)
        variables = {v.name: v.value for v in env or ()}
        verdict = self.policy.terminal(session_id, command, args, variables, cwd, self._moment())
        self._enforce("terminal/create", verdict, target)
        self._record("terminal/create", target, verdict)  # on record before it runs (its id is in the answer)
        self.turn.client_calls += 1
        if self.watch is not None:
            self.watch.kernel_acted()
        assert verdict.workdir is not None
        try:
            terminal_id = await self.exec_host.create(
                session_id, verdict.argv, cwd=verdict.workdir, env=variables, output_byte_limit=output_byte_limit
            )
        except (OSError, RuntimeError, ValueError) as exc:
            raise RequestError.internal_error({"command": command, "error": str(exc)}) from None
        return CreateTerminalResponse(terminal_id=terminal_id)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        self._use_terminal("terminal/output", session_id, terminal_id)
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
        self._use_terminal("terminal/wait_for_exit", session_id, terminal_id)
        with _terminal_errors(terminal_id):
            status = await self.exec_host.wait_for_exit(terminal_id)
        return WaitForTerminalExitResponse(exit_code=status["exitCode"], signal=status["signal"])

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> KillTerminalResponse | None:
        self._use_terminal("terminal/kill", session_id, terminal_id)
        with _terminal_errors(terminal_id):
            self.exec_host.kill(terminal_id)
        return KillTerminalResponse()

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse | None:
        self._use_terminal("terminal/release", session_id, terminal_id)
        with _terminal_errors(terminal_id):
            await self.exec_host.release(terminal_id)
        return ReleaseTerminalResponse()

    def _use_terminal(self, source: str, session_id: str, terminal_id: str) -> None:
        """Only the running turn's session, and only on a terminal it created."""
        try:
            owner: str | None = self.exec_host.session_of(terminal_id)
        except TerminalGone:
            owner = None  # the gate still comes first: a late call on a released terminal is a late call
        target = {"terminalId": terminal_id}
        self._enforce(source, self.policy.terminal_use(session_id, owner, self._moment()), target)
        if owner is None:
            raise RequestError.invalid_params({"terminalId": terminal_id, "error": "no such terminal"})

    # --- methods we do not offer: say so, never answer null ------------------------------------

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> CreateElicitationResponse:
        """An agent's question: answered by question auto-answer, one choice per form field, each on the decision
        ledger; a form that needs free text, a URL, or answering turned off stops the run BlockedAwaitingInput."""
        if self.watch is None or ARRIVAL.get() is None:  # no turn was running: nobody asked this agent anything
            return CancelElicitationResponse(action="cancel")
        if self._latched("elicitation/create", {}) is not None:
            return CancelElicitationResponse(action="cancel")
        schema = getattr(mode, "requested_schema", None)
        if schema is None:
            self.watch.unanswerable("elicitation", message, "a URL elicitation needs a person")
            return CancelElicitationResponse(action="cancel")
        fields = form_fields(message, schema.model_dump(mode="json", by_alias=True, exclude_none=True))
        if isinstance(fields, str):
            self.watch.unanswerable("elicitation", message, fields)
            return CancelElicitationResponse(action="cancel")
        content: dict[str, Any] = {}
        for field in fields:
            if not field.options:
                content[field.name] = field.default
                continue
            choice = self.watch.answer("elicitation", field.question, list(field.options))
            if choice is None:
                return CancelElicitationResponse(action="cancel")
            content[field.name] = [choice.option.id] if field.multiple else choice.option.id
        return AcceptElicitationResponse(action="accept", content=content)

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        return None

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    # --- helpers -------------------------------------------------------------------------------

    def stopped(self) -> dict[str, Any] | None:
        """The stop decided for the running turn, if one is (a `stopped` reason naming it): a refusal (it ends
        the run), a budget, stall rule or question that tripped, a segment ceiling (the turn is cancelled for
        it), or the turn's cancel sent. None: requests are judged as usual."""
        if self.refusals:
            first = self.refusals[0]
            return {"kind": "stopped", "by": "policy_refusal", "rule_id": first["rule_id"], "source": first["source"]}
        tripped = self.watch.tripped if self.watch is not None else None
        if isinstance(tripped, Stop):
            code = tripped.reason.get("stop_code")
            return {"kind": "stopped", "by": tripped.reason["kind"], **({"stop_code": code} if code else {})}
        if tripped is not None:
            return {"kind": "stopped", "by": "segment_ceiling", "why": tripped.why}
        if self.cancelling:
            return {"kind": "stopped", "by": "cancel"}
        return None

    def _latched(self, source: str, target: Mapping[str, Any], *, measure: bool = True) -> dict[str, Any] | None:
        """Before any request is served: measure the changes if something may have been written since the last
        measure (so the request after a write that broke a cap is the one refused), then the stop latch. A
        latched request is on record as refused (`cancelled` for a permission or elicitation) with its stop."""
        if self.watch is not None and measure:
            self.watch.before_effect()
        why = self.stopped()
        if why is None:
            return None
        cancelled = source in ("session/request_permission", "elicitation/create")
        self.transcript.record(RecordType.POLICY, source=source, decision="refuse", rule_ids=[], reason=why,
                               outcome="cancelled" if cancelled else "refused", **_describe(target))  # fmt: skip
        if why["by"] in ("budget", "stall") and source in ("fs/write_text_file", "terminal/create"):
            self.transcript.record(RecordType.BUDGET, event="refused_after_stop", source=source,
                                   stop_code=why.get("stop_code"))  # fmt: skip
        return why

    def _refuse_after_stop(self, source: str, target: Mapping[str, Any], *, measure: bool = True) -> None:
        """An `fs/*` or `terminal/create` request after a stop: a JSON-RPC error (the grace period while the turn
        is cancelled is not a window for more work)."""
        why = self._latched(source, target, measure=measure)
        if why is not None:
            error = {"error": "the turn is stopped; nothing more is served for it", **why}
            raise RequestError.invalid_request(error)

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
        self.refusals.append(refusal)
        self._record(source, target, verdict, outcome="refused")

    def _record(
        self, source: str, target: Mapping[str, Any], verdict: Verdict | None, *, outcome: str | None = None
    ) -> None:
        if verdict is not None:  # the rule that decided, allow or deny (the design: every auto-resolved request)
            for rule_id in verdict.rule_ids:
                if rule_id not in self.rule_ids:
                    self.rule_ids.append(rule_id)
        self.transcript.record(
            RecordType.POLICY,
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


def _size(path: str) -> int:
    """A file's size, 0 if there is none (a stat never blocks)."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


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


@contextlib.contextmanager
def _terminal_errors(terminal_id: str) -> Iterator[None]:
    """Map an unknown terminal id to invalid params instead of an internal error."""
    try:
        yield
    except TerminalGone:
        raise RequestError.invalid_params({"terminalId": terminal_id, "error": "no such terminal"}) from None
