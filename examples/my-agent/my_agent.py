"""A small third-party ACP agent on the official SDK: it creates the file a task names, after asking.

It understands one kind of request, "Create the file PATH containing the word WORD": it reports a tool call,
asks the client's permission, writes the file through the client (fs/write_text_file) when allowed, and ends
its turn. Anything else gets one sentence back. Run it on stdio: `python -m my_agent`.
"""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from typing import Any

from acp import (
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    start_tool_call,
    text_block,
    update_agent_message,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    CloseSessionResponse,
    Implementation,
    PermissionOption,
    SessionCapabilities,
    SessionCloseCapabilities,
    ToolCallLocation,
    ToolCallUpdate,
)

REQUEST = re.compile(r"Create the file (?P<path>\S+?)\.? containing the word (?P<word>\w+)")
OPTIONS = [
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]


class FileAgent(Agent):
    def on_connect(self, conn: Client) -> None:
        self.client = conn
        self.capabilities: ClientCapabilities | None = None
        self.sessions: dict[str, str] = {}  # session id -> its working directory
        self.cancelled: set[str] = set()

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any) -> Any:
        self.capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=min(protocol_version, 1),
            agent_capabilities=AgentCapabilities(
                session_capabilities=SessionCapabilities(close=SessionCloseCapabilities())
            ),
            agent_info=Implementation(name="my-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = cwd
        return NewSessionResponse(session_id=session_id)

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        self.sessions.pop(session_id, None)  # nothing of a closed session is kept: a long queue stays small
        self.cancelled.discard(session_id)
        return CloseSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.add(session_id)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        self.cancelled.discard(session_id)
        text = " ".join(getattr(block, "text", "") for block in prompt)
        wanted = REQUEST.search(text)
        if wanted is None:
            await self.say(session_id, "I can only create a file: 'Create the file PATH containing the word WORD'.")
            return PromptResponse(stop_reason="end_turn")
        return await self.create(session_id, wanted["path"], wanted["word"] + "\n")

    async def create(self, session_id: str, path: str, content: str) -> PromptResponse:
        absolute = f"{self.sessions[session_id]}/{path}"
        call = "call_" + uuid.uuid4().hex[:8]
        location = [ToolCallLocation(path=absolute)]
        start = start_tool_call(call, f"Write {path}", kind="edit", status="pending", locations=location)
        await self.client.session_update(session_id, start)
        answer = await self.client.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call, title=f"Write {path}", kind="edit", locations=location),
            options=OPTIONS,
        )
        if answer.outcome.outcome == "cancelled" or session_id in self.cancelled:
            return PromptResponse(stop_reason="cancelled")
        if answer.outcome.option_id != "allow":
            await self.client.session_update(session_id, update_tool_call(call, status="failed"))
            await self.say(session_id, f"Not allowed to write {path}; stopping.")
            return PromptResponse(stop_reason="end_turn")
        fs = self.capabilities.fs if self.capabilities else None
        if not (fs and fs.write_text_file):
            await self.say(session_id, "The client cannot write files for me.")
            return PromptResponse(stop_reason="end_turn")
        await self.client.session_update(session_id, update_tool_call(call, status="in_progress"))
        await self.client.write_text_file(session_id=session_id, path=absolute, content=content)
        await self.client.session_update(session_id, update_tool_call(call, status="completed"))
        await self.say(session_id, f"Created {path}.")
        return PromptResponse(stop_reason="end_turn")

    async def say(self, session_id: str, text: str) -> None:
        await self.client.session_update(session_id, update_agent_message(text_block(text)))


def main() -> None:
    print("my-agent: serving ACP on stdio (logs go to stderr)", file=sys.stderr)
    asyncio.run(run_agent(FileAgent(), use_unstable_protocol=True))  # session/close is in the unstable set


if __name__ == "__main__":
    main()
