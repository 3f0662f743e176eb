"""A loopback stand-in for the Hugging Face hub, serving what `hf_hub_download` expects of an LFS file.

    HEAD|GET /{repo}/resolve/{revision}/{file} -> 302 to localhost/cdn/{sha256}, with X-Repo-Commit,
                                                  X-Linked-Etag ("sha256") and X-Linked-Size
    HEAD|GET /cdn/{sha256}                     -> 200 and the bytes (206 for a Range)

No xet headers are sent, so the library downloads over plain HTTP.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import threading

from tests.helpers.loopback import LoopbackServer

_RESOLVE = re.compile(r"^/(?P<repo>.+?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub:
    def __init__(self, files: dict[tuple[str, str, str], bytes]) -> None:
        self.files = dict(files)
        self.blobs = {hashlib.sha256(data).hexdigest(): data for data in files.values()}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler())
        self.url = self._server.url

    def close(self) -> None:
        self._server.close()

    def downloads(self) -> int:
        return sum(1 for method, path in self.requests if method == "GET" and path.startswith("/cdn/"))

    def _handler(hub) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _reply(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _serve(self, body: bool) -> None:
                with hub._lock:
                    hub.requests.append((self.command, self.path))
                if self.path.startswith("/cdn/") and self.path[5:] in hub.blobs:
                    data = hub.blobs[self.path[5:]]
                    start = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                    if start:
                        offset = int(start[1])
                        extra = {"Content-Range": f"bytes {offset}-{len(data) - 1}/{len(data)}"}
                        return self._reply(206, extra, data[offset:], body)
                    return self._reply(200, {"Accept-Ranges": "bytes"}, data, body)
                match = _RESOLVE.match(self.path)
                key = (match["repo"], match["rev"], match["file"]) if match else None
                if key not in hub.files:
                    return self._reply(404, {"X-Error-Code": "EntryNotFound"}, b"", body)
                data = hub.files[key]
                sha = hashlib.sha256(data).hexdigest()
                headers = {
                    "X-Repo-Commit": key[1],
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(data)),
                    "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                    # another origin, as a real CDN is: the client does not follow it for HEAD
                    "Location": f"{hub.url.replace('127.0.0.1', 'localhost')}/cdn/{sha}",
                }
                self._reply(302, headers, b"", body)

        return Handler
