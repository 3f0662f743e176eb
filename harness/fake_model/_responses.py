"""A stand-in for the OpenAI Responses API (`POST /v1/responses`, streamed as server-sent events), for Codex.

Enough of it for Codex (`wire_api = "responses"`): each request is answered with the next scripted reply. A
reply is a list of output items; `shell_call(command)` becomes a call of whichever shell tool the request
offers (`shell_command` takes a string, `shell` an argv, `exec_command` a `cmd` string, `local_shell` its own
item), so the same script works across Codex versions. Every request body is kept, so a caller can read what
Codex sent back (the command's output arrives as a `function_call_output` in the next request).
"""

from __future__ import annotations

import http.server
import json
from collections.abc import Callable, Sequence
from typing import Any

from ._base import FakeServer, Handler, sse
from ._script import Script

__all__ = ["FakeResponses", "Item", "function_call", "message", "replies_of", "shell_call"]

#: A reply's output item, given the request it answers (the tools it offers).
Item = Callable[[dict[str, Any]], dict[str, Any]]

_NOT_HERE = b'{"error": {"message": "not here"}}'


def message(text: str) -> Item:
    """An assistant message (a reply of messages alone ends the turn)."""
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


def function_call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Item:
    """A call of the function tool `name` with `arguments` (whether the request offers it or not)."""
    call = {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}
    return lambda _request: call


def replies_of(script: Script) -> list[list[Item]]:
    """A script's replies as output items; each call gets an id of its own (`call_<reply>_<item>`)."""
    replies = []
    for r, reply in enumerate(script.replies, 1):
        items = []
        for i, step in enumerate(reply, 1):
            if step.say is not None:
                items.append(message(step.say))
            elif step.shell is not None:
                items.append(shell_call(step.shell, f"call_{r}_{i}"))
            else:
                items.append(function_call(str(step.tool), step.input or {}, f"call_{r}_{i}"))
        replies.append(items)
    return replies


class FakeResponses(FakeServer):
    """Serves `replies` in order, one per `POST .../responses`; `requests` holds every request body, `url`
    the base URL to configure (`.../v1`). A request past the script is answered with an empty message."""

    def __init__(self, replies: Sequence[Sequence[Item]], **options: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        self._replies = list(replies)
        super().__init__(**options)
        self.url = self._server.url + "/v1"

    @classmethod
    def from_script(cls, script: Script, **options: Any) -> FakeResponses:
        return cls(replies_of(script), **options)

    def outputs(self) -> list[str]:
        """Every `function_call_output` (or custom/local output) Codex sent back, as text."""
        found = []
        for request in self.requests:
            for entry in request.get("input", []):
                if isinstance(entry, dict) and entry.get("type", "").endswith("call_output"):
                    output = entry.get("output")
                    found.append(output if isinstance(output, str) else json.dumps(output))
        return found

    def _reply(self, path: str, request: dict[str, Any]) -> bytes:
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
            self._logged({"method": "POST", "path": path, "body": request})
        items = self._replies[index] if index < len(self._replies) else [message("")]
        response_id = f"resp_{index + 1}"
        events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": response_id}}]
        events += [{"type": "response.output_item.done", "item": item(request)} for item in items]
        events.append({"type": "response.completed", "response": {"id": response_id, "usage": {
            "input_tokens": 10, "input_tokens_details": None, "output_tokens": 5, "output_tokens_details": None,
            "total_tokens": 15}}})  # fmt: skip
        return sse(events)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Responses(Handler):
            def do_POST(self) -> None:
                body = self.body()
                if not self.route().endswith("/responses"):
                    self.send(404, "application/json", _NOT_HERE)
                    return
                try:
                    payload = fake._reply(self.route(), json.loads(body))
                except Exception as exc:  # an answer Codex cannot use says why, to Codex and in `errors`
                    self.send(400, "application/json", fake._failed(exc))
                    return
                self.send(200, "text/event-stream", payload)

            def do_GET(self) -> None:
                if self.route().endswith("/models"):
                    self.send(200, "application/json", b'{"models": [], "data": []}')
                else:
                    self.send(404, "application/json", _NOT_HERE)

        return Responses
