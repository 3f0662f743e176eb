"""Queue providers: where the loop's tasks come from. One module per host."""

from __future__ import annotations

from .._config import QueueConfig
from .github import GitHubAssignedIssueProvider
from .memory import MemoryQueueProvider
from .protocol import QueueProvider, Task

__all__ = ["GitHubAssignedIssueProvider", "MemoryQueueProvider", "QueueProvider", "Task", "make_provider"]


def make_provider(config: QueueConfig, *, trigger: str = "IssueAssigned") -> QueueProvider:
    """The provider a config names, serving the queue of the role's trigger."""
    if config.provider == "github":
        return GitHubAssignedIssueProvider(config, trigger=trigger)
    return MemoryQueueProvider.from_config(config, trigger=trigger)
