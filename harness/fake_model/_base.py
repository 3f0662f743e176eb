"""What both fake model APIs share: the server's life, the requests and errors kept, the handler's plumbing
and the server-sent-events encoding."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, Self

from ._loopback import LoopbackServer

__all__ = ["FakeServer", "Handler", "Record", "sse"]

#: One request as kept and logged: `{"method", "path", "body", ...}`.
Record = dict[str, Any]


def sse(events: Iterable[dict[str, Any]]) -> bytes:
    """Server-sent events, each named by its `type` (both APIs name them so)."""
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


class Handler(http.server.BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 (adapters reuse their connection), silent, with a sized body."""

    protocol_version = "HTTP/1.1"

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def route(self) -> str:
        """The path without its query or trailing slash."""
        return self.path.split("?")[0].rstrip("/")

    def send(self, status: int, kind: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the requests are kept (and logged by `on_request`), not printed


class FakeServer:
    """A fake API on `host:port` (port 0: any free one): `errors` holds why a request could not be answered
    (a test reads them, an adapter sees a 400 saying the same); `on_request` is handed every request as it is
    kept (`loop-harness fake-model --requests` appends them to a file), `on_error` every error."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 on_request: Callable[[Record], None] | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.errors: list[str] = []
        self._on_request = on_request
        self._on_error = on_error
        # One lock orders the script, the kept requests and the log: adapters send requests concurrently.
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler(), host, port)

    @property
    def port(self) -> int:
        return self._server.port

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _logged(self, record: Record) -> None:
        """Hand `record` to `on_request` (the caller holds the lock, so the log keeps arrival order)."""
        if self._on_request is not None:
            self._on_request(record)

    def _failed(self, exc: Exception) -> bytes:
        """Keep why a request could not be answered; the 400 body the adapter gets."""
        message = f"{type(exc).__name__}: {exc}"
        self.errors.append(message)
        if self._on_error is not None:
            self._on_error(message)
        return json.dumps({"error": {"message": str(exc)}}).encode()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        raise NotImplementedError
