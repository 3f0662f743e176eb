"""The inference agent: an ACP agent (official SDK) whose actions go through the client.

Each prompt turn is a loop of model steps. A tool call becomes ACP: a
`tool_call` update, a `session/request_permission`, then `fs/read_text_file`,
`fs/write_text_file` or `terminal/*` carried out by the client, so the
client's policy governs the model exactly as it governs any agent. The turn
ends `end_turn` when the model answers in text, calls `finish`, repeats its
last call, or is refused; `max_tokens` when the turn's token budget is spent;
`max_turn_requests` after too many model steps; `cancelled` on session/cancel.

The model is a backend (`_model.Model`): the local llama.cpp one, or an OpenAI-compatible endpoint. The
session keeps its history structured (OpenAI's chat shape, see `_prompting`), and each backend renders it
its own way. A backend that cannot give a step (`StepError`: an endpoint down, or answering garbage) ends
the prompt turn with a JSON-RPC error whose message names the cause; the kernel's run then ends `Failed`
(`agent_error`) with it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from acp import RequestError
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    McpCapabilities,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    StopReason,
    ToolCallLocation,
    ToolCallUpdate,
    ToolKind,
    Usage,
)

from ._host_client import HostClient
from ._model import Model, ModelStep, StepError
from ._prompting import ACTION_TOOLS, TOOLS

__all__ = ["InferenceAgent"]

TOOL_KIND = {"write_file": "edit", "read_file": "read", "run_command": "execute"}
OPTIONS = [
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]
KEEP_MESSAGES = 12  # besides the task (and the system prompt a backend adds): older steps are dropped
#: The JSON-RPC error a prompt turn ends with when the model backend could not give a step.
MODEL_ERROR = -32603


@dataclass
class _Session:
    cwd: str
    host: HostClient | None = None  # the host's tools for this task, over MCP
    tools: dict[str, dict[str, Any]] | None = None  # offered to the model: the actions, then the host's
    messages: list[dict[str, Any]] = field(default_factory=list)  # the history, OpenAI-shaped (see _prompting)
    cancel: threading.Event = field(default_factory=threading.Event)
    input_tokens: int = 0
    output_tokens: int = 0


class InferenceAgent:
    def __init__(self, model: Model, *, max_tokens: int = 512, max_steps: int = 6) -> None:
        self.model = model
        self.max_tokens = max_tokens  # per prompt turn
        self.max_steps = max_steps  # model steps per prompt turn
        self.sessions: dict[str, _Session] = {}
        self._conn: Any = None
        self._caps: Any = None
        self._calls = 0

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any) -> Any:
        self._caps = client_capabilities
        model = self.model.info
        return InitializeResponse(
            protocol_version=1,
            agent_capabilities=AgentCapabilities(load_session=False, mcp_capabilities=McpCapabilities(http=True)),
            agent_info=Implementation(name="loop-harness-inference", version=_version(),
                                      title=f"loop-harness inference agent ({model['name'] or 'unnamed model'})"),
            # the model it runs: {name, endpoint (None for the local one), revision (None when unknown)}
            field_meta={"loopHarness": {"model": model}},
        )  # fmt: skip

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid.uuid4().hex[:12]}"
        # One live session at a time: forget finished ones.
        self.sessions = {session_id: _Session(cwd, host=HostClient.from_servers(mcp_servers or []))}
        return NewSessionResponse(session_id=session_id)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if session := self.sessions.get(session_id):
            session.cancel.set()

    async def authenticate(self, method_id: str, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("authenticate")

    async def load_session(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("session/load")

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params({"sessionId": "unknown session"})
        session.cancel.clear()
        text = "".join(getattr(block, "text", "") for block in prompt)
        if session.tools is None:
            session.tools = dict(TOOLS)
            if session.host is not None:
                try:
                    session.tools.update(await session.host.list_tools())
                except Exception as exc:  # the host tools are a bonus: the agent works without them
                    print(f"inference agent: host tools unavailable: {exc}", file=sys.stderr)
        session.messages.append({"role": "user", "content": text})
        timings = {"ttftSeconds": 0.0, "decodeSeconds": 0.0, "decodeTokens": 0, "steps": 0, "invalidSteps": 0}
        stop_reason = await self._turn(session_id, session, timings)
        return PromptResponse(
            stop_reason=cast(StopReason, stop_reason),
            usage=Usage(
                input_tokens=session.input_tokens,
                output_tokens=session.output_tokens,
                total_tokens=session.input_tokens + session.output_tokens,
            ),
            field_meta={"loopHarness": {"modelLoads": self.model.loads, "pid": os.getpid(), **timings}},
        )

    async def _turn(self, session_id: str, session: _Session, timings: dict[str, Any]) -> str:
        assert session.tools is not None
        budget = self.max_tokens
        previous: tuple[str | None, str] | None = None
        for _ in range(self.max_steps):
            try:
                step: ModelStep = await self.model.step(
                    _window(session.messages), session.tools, max_tokens=budget, cancel=session.cancel
                )
            except StepError as exc:
                print(f"inference agent: {exc}", file=sys.stderr)
                data = {"model": self.model.info, **exc.data}
                raise RequestError(MODEL_ERROR, f"model backend: {exc}", data) from None
            budget -= step.completion_tokens
            session.input_tokens += step.prompt_tokens
            session.output_tokens += step.completion_tokens
            timings["ttftSeconds"] += step.ttft_s
            timings["decodeSeconds"] += step.decode_s
            timings["decodeTokens"] += step.completion_tokens
            timings["steps"] += 1
            await self._update(session_id, {"sessionUpdate": "usage_update", "used": step.prompt_tokens,
                                            "size": self.model.n_ctx})  # fmt: skip
            if step.kind == "cancelled":
                return "cancelled"
            if step.kind == "length":
                return "max_tokens"
            call_id = _history_id(session.messages, step.call_id)
            if step.kind == "invalid":  # tell the model, and let it try again (counted: the grammar should forbid it)
                timings["invalidSteps"] += 1
                session.messages.append(_call(call_id, step))
                session.messages.append({"role": "tool", "tool_call_id": call_id, "name": step.tool,
                                         "content": step.why_invalid, "invalid": True})  # fmt: skip
                continue
            if step.kind == "message" or step.tool == "finish":
                said = step.text if step.kind == "message" else step.arguments.get("summary", "")
                session.messages.append({"role": "assistant", "content": said})
                await self._say(session_id, said or "(done)")
                return "end_turn"
            call = (step.tool, step.raw_arguments)
            if call == previous:  # repeating itself: a small model's loop, not progress
                await self._say(session_id, f"I already called {step.tool} with these arguments; stopping here.")
                return "end_turn"
            previous = call
            session.messages.append(_call(call_id, step))
            if step.tool in ACTION_TOOLS:
                outcome, result = await self._act(session_id, session, step)
            else:
                outcome, result = await self._host_call(session_id, session, step)
            if outcome != "ok":
                return outcome
            session.messages.append({"role": "tool", "tool_call_id": call_id, "name": step.tool, "content": result})
        return "max_turn_requests"

    async def _act(self, session_id: str, session: _Session, step: ModelStep) -> tuple[str, str]:
        """Carry out an action tool through the client: ("ok", result), or a stop reason."""
        assert step.tool in ACTION_TOOLS
        self._calls += 1
        call_id = f"call_{self._calls}"
        args = step.arguments
        if step.tool == "run_command":
            raw_input: dict[str, Any] = {"command": ["bash", "-lc", args["command"]], "cwd": session.cwd}
            title, locations = args["command"], None
        else:
            path = os.path.join(session.cwd, args["path"])
            raw_input = {"path": path, **({"content": args["content"]} if "content" in args else {})}
            title, locations = f"{step.tool} {args['path']}", [ToolCallLocation(path=path)]
        kind = TOOL_KIND[step.tool]
        call = {"toolCallId": call_id, "title": title, "kind": kind, "status": "pending", "rawInput": raw_input,
                # what the model produced, for checking against the tool's schema
                "_meta": {"loopHarness": {"tool": step.tool, "arguments": step.arguments}}}  # fmt: skip
        if locations:
            call["locations"] = [{"path": loc.path} for loc in locations]
        await self._update(session_id, {"sessionUpdate": "tool_call", **call})
        answer = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call_id, title=title, kind=cast(ToolKind, kind), raw_input=raw_input,
                                     locations=locations),
            options=OPTIONS,
        )  # fmt: skip
        outcome = answer.outcome
        if outcome.outcome == "cancelled" or session.cancel.is_set():
            await self._status(session_id, call_id, "failed")
            return "cancelled", ""
        if outcome.option_id != "allow":
            await self._status(session_id, call_id, "failed")
            await self._say(session_id, f"The client refused {title}; stopping.")
            return "end_turn", ""
        await self._status(session_id, call_id, "in_progress")
        try:
            result = await self._perform(session_id, session, step.tool, args, raw_input)
        except RequestError as exc:
            await self._status(session_id, call_id, "failed")
            await self._say(session_id, f"{title} failed: {exc}")
            return "end_turn", ""
        await self._update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                                        "status": "completed", "rawOutput": {"result": result[:2000]}})  # fmt: skip
        return "ok", result[:1000]

    async def _host_call(self, session_id: str, session: _Session, step: ModelStep) -> tuple[str, str]:
        """A host tool over MCP: no permission request (the role's allowlist is what governs it)."""
        assert session.host is not None and step.tool is not None
        self._calls += 1
        call_id = f"call_{self._calls}"
        made = {"loopHarness": {"tool": step.tool, "arguments": step.arguments}}
        call = {"toolCallId": call_id, "title": f"host: {step.tool}", "kind": "other", "status": "in_progress",
                "rawInput": step.arguments, "_meta": made}  # fmt: skip
        await self._update(session_id, {"sessionUpdate": "tool_call", **call})
        ok, text = await session.host.call(step.tool, step.arguments)
        await self._status(session_id, call_id, "completed" if ok else "failed")
        return "ok", text[:1000] if ok else f"failed: {text[:300]}"

    async def _perform(self, session_id: str, session: _Session, tool: str, args: dict[str, Any],
                       raw_input: dict[str, Any]) -> str:  # fmt: skip
        fs = getattr(self._caps, "fs", None)
        if tool == "write_file":
            if not (fs and fs.write_text_file):
                return "the client cannot write files"
            await self._conn.write_text_file(session_id=session_id, path=raw_input["path"], content=args["content"])
            return f"wrote {len(args['content'])} characters to {args['path']}"
        if tool == "read_file":
            if not (fs and fs.read_text_file):
                return "the client cannot read files"
            read = await self._conn.read_text_file(session_id=session_id, path=raw_input["path"])
            return str(read.content)
        if not getattr(self._caps, "terminal", False):
            return "the client cannot run commands"
        created = await self._conn.create_terminal(
            session_id=session_id, command="bash", args=["-lc", args["command"]], cwd=session.cwd,
            output_byte_limit=4000,
        )  # fmt: skip
        terminal_id = created.terminal_id
        try:
            exited = await self._conn.wait_for_terminal_exit(session_id=session_id, terminal_id=terminal_id)
            output = await self._conn.terminal_output(session_id=session_id, terminal_id=terminal_id)
        finally:
            await self._conn.release_terminal(session_id=session_id, terminal_id=terminal_id)
        return f"exit {exited.exit_code}\n{output.output}"

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        await self._conn.session_update(session_id=session_id, update=_update_model(update))

    async def _status(self, session_id: str, call_id: str, status: str) -> None:
        await self._update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status})

    async def _say(self, session_id: str, text: str) -> None:
        await self._update(
            session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
        )


def _window(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first task message, then the most recent messages (the backend puts its system prompt first)."""
    if len(messages) <= 1 + KEEP_MESSAGES:
        return messages
    return messages[:1] + messages[-KEEP_MESSAGES:]


def _history_id(messages: list[dict[str, Any]], given: str | None) -> str:
    """The id a call is kept under: the server's, unless the history holds it already (a server may number
    each answer's calls from 0), else nine letters and digits (the form some models' templates insist on)."""
    used = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    return given if given and given not in used else uuid.uuid4().hex[:9]


def _call(call_id: str, step: ModelStep) -> dict[str, Any]:
    """The history's record of a tool call the model made."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": step.tool, "arguments": step.raw_arguments}}
        ],
    }


def _version() -> str:
    try:
        return importlib.metadata.version("loop-harness")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def _update_model(update: dict[str, Any]) -> Any:
    from acp.schema import SessionNotification

    return SessionNotification.model_validate({"sessionId": "_", "update": update}).update
