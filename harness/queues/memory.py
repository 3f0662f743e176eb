"""The in-process host: the default, and a scriptable one for tests.

It serves both queues: the issues assigned to the agent (`tasks`) and the
proposals awaiting its review (`proposals`, plus any opened through the host
tools during the run). Faults from the config (`queue.faults`) make it answer
like a troubled host: `rate_limited` (with a reset time), `unavailable`,
`unauthorized` or `rejected`, a given number of times, for `list_tasks` or
for marking one task done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..config._config import FaultConfig, MemoryQueueConfig, Trigger
from ..config._exceptions import HostRejected, HostUnauthorized, HostUnavailable, RateLimited
from .protocol import Task, TaskKind

__all__ = ["MemoryQueueProvider"]


@dataclass
class _Fault:
    spec: FaultConfig
    left: int


class MemoryQueueProvider:
    name = "memory"

    def __init__(
        self,
        tasks: list[Task],
        *,
        proposals: list[Task] | None = None,
        trigger: Trigger = Trigger.ISSUE_ASSIGNED,
        authorized: bool = True,
        faults: list[FaultConfig] | None = None,
    ) -> None:
        self._open = {t.id: t for t in tasks}  # by id: marking one done is O(1) in a long queue
        self._awaiting_review = list(proposals or ())
        self.trigger = trigger
        self._authorized = authorized
        self._faults = [_Fault(f, f.times) for f in faults or ()]
        self.done: list[str] = []  # ids marked done, in order
        self.calls: dict[str, int] = {"list_tasks": 0, "mark_done": 0}
        self.proposals: list[dict[str, Any]] = []  # opened through the host tools
        self.reviews: list[dict[str, Any]] = []  # submitted through the host tools

    @classmethod
    def from_config(
        cls, config: MemoryQueueConfig, *, trigger: Trigger = Trigger.ISSUE_ASSIGNED
    ) -> MemoryQueueProvider:
        key = "created" if config.order == "created" else "updated"

        def ordered(items: list[Any]) -> list[Any]:
            positions = {id(item): i for i, item in enumerate(items)}
            return sorted(items, key=lambda it: getattr(it, key) if getattr(it, key) is not None else positions[id(it)])

        tasks = [Task(t.id, t.title, t.body) for t in ordered(config.tasks)]
        proposals = [Task(p.id, p.title, p.body, TaskKind.PROPOSAL, p.branch) for p in ordered(config.proposals)]
        return cls(
            tasks, proposals=proposals, trigger=trigger, authorized=config.authorized, faults=list(config.faults)
        )

    async def check_authorized(self) -> None:
        if not self._authorized:
            raise HostUnauthorized("the memory host is configured as unauthorized")

    async def list_tasks(self) -> list[Task]:
        self.calls["list_tasks"] += 1
        self._maybe_fail("list_tasks", None)
        if self.trigger is Trigger.PROPOSAL_AWAITING_REVIEW:
            return list(self._awaiting_review)
        return list(self._open.values())

    async def mark_done(self, task: Task) -> None:
        self.calls["mark_done"] += 1
        self._maybe_fail("mark_done", task.id)
        self._open.pop(task.id, None)
        if self._awaiting_review:
            self._awaiting_review = [t for t in self._awaiting_review if t.id != task.id]
        self.done.append(task.id)

    async def aclose(self) -> None:
        return None

    # --- host tools ----------------------------------------------------------------------------

    async def open_proposal(self, task: Task, *, title: str, body: str, head: str) -> dict[str, Any]:
        proposal = {"id": f"P{len(self.proposals) + 1}", "task": task.id, "title": title, "body": body, "head": head}
        self.proposals.append(proposal)
        # It now awaits review, for a reviewer role draining this host's proposal queue.
        self._awaiting_review.append(Task(proposal["id"], title, body, TaskKind.PROPOSAL, head))
        return {"id": proposal["id"], "head": head}

    async def submit_review(self, task: Task, *, verdict: str, body: str) -> dict[str, Any]:
        review = {"id": f"R{len(self.reviews) + 1}", "proposal": task.id, "verdict": verdict, "body": body}
        self.reviews.append(review)
        return {"id": review["id"], "state": verdict}

    async def commits_status(self, ref: str) -> dict[str, Any]:
        return {"state": "pending", "statuses": [], "note": "the memory host runs no checks"}

    def _maybe_fail(self, op: str, task_id: str | None) -> None:
        for fault in self._faults:
            spec = fault.spec
            if spec.op != op or fault.left <= 0 or (spec.task is not None and spec.task != task_id):
                continue
            fault.left -= 1
            if spec.signal == "rate_limited":
                raise RateLimited(time.time() + spec.reset_in_s)
            if spec.signal == "unauthorized":
                raise HostUnauthorized(spec.cause)
            if spec.signal == "rejected":
                raise HostRejected(spec.cause)
            raise HostUnavailable(spec.cause)
