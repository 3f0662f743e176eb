"""Newline-delimited JSON-RPC 2.0 on stdio, standard library only.

The reader runs on the main thread; prompt turns run on worker threads and
block in `request()` until the reader hands them the client's answer.
"""

from __future__ import annotations

import json
import threading

TYPE_CHECKING = False  # see _scenario.py: no typing import at run time
if TYPE_CHECKING:
    from typing import Any, BinaryIO

__all__ = ["RemoteError", "Wire"]


class RemoteError(Exception):
    """The client answered a request with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


class _Pending:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: dict[str, Any] | None = None


class Wire:
    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._ids = 0
        self._pending: dict[int, _Pending] = {}
        self.closed = threading.Event()  # stdin reached EOF

    def write_raw(self, data: bytes) -> None:
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write_raw((json.dumps(message, separators=(",", ":")) + "\n").encode())

    def respond(self, request_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def respond_error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self.send({"jsonrpc": "2.0", "id": request_id, "error": error})

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request and block until the answer; raises RemoteError or EOFError."""
        with self._lock:
            request_id = self._ids
            self._ids += 1
            pending = self._pending[request_id] = _Pending()
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while not pending.done.wait(0.05):
            if self.closed.is_set():
                raise EOFError("the client went away")
        if pending.error is not None:
            raise RemoteError(pending.error)
        return pending.result

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a response from the client to the thread waiting for it."""
        with self._lock:
            pending = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if pending is None:
            return
        pending.result = message.get("result")
        pending.error = message.get("error")
        pending.done.set()
