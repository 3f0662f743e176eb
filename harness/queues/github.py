"""The GitHub host over its REST API (httpx): assigned issues, review requests, proposals, reviews.

Every answer is translated once, here, into what the kernel understands:

    401                                    -> HostUnauthorized   (BlockedPrecondition host_authorized)
    403/429 + x-ratelimit-remaining: 0     -> RateLimited(reset_at = x-ratelimit-reset)   primary limit
    403/429 + retry-after                  -> RateLimited(reset_at = now + retry-after)   secondary limit
    403/429 naming a secondary rate limit  -> RateLimited(None): back off exponentially, with jitter
    5xx, refused, timeouts, a body that is
    not the JSON expected                  -> HostUnavailable(cause)   (retried, then BlockedHostUnavailable)
    other 403, 404, 422                    -> HostRejected(cause)      (not retried)

Listing follows `Link: rel="next"` and never builds page URLs by hand.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from ..config._config import GitHubQueueConfig, Trigger
from ..config._exceptions import HostRejected, HostUnauthorized, HostUnavailable, RateLimited
from .protocol import Task, TaskKind

__all__ = ["GitHubAssignedIssueProvider", "GitHubProvider"]

API_VERSION = "2022-11-28"
MAX_PAGES = 100  # 10,000 items at per_page=100: beyond that a `next` link is looping


class GitHubProvider:
    name = "github"

    def __init__(self, config: GitHubQueueConfig, *, trigger: Trigger = Trigger.ISSUE_ASSIGNED) -> None:
        self.config = config
        self.repo = config.repo
        self.assignee = config.assignee
        self.trigger = trigger
        self._token = os.environ.get(config.token_env)
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        self._client = httpx.AsyncClient(
            base_url=config.api_url.rstrip("/"), headers=headers, timeout=config.request_timeout_s
        )
        self._origin = httpx.URL(config.api_url).copy_with(path="/", query=None, fragment=None)
        self._done_actions: dict[str, set[str]] = {}  # per task: on_complete actions already carried out

    # --- the queue -----------------------------------------------------------------------------

    async def check_authorized(self) -> None:
        if not self._token:
            raise HostUnauthorized(f"the token environment variable {self.config.token_env} is not set")
        user = await self._json("GET", "/user")
        if not isinstance(user, dict) or "login" not in user:
            raise HostUnavailable("GET /user answered without a login")

    async def list_tasks(self) -> list[Task]:
        sort = {"sort": self.config.order, "direction": "asc", "per_page": "100"}
        if self.trigger is Trigger.PROPOSAL_AWAITING_REVIEW:
            pulls = await self._pages(f"/repos/{self.repo}/pulls", {"state": "open", **sort})
            return [
                Task(str(p["number"]), p.get("title") or "", p.get("body") or "", TaskKind.PROPOSAL, _head(p))
                for p in pulls
                if self.assignee in {r.get("login") for r in p.get("requested_reviewers") or []}
            ]
        issues = await self._pages(f"/repos/{self.repo}/issues", {"assignee": self.assignee, "state": "open", **sort})
        return [
            Task(str(i["number"]), i.get("title") or "", i.get("body") or "")
            for i in issues
            if "pull_request" not in i  # pull requests are issues too
        ]

    async def mark_done(self, task: Task) -> None:
        if task.kind is TaskKind.PROPOSAL:
            return None  # submitting the review answered the request
        path = f"/repos/{self.repo}/issues/{task.id}"
        done = self._done_actions.setdefault(task.id, set())
        for action in self.config.on_complete:
            if action in done:  # a retry after a later action failed must not comment twice
                continue
            if action == "comment":
                await self._json("POST", f"{path}/comments", {"body": "Completed by loop-harness."})
            elif action == "close":
                await self._json("PATCH", path, {"state": "closed", "state_reason": "completed"})
            else:
                await self._json("DELETE", f"{path}/assignees", {"assignees": [self.assignee]})
            done.add(action)
        return None

    async def aclose(self) -> None:
        await self._client.aclose()

    # --- host tools ----------------------------------------------------------------------------

    async def open_proposal(self, task: Task, *, title: str, body: str, head: str) -> dict[str, Any]:
        data = {"title": title, "body": body, "head": head, "base": self.config.base_branch}
        pull = await self._json("POST", f"/repos/{self.repo}/pulls", data)
        return {"id": str(pull.get("number")), "url": pull.get("html_url"), "head": head}

    async def submit_review(self, task: Task, *, verdict: str, body: str) -> dict[str, Any]:
        event = {"approve": "APPROVE", "request_changes": "REQUEST_CHANGES", "comment": "COMMENT"}[verdict]
        review = await self._json("POST", f"/repos/{self.repo}/pulls/{task.id}/reviews", {"event": event, "body": body})
        return {"id": str(review.get("id")), "state": review.get("state", event)}

    async def commits_status(self, ref: str) -> dict[str, Any]:
        status = await self._json("GET", f"/repos/{self.repo}/commits/{ref}/status")
        return {"state": status.get("state"), "statuses": status.get("statuses", [])}

    # --- HTTP ----------------------------------------------------------------------------------

    async def _pages(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        url: str | None = path
        query: dict[str, str] | None = params
        for _ in range(MAX_PAGES):
            if url is None:
                return items
            response = await self._send("GET", url, params=query)
            page = _decode(response)
            if not isinstance(page, list):
                raise HostUnavailable(f"GET {url} answered {type(page).__name__}, not a list")
            items += [item for item in page if isinstance(item, dict)]
            url = response.links.get("next", {}).get("url")
            if url is not None and httpx.URL(url).copy_with(path="/", query=None, fragment=None) != self._origin:
                raise HostUnavailable(f"GET {path}: a next link leaves {self._origin} (the token stays here)")
            query = None  # the next link carries the query
        raise HostUnavailable(f"GET {path}: more than {MAX_PAGES} pages")

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return _decode(await self._send(method, path, json=body))

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:  # refused, timed out, reset, protocol errors
            raise HostUnavailable(f"{method} {url}: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status < 400:
            return response
        where = f"{method} {response.request.url.path}"
        if status == 401:
            raise HostUnauthorized(f"{where} answered 401: {_message(response)}")
        if status in (403, 429):
            _raise_rate_limit(response, where)
        if status >= 500:
            raise HostUnavailable(f"{where} answered {status}")
        raise HostRejected(f"{where} answered {status}: {_message(response)}")


def _raise_rate_limit(response: httpx.Response, where: str) -> None:
    headers = response.headers
    if headers.get("x-ratelimit-remaining") == "0" and headers.get("x-ratelimit-reset", "").isdigit():
        raise RateLimited(float(headers["x-ratelimit-reset"]), f"{where}: primary rate limit")
    retry_after = headers.get("retry-after", "")
    if retry_after.isdigit():
        raise RateLimited(time.time() + int(retry_after), f"{where}: secondary rate limit")
    if "rate limit" in _message(response).lower():
        raise RateLimited(None, f"{where}: secondary rate limit without retry-after")
    raise HostRejected(f"{where} answered {response.status_code}: {_message(response)}")


def _decode(response: httpx.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return {}
    try:
        return response.json()
    except ValueError:
        raise HostUnavailable(
            f"{response.request.method} {response.request.url.path} answered a body that is not JSON: "
            f"{response.text[:80]!r}"
        ) from None


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    return str(data.get("message", "")) if isinstance(data, dict) else ""


def _head(pull: dict[str, Any]) -> str:
    head = pull.get("head")
    return str(head.get("ref", "")) if isinstance(head, dict) else ""


GitHubAssignedIssueProvider = GitHubProvider  # its first name, from when it served only assigned issues
