"""A stand-in for the Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events) on 127.0.0.1.

Enough of it for Claude Code (`ANTHROPIC_BASE_URL`): each request that offers the `Bash` tool (the agent's own
turn) is answered with the next scripted reply; every other request (a title or quota call on a small model,
`count_tokens`, anything else) gets a short plain text reply, so nothing Claude Code asks on the side consumes
the script. A reply is a list of content blocks: `text(...)` and `bash(command)` (a `tool_use` of Claude's Bash
tool). The stream has the shape the real API sends: `message_start`, per block `content_block_start`, its
deltas (`text_delta`, or `input_json_delta` with the tool input as partial JSON) and `content_block_stop`, then
`message_delta` with the stop reason (`tool_use` when the reply calls a tool, else `end_turn`) and
`message_stop`. Every request is kept (`requests`: method, path, body), so a test can read what Claude Code
sent back: the command's output arrives as a `tool_result` in the next turn's request.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Sequence
from typing import Any

from tests.helpers.loopback import LoopbackServer

__all__ = ["FakeMessages", "bash", "text"]

Block = dict[str, Any]


def text(words: str) -> Block:
    """A text block."""
    return {"type": "text", "text": words}


def bash(command: str, tool_id: str = "toolu_01") -> Block:
    """A call of Claude Code's Bash tool running `command`."""
    arguments = {"command": command, "description": "Run the script"}
    return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": arguments}


def _usage(output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": output_tokens}  # fmt: skip


def _events(blocks: Sequence[Block], model: str, message_id: str) -> list[dict[str, Any]]:
    """The streamed events of one reply."""
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _usage(1)}}]  # fmt: skip
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": ""},
                      {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]  # fmt: skip
        else:
            start, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": 5}})  # fmt: skip
    events.append({"type": "message_stop"})
    return events


class FakeMessages:
    """Serves `replies` in order, one per agent turn (`POST .../v1/messages` offering `Bash`); `requests` holds
    every request (`{"method", "path", "body"}`), `url` the base URL to configure (no `/v1`)."""

    def __init__(self, replies: Sequence[Sequence[Block]], *, aside: str = "ok") -> None:
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._replies = list(replies)
        self._aside = aside
        self._turns = 0
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler())
        self.url = self._server.url

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> FakeMessages:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def turns(self) -> list[dict[str, Any]]:
        """The bodies of the agent's own turns (the requests the script answered)."""
        return [r["body"] for r in self.requests if r.get("turn")]

    def outputs(self) -> list[str]:
        """Every `tool_result` Claude Code sent back in its turns, as text (the first of each id only: a
        later turn repeats the whole conversation)."""
        found: dict[str, str] = {}
        for body in self.turns():
            for message in body.get("messages", []):
                content = message.get("content")
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        result = block.get("content")
                        if isinstance(result, list):
                            result = "".join(p.get("text", "") for p in result if isinstance(p, dict))
                        found.setdefault(block.get("tool_use_id", ""), str(result))
        return list(found.values())

    def _reply(self, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """The content type and payload answering one `POST .../messages`."""
        offered = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
        with self._lock:
            turn = "Bash" in offered
            index = self._turns
            self._turns += turn
            self.requests.append({"method": "POST", "path": path, "body": body, "turn": turn})
        blocks: Sequence[Block] = [text(self._aside)]
        if turn:
            blocks = self._replies[index] if index < len(self._replies) else [text("")]
        message_id, model = f"msg_{len(self.requests):02d}", str(body.get("model") or "fake-model")
        if body.get("stream"):
            events = _events(blocks, model, message_id)
            return "text/event-stream", b"".join(
                f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events
            )
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        whole = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": list(blocks),
                 "stop_reason": stop, "stop_sequence": None, "usage": _usage(5)}  # fmt: skip
        return "application/json", json.dumps(whole).encode()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0].rstrip("/")
                try:
                    body = json.loads(raw) if raw else {}
                    if path.endswith("/messages/count_tokens"):
                        fake.requests.append({"method": "POST", "path": path, "body": body, "turn": False})
                        self._send(200, "application/json", b'{"input_tokens": 10}')
                    elif path.endswith("/messages"):
                        self._send(200, *fake._reply(path, body))
                    else:
                        fake.requests.append({"method": "POST", "path": path, "body": body, "turn": False})
                        self._send(404, "application/json", b'{"type": "error", "error": {"type": "not_found_error"}}')
                except Exception as exc:  # a test reads these: an answer Claude Code cannot use says why
                    fake.errors.append(f"{type(exc).__name__}: {exc}")
                    self._send(400, "application/json", json.dumps({"error": {"message": str(exc)}}).encode())

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path, "body": None, "turn": False})
                self._send(404, "application/json", b'{"type": "error", "error": {"type": "not_found_error"}}')

            def do_HEAD(self) -> None:
                fake.requests.append({"method": "HEAD", "path": self.path, "body": None, "turn": False})
                self._send(200, "text/plain", b"")

            def _send(self, status: int, kind: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
