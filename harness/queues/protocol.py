"""What the kernel needs from a host: the assigned tasks in order, and marking one done.

Providers signal trouble by raising `RateLimited`, `HostUnavailable` or
`HostUnauthorized` (harness._exceptions); the kernel owns retries, back-off
and the Blocked* terminals, so every provider gets the same semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["QueueProvider", "Task"]


@dataclass(frozen=True)
class Task:
    id: str
    title: str = ""
    body: str = ""
    kind: str = "issue"  # "issue" (IssueAssigned) or "proposal" (ProposalAwaitingReview)
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
