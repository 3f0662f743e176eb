"""What a soak drains: the queue that hands out its tasks, the scripted agent's turn for each, and what is
open when a counter broke its bound."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import psutil

from harness import Task

if TYPE_CHECKING:
    from ._runner import SoakRunner

__all__ = ["SoakQueue", "scripted_turn", "what_is_open"]


def scripted_turn(grow: bool, leaks: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per task: a tool call with a permission request, an fs write and read, a terminal command; `leaks`
    (`fd`, `thread`) the agent leaks on purpose each task."""
    steps: list[dict[str, Any]] = [
        {"tool_call": {"title": "Write out/result.txt", "kind": "edit", "locations": ["out/result.txt"],
                       "permission": True}},
        {"write": {"path": "out/result.txt", "content": "result\n"}},
        {"read": {"path": "out/result.txt", "expect": "result\n"}},
        {"terminal": {"command": "git", "args": ["status", "--short"]}},
        {"message": "done"},
    ]  # fmt: skip
    if grow:
        steps.append({"growing_message": 200})
    steps.extend({"leak": what} for what in leaks)
    return {"steps": steps}


class SoakQueue:
    """The soak's host: hands out the tasks until they are done or a bound broke."""

    name = "soak"

    def __init__(self, runner: SoakRunner, count: int, *, first: int = 0) -> None:
        self.runner = runner
        self.open = [runner.task(first + i) for i in range(count)]

    async def check_authorized(self) -> None:
        return None

    async def list_tasks(self) -> list[Task]:
        return [] if self.runner.error is not None else list(self.open)  # a broken bound ends the run Idle

    async def mark_done(self, task: Task) -> None:
        self.drop(task.id)

    def drop(self, task_id: str) -> None:
        self.open = [t for t in self.open if t.id != task_id]

    async def aclose(self) -> None:
        return None


def what_is_open(resource: str) -> list[str]:
    """The psleak-style extras: what is open now, so the leak can be found."""
    me = psutil.Process()
    if resource == "fds":
        return [f"fd {f.fd}: {f.path}" for f in me.open_files()] + [
            f"socket {c.fd}: {c.laddr} -> {c.raddr}" for c in me.net_connections("all")
        ]
    if resource in ("threads", "python_threads"):
        return [t.name for t in threading.enumerate()]
    if resource == "children":
        return [" ".join(c.cmdline()) for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    return []
