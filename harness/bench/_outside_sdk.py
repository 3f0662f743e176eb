"""The SDK side of `loop-harness bench kernel --outside`: a foreign agent and a bare client, on the ACP SDK alone.

    python -m harness.bench._outside_sdk agent                           # serve ACP on stdio
    python -m harness.bench._outside_sdk client WORKSPACE TASKS          # drain TASKS tasks against the agent

Nothing here imports the rest of the harness (the package's `__init__` loads nothing until asked), so the
agent is what any third party would write and the client does only the protocol work:

- the agent, per prompt: reports one tool call (`read`, on README.md), asks the client's permission for it,
  reads the file through the client (`fs/read_text_file`), reports the call completed and ends its turn;
- the bare client, per task: `session/new`, `session/prompt`, the permission answered `allow_once`, the read
  served from disk, `session/close`. No policy, preconditions, transcript or display.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    spawn_agent_process,
    start_tool_call,
    text_block,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    ClientCapabilities,
    CloseSessionResponse,
    FileSystemCapabilities,
    Implementation,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    ToolCallLocation,
    ToolCallUpdate,
)

__all__ = ["AGENT_MODULE", "READ_FILE"]

AGENT_MODULE = "harness.bench._outside_sdk"
READ_FILE = "README.md"  # make_workspace commits it
OPTIONS = [
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]


class ReadAgent:
    """One tool call, one permission request, one `fs/read_text_file` per prompt (the SDK's `Agent` protocol,
    as the inference agent implements it: only the methods it serves)."""

    def on_connect(self, conn: Client) -> None:
        self.client = conn
        self.sessions: dict[str, str] = {}  # session id -> its working directory

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any) -> Any:
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                session_capabilities=SessionCapabilities(close=SessionCloseCapabilities())
            ),
            agent_info=Implementation(name="bench-read-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = cwd
        return NewSessionResponse(session_id=session_id)

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        self.sessions.pop(session_id, None)
        return CloseSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        path = f"{self.sessions[session_id]}/{READ_FILE}"
        call = "call_" + uuid.uuid4().hex[:8]
        location = [ToolCallLocation(path=path)]
        title = f"Read {READ_FILE}"
        await self.client.session_update(
            session_id, start_tool_call(call, title, kind="read", status="pending", locations=location)
        )
        answer = await self.client.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call, title=title, kind="read", locations=location),
            options=OPTIONS,
        )
        if answer.outcome.outcome != "selected" or answer.outcome.option_id != "allow":
            await self.client.session_update(session_id, update_tool_call(call, status="failed"))
            return PromptResponse(stop_reason="refusal")
        await self.client.read_text_file(session_id=session_id, path=path)
        await self.client.session_update(session_id, update_tool_call(call, status="completed"))
        return PromptResponse(stop_reason="end_turn")


class BareClient:
    """Every permission allowed, every read served from disk: nothing judged, nothing recorded."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kwargs: Any) -> Any:
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id))

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> Any:
        return ReadTextFileResponse(content=Path(path).read_text())

    def on_connect(self, conn: Any) -> None:
        return None


async def drain(workspace: str, tasks: int) -> int:
    """The bare client's run: spawn the agent, then `tasks` tasks, each in a session of its own."""
    async with spawn_agent_process(
        BareClient(),  # type: ignore[arg-type]
        sys.executable,
        "-m",
        AGENT_MODULE,
        "agent",
        env=dict(os.environ),
        cwd=workspace,
        use_unstable_protocol=True,  # session/close, as the kernel's connection
    ) as (conn, _process):
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True)),
        )
        done = 0
        for i in range(tasks):
            session = await conn.new_session(cwd=workspace, mcp_servers=[])
            response = await conn.prompt(session_id=session.session_id, prompt=[text_block(f"bench task {i}")])
            if response.stop_reason != "end_turn":
                raise RuntimeError(f"task {i} ended {response.stop_reason}")
            await conn.close_session(session_id=session.session_id)  # as the kernel does, per task
            done += 1
            print(f"done {done}", flush=True)  # the bench times these lines, as the kernel's progress lines
    return done


def main(argv: list[str]) -> int:
    if argv[:1] == ["agent"] and len(argv) == 1:
        agent = ReadAgent()
        asyncio.run(run_agent(agent, use_unstable_protocol=True))  # type: ignore[arg-type]  # session/close: unstable
        return 0
    if argv[:1] == ["client"] and len(argv) == 3:
        asyncio.run(drain(argv[1], int(argv[2])))
        return 0
    print("usage:\n" + "\n".join(__doc__.splitlines()[2:4]), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
