"""The host tools over MCP (the official `mcp` SDK, Streamable HTTP), inside the kernel's event loop.

Each task gets its own URL (`/tasks/<id>/mcp`) and bearer token, listed in `session/new`
`mcpServers` as an http server; `tools/list` shows the task's allowed tools only, and
`tools/call` of any other tool is refused (JSON-RPC -32602) and recorded. Stateless JSON
mode: a client needs no session, so a standard-library client can call the tools with a POST.

uvicorn serves it on 127.0.0.1 from a socket bound here (port known at once), with its
signal handlers, logging configuration and lifespan left alone: the kernel owns those.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.routing import Route

from ..config._config import HOST_SERVER_NAME
from ..record._records import RecordType
from ..record._transcript import Transcript
from ._host_tools import TOOL_SPECS, HostToolError, HostTools, TaskBinding

__all__ = ["HostToolServer"]


class HostToolServer:
    def __init__(self, tools: HostTools, transcript: Transcript) -> None:
        self.tools = tools
        self.transcript = transcript
        self.bindings: dict[str, TaskBinding] = {}
        self.port: int | None = None
        self._mcp = Server("loop-harness-host", version="0.1.0", on_list_tools=self._list, on_call_tool=self._call)
        self._manager = StreamableHTTPSessionManager(
            app=self._mcp,
            stateless=True,
            json_response=True,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*"],
            ),
        )
        gate = _Gate(StreamableHTTPASGIApp(self._manager), self.bindings)
        # POST only: a GET would open an SSE stream that holds up shutdown.
        self._app = Starlette(routes=[Route("/tasks/{key}/mcp", endpoint=gate, methods=["POST"])])
        self._gate = gate
        self._server: _EmbeddedUvicorn | None = None
        self._serve: asyncio.Task[None] | None = None
        self._manager_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve on `sock` (bound to a loopback port already: the sandbox relays that port) or a new one."""
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2, ws="none")  # fmt: skip
        self._server = _EmbeddedUvicorn(config)
        ready = asyncio.Event()

        async def run_manager() -> None:  # its task group must be entered and left in one task
            async with self._manager.run():
                ready.set()
                await self._stop.wait()

        self._manager_task = asyncio.create_task(run_manager(), name="mcp-host-manager")
        await ready.wait()
        self._serve = asyncio.create_task(self._server.serve(sockets=[sock]), name="mcp-host-uvicorn")
        started = asyncio.ensure_future(self._server.ready.wait())
        await asyncio.wait({started, self._serve}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            self._stop.set()  # leave nothing running behind a failed start
            await self._manager_task
            with contextlib.suppress(BaseException):
                await self._serve
            raise RuntimeError("the host tool server did not start")

    async def stop(self) -> None:
        if self._server is None or self._serve is None or self._manager_task is None:
            return
        self._server.should_exit = True
        while not self._serve.done() and any(s.is_serving() for s in self._server.servers):
            await asyncio.sleep(0.01)
        self._gate.closed = True
        self._stop.set()
        await self._manager_task
        await self._serve

    @contextlib.contextmanager
    def serving(self, binding: TaskBinding) -> Iterator[dict[str, Any]]:
        """Serve `binding`'s tools while the task runs; yields its `mcpServers` entry."""
        key = secrets.token_hex(8)
        self.bindings[key] = binding
        try:
            yield {
                "type": "http",
                "name": HOST_SERVER_NAME,
                "url": f"http://127.0.0.1:{self.port}/tasks/{key}/mcp",
                "headers": [{"name": "Authorization", "value": f"Bearer {binding.token}"}],
            }
        finally:
            self.bindings.pop(key, None)

    # --- MCP handlers --------------------------------------------------------------------------

    def _binding(self, ctx: Any) -> TaskBinding:
        key = ctx.request.path_params.get("key") if ctx.request is not None else None
        binding = self.bindings.get(key or "")
        if binding is None:
            raise MCPError(code=types.INVALID_REQUEST, message="this task has ended")
        return binding

    async def _list(self, ctx: Any, params: Any) -> types.ListToolsResult:
        binding = self._binding(ctx)
        self.transcript.record(RecordType.HOST_TOOLS_LISTED, task=binding.task.id, tools=sorted(binding.allowed))
        return types.ListToolsResult(
            tools=[
                types.Tool(name=name, description=spec["description"], input_schema=spec["inputSchema"])
                for name, spec in TOOL_SPECS.items()
                if name in binding.allowed
            ]
        )

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        binding = self._binding(ctx)
        name, arguments = params.name, dict(params.arguments or {})
        record = {"task": binding.task.id, "tool": name, "arguments": arguments}
        if name not in binding.allowed:
            self.transcript.record(RecordType.HOST_TOOL, **record, outcome="refused", allowed=sorted(binding.allowed))
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"tool {name!r} is not available to this task",
                data={"allowed": sorted(binding.allowed)},
            )
        try:
            result = await self.tools.call(binding, name, arguments)
        except HostToolError as exc:
            self.transcript.record(RecordType.HOST_TOOL, **record, outcome="error", error=str(exc))
            return _result({"error": str(exc)}, error=True)
        except Exception as exc:  # the host answered badly: the agent sees a failed call, the run goes on
            self.transcript.record(
                RecordType.HOST_TOOL, **record, outcome="error", error=f"{type(exc).__name__}: {exc}"
            )
            return _result({"error": f"the host could not do it: {exc}"}, error=True)
        self.transcript.record(RecordType.HOST_TOOL, **record, outcome="ok", result=result)
        return _result(result)


def _result(data: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(data))], is_error=error)


class _Gate:
    """Checks the task's key and bearer token before MCP sees the request."""

    def __init__(self, app: Any, bindings: dict[str, TaskBinding]) -> None:
        self.app = app
        self.bindings = bindings
        self.closed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        binding = self.bindings.get(scope.get("path_params", {}).get("key", ""))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.closed:
            await _reply(send, 503, "the host tool server is shutting down")
        elif binding is None:
            await _reply(send, 404, "no such task, or it has ended")
        elif not secrets.compare_digest(headers.get("authorization", ""), f"Bearer {binding.token}"):
            await _reply(send, 401, "wrong token for this task")
        else:
            await self.app(scope, receive, send)


async def _reply(send: Any, status: int, message: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside someone else's loop: no signal handlers of its own, and a startup event."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()  # uvicorn has a polled `started` flag of its own

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()
