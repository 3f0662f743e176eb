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
    from ._kernel import Kernel
    from ._policy import Policy, Turn, Verdict
    from ._records import RecordType, transcript_schema
    from ._results import RunResult, TaskResult
    from ._terminals import EXIT_CODE, REASON_KINDS, Stop, Terminal
    from ._transcript import Transcript, read_transcript
    from ._turns import CONTINUE_PROMPT, STANDING_PROMPT
    from .queues import MemoryQueueProvider, QueueProvider, Task

_EXPORTS = {
    "._config": ("Config", "load_config", "parse_config"),
    "._exceptions": ("ConfigError", "HarnessError", "HostRejected", "HostSignal", "HostUnauthorized",
                     "HostUnavailable", "RateLimited"),
    "._kernel": ("Kernel",),
    "._policy": ("Policy", "Turn", "Verdict"),
    "._records": ("RecordType", "transcript_schema"),
    "._results": ("RunResult", "TaskResult"),
    "._terminals": ("EXIT_CODE", "REASON_KINDS", "Stop", "Terminal"),
    "._transcript": ("Transcript", "read_transcript"),
    "._turns": ("CONTINUE_PROMPT", "STANDING_PROMPT"),
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
