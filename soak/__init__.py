"""The soak: hundreds of tasks through the real kernel, failing when any resource keeps growing.

result = SoakRunner(tasks=500).run()
result.passed, result.error, result.figures, result.samples
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._checks import (
    Bounds,
    MemoryGrowthError,
    SoakError,
    TranscriptGrowthError,
    UnclosedResourceError,
    check_memory,
    check_transcript,
    slope,
)
from ._inject import INJECTABLE
from ._sampler import Sample, SampleTable

if TYPE_CHECKING:
    from ._runner import SoakResult, SoakRunner

__all__ = [
    "INJECTABLE",
    "Bounds",
    "MemoryGrowthError",
    "Sample",
    "SampleTable",
    "SoakError",
    "SoakResult",
    "SoakRunner",
    "TranscriptGrowthError",
    "UnclosedResourceError",
    "check_memory",
    "check_transcript",
    "slope",
]


def __getattr__(name: str) -> Any:
    """The runner loads the kernel (the ACP SDK alone is half a second): only when it is asked for, so that
    `loop-harness` commands that register the soak's command start without it."""
    if name not in ("SoakResult", "SoakRunner"):
        raise AttributeError(f"module 'soak' has no attribute {name!r}")
    value = getattr(importlib.import_module("._runner", __name__), name)
    globals()[name] = value
    return value
