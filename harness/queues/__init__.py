"""Queue providers: where the loop's tasks come from. One module per host."""

from __future__ import annotations

from .._config import QueueConfig
from .memory import MemoryQueueProvider
from .protocol import QueueProvider, Task

__all__ = ["MemoryQueueProvider", "QueueProvider", "Task", "make_provider"]


def make_provider(config: QueueConfig) -> QueueProvider:
    """The provider a config names."""
    if config.provider == "memory":
        return MemoryQueueProvider.from_config(config)
    raise ValueError(f"unknown queue provider {config.provider!r}")  # the config schema prevents this
