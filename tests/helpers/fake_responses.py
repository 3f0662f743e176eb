"""A stand-in for the OpenAI Responses API (`POST /v1/responses`, streamed as server-sent events) on 127.0.0.1.

Enough of it for Codex (`wire_api = "responses"`): each request is answered with the next scripted reply. A
reply is a list of output items; `shell_call(command)` becomes a call of whichever shell tool the request
offers (`shell_command` takes a string, `shell` an argv, `exec_command` a `cmd` string), so the same script
works across Codex versions. Every request body is kept, so a test can read what Codex sent back (the
command's output arrives as a `function_call_output` in the next request).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tests.helpers.loopback import LoopbackServer

__all__ = ["FakeResponses", "message", "shell_call"]

#: A reply's output item, given the request it answers (the tools it offers).
Item = Callable[[dict[str, Any]], dict[str, Any]]


def message(text: str) -> Item:
    """An assistant message ending the turn."""
    return lambda _request: {"type": "message", "role": "assistant", "id": "msg_1",
                             "content": [{"type": "output_text", "text": text}]}  # fmt: skip


def shell_call(command: str, call_id: str = "call_1") -> Item:
    """A call of the shell tool the request offers, running `command` with bash."""

    def item(request: dict[str, Any]) -> dict[str, Any]:
        offered = {tool.get("name") or tool.get("type") for tool in request.get("tools", [])}
        if "shell_command" in offered:
            arguments: dict[str, Any] = {"command": command}
            name = "shell_command"
        elif "exec_command" in offered:
            arguments, name = {"cmd": command}, "exec_command"
        elif "shell" in offered:
            arguments, name = {"command": ["bash", "-lc", command]}, "shell"
        elif "local_shell" in offered:
            return {"type": "local_shell_call", "call_id": call_id, "status": "completed",
                    "action": {"type": "exec", "command": ["bash", "-lc", command]}}  # fmt: skip
        else:
            raise LookupError(f"the request offers no shell tool: {sorted(map(str, offered))}")
        return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}

    return item


class FakeResponses:
    """Serves `replies` in order, one per `POST .../responses`; `requests` holds every request body, `url`
    the base URL to configure (`.../v1`). A request past the script is answered with an empty message."""

    def __init__(self, replies: Sequence[Sequence[Item]]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._replies = list(replies)
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler())
        self.url = self._server.url + "/v1"

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> FakeResponses:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def outputs(self) -> list[str]:
        """Every `function_call_output` (or custom/local output) Codex sent back, as text."""
        found = []
        for request in self.requests:
            for entry in request.get("input", []):
                if isinstance(entry, dict) and entry.get("type", "").endswith("call_output"):
                    output = entry.get("output")
                    found.append(output if isinstance(output, str) else json.dumps(output))
        return found

    def _reply(self, request: dict[str, Any]) -> bytes:
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
        items = self._replies[index] if index < len(self._replies) else [message("")]
        response_id = f"resp_{index + 1}"
        events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": response_id}}]
        events += [{"type": "response.output_item.done", "item": item(request)} for item in items]
        events.append({"type": "response.completed", "response": {"id": response_id, "usage": {
            "input_tokens": 10, "input_tokens_details": None, "output_tokens": 5, "output_tokens_details": None,
            "total_tokens": 15}}})  # fmt: skip
        return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.rstrip("/").endswith("/responses"):
                    self._send(404, "application/json", b'{"error": {"message": "not here"}}')
                    return
                try:
                    payload = fake._reply(json.loads(body))
                except Exception as exc:  # a test reads these: an answer Codex cannot use says why
                    fake.errors.append(f"{type(exc).__name__}: {exc}")
                    self._send(400, "application/json", json.dumps({"error": {"message": str(exc)}}).encode())
                    return
                self._send(200, "text/event-stream", payload)

            def do_GET(self) -> None:
                if self.path.split("?")[0].rstrip("/").endswith("/models"):
                    self._send(200, "application/json", b'{"models": [], "data": []}')
                else:
                    self._send(404, "application/json", b'{"error": {"message": "not here"}}')

            def _send(self, status: int, kind: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
