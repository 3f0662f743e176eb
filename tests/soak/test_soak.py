"""LoopSoak: hundreds of tasks through the real kernel, and proof that each bound catches its leak."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import LOOP_SOAK
from soak import (
    Bounds,
    MemoryGrowthError,
    SoakRunner,
    TranscriptGrowthError,
    UnclosedResourceError,
)
from soak._report import write_report

pytestmark = LOOP_SOAK

#: Short soaks for the self-tests: 20 tasks of warm-up, then windows of 25.
SHORT = Bounds(warmup=20, window=25)


def test_500_scripted_tasks_stay_bounded(tmp_path):
    result = SoakRunner(tasks=500).run()

    assert result.passed, result.error
    assert result.terminals == {"Completed": 500}
    rss = result.figures["kernel_rss"]
    assert rss["checked"] and rss["peak"] <= 150 << 20
    assert result.figures["transcript_bytes"]["checked"]
    written = {p.name for p in write_report(result, tmp_path / "report")}
    assert {"report.json", "summary.md", "kernel_rss.png", "kernel_fds.png", "transcript_per_task.png"} <= written


def test_one_agent_process_per_task_stays_bounded():
    result = SoakRunner(tasks=120, mode="per-task", bounds=SHORT).run()
    assert result.passed, result.error
    assert result.terminals == {"Completed": 120}


@pytest.mark.parametrize(
    ("leak", "error", "resource"),
    [
        ("fd", UnclosedResourceError, "kernel fds"),
        ("thread", UnclosedResourceError, "kernel threads"),
        ("child", UnclosedResourceError, "kernel children"),
        ("memory", MemoryGrowthError, "kernel_rss"),
        ("transcript", TranscriptGrowthError, "transcript_bytes"),
    ],
)
def test_each_check_catches_its_leak(leak, error, resource):
    result = SoakRunner(tasks=120, bounds=SHORT, inject=(leak,)).run()

    assert not result.passed
    assert isinstance(result.error, error), result.error
    assert result.error.resource == resource
    message = str(result.error)
    assert message.startswith(f"{resource}: ")
    assert "baseline" in message
    if error is MemoryGrowthError:
        assert "KiB/task" in message and "top tracemalloc growth" in message
        assert result.error.extras["tracemalloc_top"], "the leak's allocation site is reported"
    if error is UnclosedResourceError:
        assert result.error.final > result.error.baseline
        assert result.error.extras, "what is open is reported"


#: The inference agent's RSS climbs for its first ~10 tasks (KV-cache pages are touched as longer
#: prompts fill the context, 335 -> 360 MiB) and then holds: a warm-up of 12 covers that. With windows
#: of 6 tasks one 4 KiB page moves a slope by 0.7 KiB/task, so the slope limits are looser than the
#: 500-task soak's; the growth ceilings are what bound memory here. The kernel's peak ceiling is the
#: pytest process's here, which also serves the host tools over MCP (~30 MiB of imports) with
#: tracemalloc tracing every block: ~200 MiB measured.
INFERENCE = Bounds(
    warmup=12,
    kernel_peak_ceiling=400 << 20,
    window=6,
    quiet_every=6,
    kernel_rss_slope=16 * 1024,
    kernel_uss_slope=16 * 1024,
    tracemalloc_slope=4 * 1024,
    agent_rss_slope=512 * 1024,
    agent_growth_ceiling=48 << 20,
)


def test_the_inference_agent_memory_is_bounded(harness_model):
    result = SoakRunner(tasks=30, agent="inference", bounds=INFERENCE).run()

    assert result.passed, result.error
    agent = result.figures["agent_rss"]
    assert agent["checked"]
    assert agent["final"] - agent["baseline"] <= INFERENCE.agent_growth_ceiling
    assert result.terminals == {"Completed": 30}
