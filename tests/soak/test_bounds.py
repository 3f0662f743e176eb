"""The soak heuristics on scripted series (no real memory): when they fail, and when they must not."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED
from soak import Bounds, MemoryGrowthError, SampleTable, TranscriptGrowthError, check_memory, check_transcript, slope

pytestmark = LOOP_SCRIPTED  # pure functions on made-up series: fast, so in every run

BOUNDS = Bounds(warmup=10, window=10)


def table(rss, transcript_per_task=100):
    rows = SampleTable(len(rss))
    total = 0
    for i, value in enumerate(rss, start=1):
        per_task = transcript_per_task(i) if callable(transcript_per_task) else transcript_per_task
        total += per_task
        rows.append((i, float(i), value, value, 10, 4, 1, value, None, None, None, total))
    return rows


def test_slope_is_least_squares():
    assert slope([1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([5]) == 0.0


def test_flat_memory_passes():
    figures = check_memory(table([1000] * 50), BOUNDS, metric="kernel_rss", limit=100, ceiling=10_000)
    assert figures["window_slopes"] == [0.0, 0.0, 0.0, 0.0]


def test_one_noisy_window_is_not_a_leak():
    rss = [1000] * 20 + [1000 + 500 * i for i in range(10)] + [5500] * 20
    check_memory(table(rss), BOUNDS, metric="kernel_rss", limit=100, ceiling=10_000)


def test_growth_in_two_consecutive_windows_fails():
    rss = [1000] * 10 + [1000 + 200 * i for i in range(40)]
    with pytest.raises(MemoryGrowthError, match=r"kept growing: slope 0\.2 then 0\.2 KiB/task"):
        check_memory(table(rss), BOUNDS, metric="kernel_rss", limit=100, ceiling=1 << 30)


KIB = 1024
#: Windows of 25 tasks after a 20-task warm-up, the per-task soak's self-test shape.
PER_TASK = Bounds(warmup=20, window=25)


def stepped(steps: dict[int, int], tasks: int = 120, base: int = 40 << 20) -> list[int]:
    """A flat series that jumps by steps[i] bytes at task i (how an allocator takes memory)."""
    values, level = [], base
    for i in range(tasks):
        level += steps.get(i, 0)
        values.append(level)
    return values


def test_allocator_steps_in_two_windows_are_not_a_leak_under_the_floor():
    """Two 128 KiB steps, one mid-window in each of two windows: each window's slope reads ~7 KiB/task, above
    the 4 KiB limit, but 0.25 MiB in all is an allocator taking memory, not a leak (the per-task soak's flake)."""
    rss = stepped({57: 128 * KIB, 82: 128 * KIB})
    with pytest.raises(MemoryGrowthError, match="kept growing"):  # judged by slope alone, it fails
        check_memory(table(rss), PER_TASK, metric="kernel_uss", limit=4 * KIB, ceiling=16 << 20)
    figures = check_memory(table(rss), PER_TASK, metric="kernel_uss", limit=4 * KIB, ceiling=16 << 20,
                           floor=1 << 20)  # fmt: skip
    assert max(figures["window_slopes"][1:3]) > 4 * KIB  # the slopes did break the limit


def test_a_steady_leak_above_the_floor_still_fails():
    rss = stepped({i: 24 * KIB for i in range(20, 120)})  # 24 KiB every task: 1.1 MiB over two windows
    with pytest.raises(MemoryGrowthError, match=r"kept growing: .* 1\.1 MiB between them \(floor 1\.0 MiB\)"):
        check_memory(table(rss), PER_TASK, metric="kernel_uss", limit=4 * KIB, ceiling=16 << 20, floor=1 << 20)


def test_a_step_beyond_the_ceiling_fails():
    rss = [1000] * 30 + [50_000] * 20
    with pytest.raises(MemoryGrowthError, match="after the warm-up"):
        check_memory(table(rss), BOUNDS, metric="kernel_rss", limit=1 << 30, ceiling=10_000)


def test_growth_during_the_warm_up_is_excluded():
    rss = [1000 * i for i in range(1, 11)] + [10_000] * 40
    check_memory(table(rss), BOUNDS, metric="kernel_rss", limit=100, ceiling=1000)


def test_a_transcript_that_grows_per_task_fails():
    with pytest.raises(TranscriptGrowthError, match="bytes per task grew"):
        check_transcript(table([1000] * 50, transcript_per_task=lambda i: 100 + 50 * i), BOUNDS)


def test_a_constant_transcript_per_task_passes():
    figures = check_transcript(table([1000] * 50, transcript_per_task=100), BOUNDS)
    assert figures["window_means"] == [100.0, 100.0, 100.0, 100.0]


def test_unknown_bounds_are_refused():
    with pytest.raises(TypeError, match="unknown bounds"):
        Bounds().with_overrides(wramup=3)


def test_a_run_judges_its_windows_by_the_planned_length_not_by_how_far_it_got():
    """CI once failed 87 tasks into a 200-task soak: mid-run checks cut 10-task windows, and two
    container resizes on top of the results' steady 0.5 KiB/task read as a leak."""
    from soak import SoakRunner

    runner = SoakRunner(tasks=200)
    assert runner.bounds.window == 37
    steady = [200_000 + 512 * i + 4096 * ((i >= 65) + (i >= 75)) for i in range(87)]
    figures = check_memory(table(steady), runner.bounds, metric="tracemalloc_current", limit=1024, ceiling=1 << 30)
    assert len(figures["window_slopes"]) == 1 and 512 < figures["window_slopes"][0] < 1024
    with pytest.raises(MemoryGrowthError, match="kept growing"):  # what the moving window did
        check_memory(table(steady), Bounds(warmup=50, window=10), metric="tracemalloc_current", limit=1024,
                     ceiling=1 << 30)  # fmt: skip
