"""Permission requests waiting for a person (the interactive path: a session whose policy has no rule).

Requests are answered over the API, oldest first or in any order; each id is random, so an answer meant
for an earlier session's request (a stale page) cannot land on this session's. The idle allow-once countdown is
owned here: when it is on, the oldest request gets a deadline, a request reaching the front gets a fresh
one, a person's reply cancels it, and at the deadline the request is answered with its `allow_once` option
(never an `allow_always`: nothing is saved as a standing approval) after eligibility is checked again. It is
eligible only with the server's autonomy switch on and the workspace's sandbox off (docs/server.md).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Pending", "PendingRequest"]


@dataclass
class PendingRequest:
    id: str
    params: dict[str, Any]
    answer: asyncio.Future[dict[str, Any]]
    since: float = field(default_factory=time.time)
    deadline: float | None = None  # wall clock, while a countdown runs for it

    def as_json(self) -> dict[str, Any]:
        left = None if self.deadline is None else max(0.0, round(self.deadline - time.time(), 1))
        return {"id": self.id, "toolCall": self.params.get("toolCall"), "options": self.params.get("options"),
                "since": self.since, "allow_once_in_s": left}  # fmt: skip


class Pending:
    """One session's waiting requests; `handler` is the kernel's interactive handler."""

    def __init__(self, countdown_s: float, eligible: Callable[[], bool]) -> None:
        self.countdown_s = countdown_s  # 0: no countdown
        self.eligible = eligible
        self.requests: dict[str, PendingRequest] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def handler(self, params: dict[str, Any]) -> dict[str, Any]:
        request = PendingRequest(f"p-{secrets.token_hex(6)}", params, asyncio.get_running_loop().create_future())
        self.requests[request.id] = request
        self._arm()
        try:
            return await request.answer
        finally:  # answered, or the session cancelled it: either way it waits no more
            self.requests.pop(request.id, None)
            self._arm()

    def reply(self, request_id: str, outcome: dict[str, Any]) -> bool:
        """A person's answer; False when there is no such request (any more)."""
        request = self.requests.get(request_id)
        if request is None or request.answer.done():
            return False
        request.answer.set_result(outcome)
        return True

    def listing(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.requests.values()]

    def rearm(self) -> None:
        """Eligibility changed (the switch): any countdown stops, and a fresh one starts if it is eligible now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for request in self.requests.values():
            request.deadline = None
        self._arm()

    def _arm(self) -> None:
        """The countdown follows the oldest request: a fresh one whenever the front changes."""
        front = next(iter(self.requests.values()), None)
        if front is not None and front.deadline is not None and self._timer is not None:
            return  # the front's countdown runs on
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for request in self.requests.values():
            request.deadline = None
        if front is None or not self.countdown_s or not self.eligible():
            return
        front.deadline = time.time() + self.countdown_s
        self._timer = asyncio.get_running_loop().call_later(self.countdown_s, self._expire, front.id)

    def _expire(self, request_id: str) -> None:
        self._timer = None
        request = self.requests.get(request_id)
        if request is None or request.answer.done():
            return
        request.deadline = None
        once = next((o for o in request.params.get("options") or [] if o.get("kind") == "allow_once"), None)
        if once is None or not self.eligible():  # re-checked: the switch or the sandbox may have changed
            return
        request.answer.set_result({"outcome": "selected", "optionId": once["optionId"]})
