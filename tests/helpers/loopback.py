"""A threaded HTTP server on 127.0.0.1 and an ephemeral port, for the fake hosts the tests talk to."""

from __future__ import annotations

import http.server
import threading


class LoopbackServer:
    """Serves `handler` in a background thread; `url` is where, `close()` stops it."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll interval: shutdown() waits for the next poll (0.5 s by default).
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
