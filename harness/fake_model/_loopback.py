"""A threaded HTTP server on a loopback address (an ephemeral port by default), in a background thread."""

from __future__ import annotations

import http.server
import socket
import threading

__all__ = ["LoopbackServer"]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a client that keeps its connection open never holds up close()


class _Server6(_Server):
    address_family = socket.AF_INET6


class LoopbackServer:
    """Serves `handler` on `host:port` (port 0: one the system picks) in a background thread; `url` is where
    (`http://HOST:PORT`), `close()` stops it."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], host: str = "127.0.0.1",
                 port: int = 0) -> None:  # fmt: skip
        kind = _Server6 if ":" in host else _Server
        self._server = kind((host, port), handler)
        self.port: int = self._server.server_address[1]
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        # A short poll interval: shutdown() waits for the next poll (0.5 s by default).
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
