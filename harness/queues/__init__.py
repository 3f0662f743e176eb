"""Queue providers: where the loop's tasks come from. One module per host."""

from __future__ import annotations

from ..config._config import GitHubQueueConfig, QueueConfig
from .github import GitHubAssignedIssueProvider, GitHubProvider
from .memory import MemoryQueueProvider
from .protocol import HostToolProvider, QueueProvider, Task, TaskKind, Trigger

__all__ = [
    "GitHubAssignedIssueProvider",
    "GitHubProvider",
    "HostToolProvider",
    "MemoryQueueProvider",
    "QueueProvider",
    "Task",
    "TaskKind",
    "Trigger",
    "make_provider",
]


def make_provider(config: QueueConfig, *, trigger: Trigger = Trigger.ISSUE_ASSIGNED) -> QueueProvider:
    """The provider a config names, serving the queue of the role's trigger."""
    if isinstance(config, GitHubQueueConfig):
        return GitHubProvider(config, trigger=trigger)
    return MemoryQueueProvider.from_config(config, trigger=trigger)
