"""loop-harness: run one ACP coding agent unattended against a git workspace.

from harness import Kernel, load_config
result = asyncio.run(Kernel(load_config("loop.yaml")).run())
result.terminal, result.reason, result.tasks
"""

from __future__ import annotations

from ._config import Config, load_config, parse_config
from ._exceptions import (
    ConfigError,
    HarnessError,
    HostRejected,
    HostSignal,
    HostUnauthorized,
    HostUnavailable,
    RateLimited,
)
from ._kernel import CONTINUE_PROMPT, STANDING_PROMPT, Kernel
from ._policy import Policy, Verdict
from ._results import RunResult, TaskResult
from ._terminals import EXIT_CODE, Stop, Terminal
from ._transcript import Transcript, read_transcript
from .queues import MemoryQueueProvider, QueueProvider, Task

__all__ = [
    "CONTINUE_PROMPT",
    "EXIT_CODE",
    "STANDING_PROMPT",
    "Config",
    "ConfigError",
    "HarnessError",
    "HostRejected",
    "HostSignal",
    "HostUnauthorized",
    "HostUnavailable",
    "Kernel",
    "MemoryQueueProvider",
    "Policy",
    "QueueProvider",
    "RateLimited",
    "RunResult",
    "Stop",
    "Task",
    "TaskResult",
    "Terminal",
    "Transcript",
    "Verdict",
    "load_config",
    "parse_config",
    "read_transcript",
]
