"""A loopback stand-in for the parts of GitHub's REST API the provider uses.

    GET    /user                                   200 {login}, or 401 without the token
    GET    /repos/{o}/{r}/issues?assignee&state&sort&direction&per_page&page
                                                    open issues of the assignee, paginated with Link
    POST   /repos/{o}/{r}/issues/{n}/comments      PATCH /repos/{o}/{r}/issues/{n}
    DELETE /repos/{o}/{r}/issues/{n}/assignees
    GET    /repos/{o}/{r}/pulls?state&sort&direction&per_page&page   (requested_reviewers)
    POST   /repos/{o}/{r}/pulls                    POST /repos/{o}/{r}/pulls/{n}/reviews
    GET    /repos/{o}/{r}/commits/{ref}/status

`script(method, path_prefix, *responses)` queues canned answers (rate limits, 502s, garbage) that
the matching requests get first; `calls` records every request.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.helpers.loopback import LoopbackServer


class FakeGitHub:
    def __init__(self, *, repo: str = "acme/widgets", token: str = "t0ken", per_page_cap: int = 100) -> None:
        self.repo = repo
        self.token = token
        self.per_page_cap = per_page_cap
        self.issues: list[dict[str, Any]] = []
        self.pulls: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, Any]] = []  # (method, path with query, json body)
        self.scripted: list[tuple[str, str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler())
        self.url = self._server.url

    def close(self) -> None:
        self._server.close()

    def add_issue(
        self, number: int, title: str, *, assignee: str | None = "agent", created: str = "", **extra: Any
    ) -> None:
        self.issues.append({
            "number": number, "title": title, "body": extra.pop("body", f"Body of #{number}"), "state": "open",
            "assignees": [{"login": assignee}] if assignee else [], "created_at": created or f"2026-01-{number:02d}",
            "updated_at": extra.pop("updated", created or f"2026-01-{number:02d}"), **extra,
        })  # fmt: skip

    def add_pull(self, number: int, title: str, *, reviewers: list[str], head: str = "feature") -> None:
        self.pulls.append({
            "number": number, "title": title, "body": f"Proposal #{number}", "state": "open",
            "requested_reviewers": [{"login": r} for r in reviewers], "head": {"ref": head, "sha": "abc123"},
            "created_at": f"2026-02-{number:02d}", "updated_at": f"2026-02-{number:02d}",
        })  # fmt: skip

    def script(self, method: str, prefix: str, *responses: dict[str, Any], contains: str = "") -> None:
        """Queue canned responses ({status, headers, body|raw}) for requests matching the method, a path
        prefix and (optionally) a substring of the query."""
        with self._lock:
            self.scripted += [(method, prefix, contains, r) for r in responses]

    def made(self, method: str, prefix: str) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] == method and c[1].startswith(prefix)]

    # --- the server ----------------------------------------------------------------------------

    def _canned(self, method: str, path: str, query: str) -> dict[str, Any] | None:
        with self._lock:
            for i, (m, prefix, contains, response) in enumerate(self.scripted):
                if m == method and path.startswith(prefix) and contains in query:
                    del self.scripted[i]
                    return response
        return None

    def _route(self, method: str, path: str, query: dict[str, str], body: Any, auth: str) -> tuple[int, Any, dict]:
        if auth != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}, {}
        base = f"/repos/{self.repo}"
        if method == "GET" and path == "/user":
            return 200, {"login": "agent"}, {}
        if method == "GET" and path == f"{base}/issues":
            items = [i for i in self.issues if i["state"] == query.get("state", "open")]
            if "assignee" in query:
                items = [i for i in items if query["assignee"] in {a["login"] for a in i["assignees"]}]
            return self._page(path, query, items)
        if method == "GET" and path == f"{base}/pulls":
            return self._page(path, query, [p for p in self.pulls if p["state"] == query.get("state", "open")])
        match = re.fullmatch(rf"{re.escape(base)}/issues/(\d+)(/comments|/assignees)?", path)
        if match:
            issue = next((i for i in self.issues if i["number"] == int(match[1])), None)
            if issue is None:
                return 404, {"message": "Not Found"}, {}
            if method == "PATCH" and not match[2]:
                issue.update(body or {})
                return 200, issue, {}
            if method == "POST" and match[2] == "/comments":
                return 201, {"id": len(self.calls), "body": body.get("body")}, {}
            if method == "DELETE" and match[2] == "/assignees":
                issue["assignees"] = [a for a in issue["assignees"] if a["login"] not in body.get("assignees", [])]
                return 200, issue, {}
        if method == "POST" and path == f"{base}/pulls":
            if body["head"] == body["base"]:  # what GitHub answers
                why = f"No commits between {body['base']} and {body['head']}"
                errors = [{"resource": "PullRequest", "code": "custom", "message": why}]
                return 422, {"message": "Validation Failed", "errors": errors}, {}
            number = 100 + len(self.pulls)
            self.add_pull(number, body["title"], reviewers=[], head=body["head"])
            return 201, {"number": number, "html_url": f"https://github.invalid/{self.repo}/pull/{number}"}, {}
        match = re.fullmatch(rf"{re.escape(base)}/pulls/(\d+)/reviews", path)
        if method == "POST" and match:
            return 200, {"id": 7000 + int(match[1]), "state": body.get("event")}, {}
        if method == "GET" and re.fullmatch(rf"{re.escape(base)}/commits/[^/]+/status", path):
            return 200, {"state": "success", "statuses": [{"context": "ci", "state": "success"}]}, {}
        return 404, {"message": "Not Found"}, {}

    def _page(self, path: str, query: dict[str, str], items: list[dict[str, Any]]) -> tuple[int, Any, dict]:
        key = "updated_at" if query.get("sort") == "updated" else "created_at"
        items = sorted(items, key=lambda i: i[key], reverse=query.get("direction") == "desc")
        per_page = min(int(query.get("per_page", 30)), self.per_page_cap)
        page = int(query.get("page", 1))
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = {}
        if page * per_page < len(items):
            last = (len(items) + per_page - 1) // per_page
            link = lambda n: f"{self.url}{path}?{urlencode({**query, 'page': n})}"  # noqa: E731
            headers["Link"] = f'<{link(page + 1)}>; rel="next", <{link(last)}>; rel="last"'
        return 200, chunk, headers

    def _handler(github) -> type[http.server.BaseHTTPRequestHandler]:  # `github`: the handler closes over it
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def do_PATCH(self) -> None:
                self._serve()

            def do_DELETE(self) -> None:
                self._serve()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                parts = urlsplit(self.path)
                with github._lock:
                    github.calls.append((self.command, self.path, body))
                canned = github._canned(self.command, parts.path, parts.query)
                if canned is not None:
                    time.sleep(canned.get("delay", 0))  # a slow host: the client's timeout fires first
                    payload = canned.get("raw", json.dumps(canned.get("body", {})).encode())
                    return self._reply(canned.get("status", 200), payload, canned.get("headers", {}))
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                status, data, headers = github._route(
                    self.command, parts.path, query, body, self.headers.get("Authorization", "")
                )
                self._reply(status, json.dumps(data).encode(), headers)

            def _reply(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for key, value in headers.items():
                    self.send_header(key, str(value))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
