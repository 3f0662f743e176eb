"""A stateless OpenAI chat-completions server on loopback that every agent of a soak or a bench can share.

A request whose last message is a tool result gets a message ("done"); any other gets a `write_file` call of
`out/result.txt`. Each answer carries its `usage` (7 completion tokens a call, 2 a message), as one JSON body,
or, when the request asks to stream, as server-sent events (the call's name, then its arguments, the finish,
then a usage chunk: `stream_options.include_usage`). It answers several agents at once (a thread per
connection) and counts what it served.
"""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

__all__ = ["CALL_TOKENS", "MESSAGE_TOKENS", "MODEL", "ChatServer"]

CALL_TOKENS, MESSAGE_TOKENS = 7, 2
MODEL = "fake-coder"
PROMPT_TOKENS = 120


class ChatServer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served = {"requests": 0, "completion_tokens": 0, "streamed": 0}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_json({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message, finish, tokens = server.answer(body["messages"])
                usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": tokens,
                         "total_tokens": PROMPT_TOKENS + tokens}  # fmt: skip
                if not body.get("stream"):
                    choice = {"index": 0, "message": message, "finish_reason": finish}
                    self.send_json({"object": "chat.completion", "usage": usage, "choices": [choice]})
                    return
                with server.lock:
                    server.served["streamed"] += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0, no length: the body ends when the connection closes
                for chunk in _chunks(message, finish, usage):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def send_json(self, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def answer(self, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str, int]:
        """The message, its finish reason and its completion tokens, counted as served."""
        if messages[-1]["role"] == "tool":
            message, finish, tokens = {"role": "assistant", "content": "done"}, "stop", MESSAGE_TOKENS
        else:
            arguments = json.dumps({"path": "out/result.txt", "content": "result"})
            call = {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
            tokens = CALL_TOKENS
        with self.lock:
            self.served["requests"] += 1
            self.served["completion_tokens"] += tokens
        return message, finish, tokens

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join()


def _chunks(message: dict[str, Any], finish: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                "finish_reason": finish_reason}]}  # fmt: skip

    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        head = {"index": 0, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
        arguments = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
        body = [chunk({"role": "assistant", "tool_calls": [head]}), chunk({"tool_calls": [arguments]})]
    else:
        body = [chunk({"role": "assistant", "content": message["content"]})]
    return [*body, chunk({}, finish), {"object": "chat.completion.chunk", "choices": [], "usage": usage}]
