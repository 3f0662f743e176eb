"""The soak's bounds, and the errors that say which one broke.

    * SoakError(AssertionError)       pytest reports a failure, not an error
      + UnclosedResourceError         fds, threads, child processes not back to their baseline
      + MemoryGrowthError             RSS, USS or tracemalloc kept growing, or crossed a ceiling
      + TranscriptGrowthError         the transcript's bytes per task kept growing

Bounds (class attributes, overridable per soak, like psleak's):
  - a warm-up of `warmup` tasks is excluded from every check;
  - counters (fds, native and Python threads, child processes) must come back *exactly* to their
    baseline at quiet points (every `quiet_every` tasks), after up to `settle_retries` retries
    20 ms apart with a garbage collection each (a goleak/CPython-style settle loop);
  - memory is judged by the least-squares slope over consecutive windows after the warm-up: it
    fails only when two consecutive windows break the slope limit (one noisy window does not) and,
    for a process's memory (RSS, USS), the two together grew more than `memory_floor`: the allocator
    takes memory in steps (a 1 MiB obmalloc arena, a heap extension), which a short window reads as a
    steep slope; plus hard ceilings on growth after the warm-up and on the peak;
  - the transcript must stay a constant size per task: the mean bytes per task of two
    consecutive windows may not exceed the warm-up's by more than `transcript_growth`.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ._sampler import MISSING, SampleTable

__all__ = [
    "Bounds",
    "MemoryGrowthError",
    "SoakError",
    "TranscriptGrowthError",
    "UnclosedResourceError",
    "check_memory",
    "check_transcript",
    "slope",
    "window_slices",
]

KIB = 1024
MIB = 1024 * 1024


class SoakError(AssertionError):
    """A bound broke; `resource`, `baseline`, `final` and `extras` say which, how and what leaked."""

    def __init__(self, resource: str, message: str, *, baseline: Any, final: Any, extras: Any = None) -> None:
        super().__init__(f"{resource}: {message}")
        self.resource = resource
        self.message = message
        self.baseline = baseline
        self.final = final
        self.extras = extras


class UnclosedResourceError(SoakError):
    pass


class MemoryGrowthError(SoakError):
    pass


class TranscriptGrowthError(SoakError):
    pass


@dataclass(frozen=True)
class Bounds:
    warmup: int = 50
    window: int | None = None  # tasks per slope window; default: a quarter of what follows the warm-up
    quiet_every: int = 10
    settle_retries: int = 50
    kernel_rss_slope: float = 4 * KIB  # bytes per task
    kernel_uss_slope: float = 4 * KIB
    tracemalloc_slope: float = 1 * KIB
    kernel_growth_ceiling: float = 16 * MIB  # above the first sample after the warm-up
    kernel_peak_ceiling: float = 150 * MIB
    agent_rss_slope: float = 64 * KIB
    agent_growth_ceiling: float = 64 * MIB
    memory_floor: float = 1 * MIB  # two windows of RSS/USS must together grow more than this to count
    transcript_growth: float = 0.25  # allowed growth of the mean bytes per task

    def with_overrides(self, **overrides: Any) -> Bounds:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown bounds {sorted(unknown)} (known: {sorted(known)})")
        return replace(self, **overrides)

    def window_for(self, tasks: int) -> int:
        return self.window or max(10, (tasks - self.warmup) // 4)

    def shortest(self) -> int:
        """The fewest tasks a soak must drain for every check to judge something: the warm-up, then two
        windows (a slope bound breaks only in two consecutive windows, so one window checks nothing)."""
        return self.warmup + 2 * (self.window or 10)

    def too_short(self, tasks: int, loops: int = 1) -> str | None:
        """Why `tasks` would check nothing, or None. With `loops` loops each drains its share and is judged on
        it (the warm-up and the windows count a loop's own tasks): the smallest share must be long enough."""
        if self.warmup < 1:  # the counters' baseline is taken after the warm-up's last task: none, none taken
            return "a warm-up of at least 1 task is needed: the counters' baseline is taken at its end"
        if self.window is not None and self.window < 2:
            return f"a window of {self.window} task has no slope: give --window 2 or more"
        if tasks // loops >= self.shortest():
            return None
        judged = (f"the first {self.warmup} are the warm-up, and each bound is judged over two windows of "
                  f"{self.window or 10} after it")  # fmt: skip
        if loops == 1:
            return (f"{tasks} tasks check nothing: {judged}; drain at least {self.shortest()} tasks "
                    f"(or lower --warmup / --window)")  # fmt: skip
        return (f"{tasks} tasks over {loops} loops ({tasks // loops} a loop) check nothing: each loop is judged on "
                f"its own tasks, {judged}; drain at least {loops * self.shortest()} tasks "
                f"(or lower --warmup / --window)")  # fmt: skip

    def for_loops(self, loops: int) -> Bounds:
        """The bounds of the kernel process that `loops` loops share: judged over every loop's tasks together, so
        the warm-up and the windows are `loops` times a loop's (the window set: see `window_for`)."""
        if loops == 1:
            return self
        assert self.window is not None, "set the window first: it is fixed by the planned run"
        return replace(self, warmup=self.warmup * loops, window=self.window * loops)


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of `values` against their index (units per task)."""
    if len(values) < 2:
        return 0.0
    return statistics.linear_regression(range(len(values)), values).slope


def window_slices(tasks: int, bounds: Bounds) -> list[slice]:
    """Sample indexes of the consecutive, complete windows after the warm-up (sample i is task i+1)."""
    size = bounds.window_for(tasks)
    return [slice(start, start + size) for start in range(bounds.warmup, tasks - size + 1, size)]


def check_memory(
    table: SampleTable,
    bounds: Bounds,
    *,
    metric: str,
    limit: float,
    ceiling: float,
    peak: float | None = None,
    floor: float = 0.0,
) -> dict[str, Any]:
    """Raise MemoryGrowthError when `metric` breaks its bounds; return the figures otherwise. `floor`: two
    windows that break the slope limit count only when they also grew more than this between them."""
    values = table.column(metric)
    if len(values) <= bounds.warmup or values[-1] == MISSING:
        return {"metric": metric, "checked": False}
    after = values[bounds.warmup :]
    slopes = [slope(values[w]) for w in window_slices(len(values), bounds)]
    figures = {
        "metric": metric,
        "checked": True,
        "baseline": after[0],
        "final": after[-1],
        "peak": max(values),
        "window_slopes": [round(x, 1) for x in slopes],
        "slope": round(slope(after), 1),
        "limit": limit,
        "growth_ceiling": ceiling,
        "peak_ceiling": peak,
        "floor": floor,
    }

    def broken(message: str) -> MemoryGrowthError:
        return MemoryGrowthError(metric, message, baseline=after[0], final=after[-1], extras=figures)

    windows = window_slices(len(values), bounds)
    for (first, second), (w1, w2) in zip(itertools.pairwise(slopes), itertools.pairwise(windows), strict=True):
        grew = max(values[w2]) - min(values[w1])
        if first > limit and second > limit and grew > floor:
            raise broken(
                f"kept growing: slope {first / KIB:.1f} then {second / KIB:.1f} KiB/task in consecutive windows "
                f"(limit {limit / KIB:.1f}), {_mib(grew)} between them (floor {_mib(floor)}); baseline "
                f"{_mib(after[0])}, final {_mib(after[-1])}"
            )
    if max(after) - after[0] > ceiling:
        raise broken(
            f"grew {_mib(max(after) - after[0])} after the warm-up (ceiling {_mib(ceiling)}); "
            f"baseline {_mib(after[0])}, final {_mib(after[-1])}, slope {figures['slope'] / KIB:.1f} KiB/task"
        )
    if peak is not None and max(values) > peak:
        raise broken(f"peaked at {_mib(max(values))} (ceiling {_mib(peak)}); baseline {_mib(after[0])}")
    return figures


def check_transcript(table: SampleTable, bounds: Bounds) -> dict[str, Any]:
    """Raise TranscriptGrowthError when the bytes written per task keep growing."""
    total = table.column("transcript_bytes")
    if len(total) <= bounds.warmup + 1:
        return {"metric": "transcript_bytes", "checked": False}
    per_task = [total[0], *(b - a for a, b in itertools.pairwise(total))]
    baseline = statistics.fmean(per_task[1 : bounds.warmup] or per_task[:1])
    means = [statistics.fmean(per_task[w]) for w in window_slices(len(total), bounds)]
    allowed = baseline * (1 + bounds.transcript_growth) + 512
    figures = {
        "metric": "transcript_bytes",
        "checked": True,
        "bytes_per_task_baseline": round(baseline, 1),
        "window_means": [round(m, 1) for m in means],
        "allowed": round(allowed, 1),
        "total": total[-1],
        "slope": round(slope(total[bounds.warmup :]), 1),
    }
    for first, second in itertools.pairwise(means):
        if first > allowed and second > allowed:
            raise TranscriptGrowthError(
                "transcript_bytes",
                f"bytes per task grew from a baseline of {baseline:.0f} to {first:.0f} then {second:.0f} in "
                f"consecutive windows (allowed {allowed:.0f}); final total {total[-1]} bytes, slope "
                f"{figures['slope']:.0f} bytes/task",
                baseline=baseline,
                final=second,
                extras=figures,
            )
    return figures


def _mib(value: float) -> str:
    return f"{value / MIB:.1f} MiB"
