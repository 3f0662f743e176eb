"""One sample per task: the kernel process, the agent process, and the transcript bytes written."""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc
from array import array
from dataclasses import dataclass, fields
from typing import Any

import psutil

from harness.conformance._process_tree import AgentCounters, ExactCounters, agent_counters, agent_tree, live_children

__all__ = [
    "MISSING",
    "AgentCounters",
    "Counters",
    "ExactCounters",
    "Sample",
    "SampleTable",
    "agent_counters",
    "agent_tree",
    "kernel_counters",
    "take_sample",
]


@dataclass(frozen=True)
class Counters(ExactCounters):
    """The kernel process's."""

    fds: int
    threads: int  # native threads of the kernel process
    python_threads: int
    children: int  # live (non-zombie) descendants


@dataclass(frozen=True, slots=True)
class Sample:
    task: int  # tasks completed when the sample was taken
    seconds: float  # since the soak started
    kernel_rss: int
    kernel_uss: int
    kernel_fds: int
    kernel_threads: int
    kernel_children: int
    tracemalloc_current: int
    agent_rss: int | None
    agent_fds: int | None
    agent_threads: int | None
    transcript_bytes: int


FIELDS = tuple(f.name for f in fields(Sample))
MISSING = -1  # agent metrics of a sample taken with no agent


class SampleTable:
    """Samples stored in columns allocated up front, so taking one allocates nothing.

    The soak measures the process it runs in: bookkeeping that grew by a few hundred bytes per
    sample would itself look like a leak to tracemalloc (CPython's -R harness avoids this too).
    """

    def __init__(self, capacity: int) -> None:
        self._columns: dict[str, array[Any]] = {
            name: array("d" if name == "seconds" else "q", bytes(8 * capacity)) for name in FIELDS
        }
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, values: tuple[float | None, ...]) -> None:
        for name, value in zip(FIELDS, values, strict=True):
            self._columns[name][self._count] = MISSING if value is None else value
        self._count += 1

    def column(self, name: str) -> array[Any]:
        """One metric over the samples taken so far (a compact copy: no per-sample objects)."""
        return self._columns[name][: self._count]

    def rows(self) -> list[Sample]:
        """The samples as objects (built on demand, for the checks and the report)."""
        rows = []
        for i in range(self._count):
            values: dict[str, Any] = {name: column[i] for name, column in self._columns.items()}
            for name in ("agent_rss", "agent_fds", "agent_threads"):
                values[name] = None if values[name] == MISSING else values[name]
            rows.append(Sample(**values))
        return rows


def kernel_counters(process: psutil.Process | None = None) -> Counters:
    process = process or psutil.Process()
    return Counters(
        fds=process.num_fds(),
        threads=process.num_threads(),
        python_threads=threading.active_count(),
        children=len(live_children(process)),
    )


def take_sample(
    task: int, started: float, agent: psutil.Process | None, transcript_bytes: int
) -> tuple[float | None, ...]:
    """The values of one Sample, in field order (a tuple: SampleTable stores them in place)."""
    me = psutil.Process()
    memory = me.memory_full_info()
    counters = kernel_counters(me)
    agent_rss: int | None = None
    agent_fds: int | None = None
    agent_threads: int | None = None
    if agent is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            agent_rss, agent_fds, agent_threads = agent_tree(agent)
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return (task, time.monotonic() - started, memory.rss, memory.uss, counters.fds, counters.threads,
            counters.children, traced, agent_rss, agent_fds, agent_threads, transcript_bytes)  # fmt: skip
