"""loop-harness: run one ACP coding agent unattended against a git workspace.

    from harness import Kernel, load_config
    result = asyncio.run(Kernel(load_config("loop.yaml")).run())
    result.terminal, result.reason, result.tasks

Exports load on first use: the kernel pulls in the ACP SDK (about a second to import), which
`loop-harness models ...` or a config error on the command line never need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config._config import Config, load_config, parse_config
    from .config._exceptions import (
        ConfigError,
        HarnessError,
        HostRejected,
        HostSignal,
        HostUnauthorized,
        HostUnavailable,
        RateLimited,
    )
    from .kernel._kernel import Kernel
    from .kernel._turns import CONTINUE_PROMPT, STANDING_PROMPT
    from .policy._policy import Policy, Turn, Verdict
    from .queues import MemoryQueueProvider, QueueProvider, Task
    from .record._records import RecordType, transcript_schema
    from .record._results import RunResult, TaskResult
    from .record._terminals import EXIT_CODE, REASON_KINDS, Stop, Terminal
    from .record._transcript import Transcript, read_transcript

_EXPORTS = {
    ".config._config": ("Config", "load_config", "parse_config"),
    ".config._exceptions": ("ConfigError", "HarnessError", "HostRejected", "HostSignal", "HostUnauthorized",
                            "HostUnavailable", "RateLimited"),
    ".kernel._kernel": ("Kernel",),
    ".policy._policy": ("Policy", "Turn", "Verdict"),
    ".record._records": ("RecordType", "transcript_schema"),
    ".record._results": ("RunResult", "TaskResult"),
    ".record._terminals": ("EXIT_CODE", "REASON_KINDS", "Stop", "Terminal"),
    ".record._transcript": ("Transcript", "read_transcript"),
    ".kernel._turns": ("CONTINUE_PROMPT", "STANDING_PROMPT"),
    ".queues": ("MemoryQueueProvider", "QueueProvider", "Task"),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "CONTINUE_PROMPT",
    "EXIT_CODE",
    "REASON_KINDS",
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
    "RecordType",
    "RunResult",
    "Stop",
    "Task",
    "TaskResult",
    "Terminal",
    "Transcript",
    "Turn",
    "Verdict",
    "load_config",
    "parse_config",
    "read_transcript",
    "transcript_schema",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
