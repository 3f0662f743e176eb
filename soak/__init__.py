"""The soak: hundreds of tasks through the real kernel, failing when any resource keeps growing.

result = SoakRunner(tasks=500).run()
result.passed, result.error, result.figures, result.samples
"""

from __future__ import annotations

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
from ._runner import SoakResult, SoakRunner
from ._sampler import Sample, SampleTable

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
