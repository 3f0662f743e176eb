"""A stand-in for the Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events), for Claude Code.

Enough of it for Claude Code (`ANTHROPIC_BASE_URL`): each request that offers the `Bash` tool (the agent's own
turn) is answered with the next scripted reply; every other request (a title or quota call on a small model,
`count_tokens`, anything else) gets a short plain text reply, so nothing Claude Code asks on the side consumes
the script. A reply is a list of content blocks: `text(...)`, `bash(command)` (a `tool_use` of Claude's Bash
tool) and `tool_use(name, input)`. The stream has the shape the real API sends: `message_start`, per block
`content_block_start`, its deltas (`text_delta`, or `input_json_delta` with the tool input as partial JSON) and
`content_block_stop`, then `message_delta` with the stop reason (`tool_use` when the reply calls a tool, else
`end_turn`) and `message_stop`. Every request is kept (`requests`: method, path, body, turn), so a caller can
read what Claude Code sent back: the command's output arrives as a `tool_result` in the next turn's request.
"""

from __future__ import annotations

import http.server
import json
from collections.abc import Sequence
from typing import Any

from ._base import FakeServer, Handler, Record, sse
from ._script import Script

__all__ = ["Block", "FakeMessages", "bash", "replies_of", "text", "tool_use"]

Block = dict[str, Any]

_NOT_FOUND = b'{"type": "error", "error": {"type": "not_found_error"}}'


def text(words: str) -> Block:
    """A text block."""
    return {"type": "text", "text": words}


def tool_use(name: str, arguments: dict[str, Any], tool_id: str = "toolu_01") -> Block:
    """A call of Claude Code's tool `name` with `arguments` as its input."""
    return {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}


def bash(command: str, tool_id: str = "toolu_01") -> Block:
    """A call of Claude Code's Bash tool running `command`."""
    return tool_use("Bash", {"command": command, "description": "Run the script"}, tool_id)


def replies_of(script: Script) -> list[list[Block]]:
    """A script's replies as content blocks; each call gets an id of its own (`toolu_<reply>_<item>`)."""
    replies = []
    for r, reply in enumerate(script.replies, 1):
        blocks = []
        for i, step in enumerate(reply, 1):
            if step.say is not None:
                blocks.append(text(step.say))
            elif step.shell is not None:
                blocks.append(bash(step.shell, f"toolu_{r:02d}_{i:02d}"))
            else:
                blocks.append(tool_use(str(step.tool), step.input or {}, f"toolu_{r:02d}_{i:02d}"))
        replies.append(blocks)
    return replies


def _usage(output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": output_tokens}  # fmt: skip


def _stop_reason(blocks: Sequence[Block]) -> str:
    return "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"


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
    events.append({"type": "message_delta", "delta": {"stop_reason": _stop_reason(blocks), "stop_sequence": None},
                   "usage": {"output_tokens": 5}})  # fmt: skip
    events.append({"type": "message_stop"})
    return events


class FakeMessages(FakeServer):
    """Serves `replies` in order, one per agent turn (`POST .../v1/messages` offering `Bash`); `requests` holds
    every request (`{"method", "path", "body", "turn"}`), `url` the base URL to configure (no `/v1`)."""

    def __init__(self, replies: Sequence[Sequence[Block]], *, aside: str = "ok", **options: Any) -> None:
        self.requests: list[Record] = []
        self._replies = list(replies)
        self._aside = aside
        self._turns = 0
        super().__init__(**options)
        self.url = self._server.url

    @classmethod
    def from_script(cls, script: Script, **options: Any) -> FakeMessages:
        return cls(replies_of(script), **options)

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

    def _keep(self, method: str, path: str, body: Any, turn: bool = False) -> int:
        """Keep one request; the index of the agent's turn it is (counted before it)."""
        with self._lock:
            index = self._turns
            self._turns += turn
            record = {"method": method, "path": path, "body": body, "turn": turn}
            self.requests.append(record)
            self._logged(record)
            return index

    def _reply(self, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """The content type and payload answering one `POST .../messages`."""
        offered = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
        turn = "Bash" in offered
        index = self._keep("POST", path, body, turn)
        blocks: Sequence[Block] = [text(self._aside)]
        if turn:
            blocks = self._replies[index] if index < len(self._replies) else [text("")]
        message_id, model = f"msg_{len(self.requests):02d}", str(body.get("model") or "fake-model")
        if body.get("stream"):
            return "text/event-stream", sse(_events(blocks, model, message_id))
        whole = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": list(blocks),
                 "stop_reason": _stop_reason(blocks), "stop_sequence": None, "usage": _usage(5)}  # fmt: skip
        return "application/json", json.dumps(whole).encode()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        fake = self

        class Messages(Handler):
            def do_POST(self) -> None:
                raw, path = self.body(), self.route()
                try:
                    body = json.loads(raw) if raw else {}
                    if path.endswith("/messages/count_tokens"):
                        fake._keep("POST", path, body)
                        self.send(200, "application/json", b'{"input_tokens": 10}')
                    elif path.endswith("/messages"):
                        self.send(200, *fake._reply(path, body))
                    else:
                        fake._keep("POST", path, body)
                        self.send(404, "application/json", _NOT_FOUND)
                except Exception as exc:  # an answer Claude Code cannot use says why, to it and in `errors`
                    self.send(400, "application/json", fake._failed(exc))

            def do_GET(self) -> None:
                fake._keep("GET", self.path, None)
                self.send(404, "application/json", _NOT_FOUND)

            def do_HEAD(self) -> None:
                fake._keep("HEAD", self.path, None)
                self.send(200, "text/plain", b"")

        return Messages
