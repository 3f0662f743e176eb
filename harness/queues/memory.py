"""The in-process queue: the default host, and a scriptable one for tests.

Faults from the config (`queue.faults`) make it answer like a troubled host:
`rate_limited` (with a reset time), `unavailable`, `unauthorized` or `rejected`, a given
number of times, for `list_tasks` or for marking one task done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .._config import FaultConfig, QueueConfig
from .._exceptions import HostRejected, HostUnauthorized, HostUnavailable, RateLimited
from .protocol import Task

__all__ = ["MemoryQueueProvider"]


@dataclass
class _Fault:
    spec: FaultConfig
    left: int


class MemoryQueueProvider:
    name = "memory"

    def __init__(self, tasks: list[Task], *, authorized: bool = True, faults: list[FaultConfig] | None = None) -> None:
        self._open = list(tasks)
        self._authorized = authorized
        self._faults = [_Fault(f, f.times) for f in faults or ()]
        self.done: list[str] = []  # ids marked done, in order
        self.calls: dict[str, int] = {"list_tasks": 0, "mark_done": 0}

    @classmethod
    def from_config(cls, config: QueueConfig) -> MemoryQueueProvider:
        key = "created" if config.order == "created" else "updated"
        indexed = list(enumerate(config.tasks))
        indexed.sort(key=lambda it: getattr(it[1], key) if getattr(it[1], key) is not None else it[0])
        tasks = [Task(t.id, t.title, t.body) for _, t in indexed]
        return cls(tasks, authorized=config.authorized, faults=list(config.faults))

    async def check_authorized(self) -> None:
        if not self._authorized:
            raise HostUnauthorized("the memory host is configured as unauthorized")

    async def list_tasks(self) -> list[Task]:
        self.calls["list_tasks"] += 1
        self._maybe_fail("list_tasks", None)
        return list(self._open)

    async def mark_done(self, task: Task) -> None:
        self.calls["mark_done"] += 1
        self._maybe_fail("mark_done", task.id)
        self._open = [t for t in self._open if t.id != task.id]
        self.done.append(task.id)

    async def aclose(self) -> None:
        return None

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
