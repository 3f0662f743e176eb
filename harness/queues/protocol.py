"""What the kernel needs from a host: the assigned tasks in order, and marking one done.

Providers signal trouble by raising `RateLimited`, `HostUnavailable` or
`HostUnauthorized` (harness.config._exceptions); the kernel owns retries, back-off
and the Blocked* terminals, so every provider gets the same semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from ..config._config import Trigger

__all__ = ["HostToolProvider", "QueueProvider", "Task", "TaskKind", "Trigger"]


class TaskKind(StrEnum):
    ISSUE = "issue"  # from IssueAssigned
    PROPOSAL = "proposal"  # from ProposalAwaitingReview


@dataclass(frozen=True)
class Task:
    id: str
    title: str = ""
    body: str = ""
    kind: TaskKind = TaskKind.ISSUE
    branch: str = ""  # a proposal's head branch


class QueueProvider(Protocol):
    name: str

    async def check_authorized(self) -> None:
        """Raise HostUnauthorized if our credentials do not work (checked before any task)."""

    async def list_tasks(self) -> list[Task]:
        """The open work for the role's trigger, in the configured order: issues assigned to the
        agent (IssueAssigned), or proposals whose review is requested from it (ProposalAwaitingReview)."""

    async def mark_done(self, task: Task) -> None:
        """Close or delete a completed task on the host (may fail: the kernel skips it anyway)."""

    async def aclose(self) -> None:
        """Release connections."""


@runtime_checkable
class HostToolProvider(QueueProvider, Protocol):
    """A host that also serves the host tools' operations (both shipped providers do; a queue of your
    own need not: the tools that need these then answer the agent that the host does not support them)."""

    async def open_proposal(self, task: Task, *, title: str, body: str, head: str) -> dict[str, Any]:
        """Open a proposal (pull request) from `head` for an issue task: its number and URL."""

    async def submit_review(self, task: Task, *, verdict: str, body: str) -> dict[str, Any]:
        """Submit a review of a proposal task: approve, request_changes or comment."""

    async def commits_status(self, ref: str) -> dict[str, Any]:
        """The combined check status of a commit or branch."""
