"""The inference agent's side of the host tools: the session's HTTP MCP servers, through the official SDK."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["HostClient"]


class HostClient:
    """Lists and calls the tools of one HTTP MCP server (the kernel's host tools for this task)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers

    @classmethod
    def from_servers(cls, servers: list[Any]) -> HostClient | None:
        for server in servers or ():
            data = server.model_dump(by_alias=True) if hasattr(server, "model_dump") else dict(server)
            if data.get("type") == "http":
                return cls(data["url"], {h["name"]: h["value"] for h in data.get("headers") or []})
        return None

    async def list_tools(self) -> dict[str, dict[str, Any]]:
        """{name: {"description", "parameters"}}, with every string bounded for the grammar."""
        async with self._session() as session:
            listed = await session.list_tools()
        return {
            tool.name: {"description": tool.description or tool.name, "parameters": _bounded(dict(tool.input_schema))}
            for tool in listed.tools
        }

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
        """(ok, text) of one tool call; a refused or failed call is (False, why)."""
        from mcp.shared.exceptions import MCPError

        try:
            async with self._session() as session:
                result = await session.call_tool(name, arguments)
        except MCPError as exc:
            return False, str(exc)
        text = "".join(getattr(c, "text", "") for c in getattr(result, "content", []) or [])
        return not getattr(result, "is_error", False), text

    @asynccontextmanager
    async def _session(self) -> Any:
        import httpx2
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with (
            httpx2.AsyncClient(headers=self.headers, timeout=httpx2.Timeout(30, read=120)) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """Give every string property a maxLength, so a small model cannot write until its budget runs out."""
    schema = json.loads(json.dumps(schema))
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop, dict) and prop.get("type") == "string" and "enum" not in prop:
            prop.setdefault("maxLength", 200)
    return schema
