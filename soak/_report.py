"""The soak report: `report.json`, a Markdown summary, and one PNG plot per metric with its bound drawn."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._checks import MIB

if TYPE_CHECKING:  # the runner loads the kernel: a type here, not an import at start
    from ._runner import SoakResult

__all__ = ["PLOTTED", "write_report"]

#: metric -> (title, unit divisor, unit)
PLOTTED: dict[str, tuple[str, float, str]] = {
    "kernel_rss": ("kernel RSS", MIB, "MiB"),
    "kernel_uss": ("kernel USS", MIB, "MiB"),
    "tracemalloc_current": ("kernel tracemalloc (Python heap)", MIB, "MiB"),
    "kernel_fds": ("kernel open file descriptors", 1, "fds"),
    "kernel_threads": ("kernel threads", 1, "threads"),
    "kernel_children": ("kernel child processes", 1, "processes"),
    "agent_rss": ("agent RSS", MIB, "MiB"),
    "transcript_per_task": ("transcript bytes per task", 1, "bytes"),
}


def write_report(result: SoakResult, directory: Path) -> list[Path]:
    """Write the report files into `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [_write_json(result, directory / "report.json"), _write_markdown(result, directory / "summary.md")]
    written += _write_plots(result, directory)
    return written


def summary(result: SoakResult) -> dict[str, Any]:
    return {
        "passed": result.passed,
        "judged": result.judged,
        "error": None if result.error is None else {"resource": result.error.resource, "message": str(result.error)},
        "mode": result.mode,
        "agent": result.agent,
        "tasks": result.tasks,
        "tasks_sampled": len(result.samples),
        "seconds": round(result.seconds, 2),
        "tasks_per_second": result.tasks_per_second,
        "terminals": result.terminals,
        "bounds": asdict(result.bounds),
        "figures": result.figures,
        "targets": targets(result),
        "loops": result.loops,
        "endpoint": result.endpoint,
        "throughput": result.throughput,
        "per_loop": result.per_loop,
    }


#: The soak's performance targets (issue 4): reported as met or missed, never a failure by themselves.
TARGETS = {"seconds_per_500_tasks": 60.0, "kernel_rss_slope_per_task": 1024.0, "kernel_rss_peak": 150 * MIB}


def targets(result: SoakResult) -> dict[str, dict[str, Any]]:
    """Each target with the measured figure; the scripted agent's only (the model sets its own pace), one loop."""
    rss = result.figures.get("kernel_rss") or {}
    if result.agent != "scripted" or result.loops != 1 or not rss.get("checked") or not result.samples:
        return {}
    measured = {
        "seconds_per_500_tasks": round(result.seconds / len(result.samples) * 500, 1),
        "kernel_rss_slope_per_task": rss["slope"],
        "kernel_rss_peak": rss["peak"],
    }
    return {name: {"measured": value, "target": TARGETS[name], "met": value <= TARGETS[name]}
            for name, value in measured.items()}  # fmt: skip


def _write_json(result: SoakResult, path: Path) -> Path:
    data = {**summary(result), "samples": [asdict(s) for s in result.samples]}
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def _write_markdown(result: SoakResult, path: Path) -> Path:
    verdict = ("passed" if result.judged else "drained, no bound judged") if result.passed else "FAILED"
    lines = [
        f"# Soak: {verdict}",
        "",
        f"{result.done} of {result.tasks} tasks, mode `{result.mode}`, agent `{result.agent}`, "
        f"{result.seconds:.1f} s ({result.tasks_per_second} tasks/s). Terminals: {result.terminals}.",
        "",
    ]
    if result.error is not None:
        lines += ["## Broken bound", "", "```", str(result.error), "```", ""]
    lines += _throughput_lines(result)
    if any(f.get("checked") and metric != "kernel_counters" for metric, f in result.figures.items()):
        lines += [
            "## Memory and transcript",
            "",
            "| metric | baseline | final | peak | slope/task | window slopes | limit/task |",
            "|---|---|---|---|---|---|---|",
        ]
    for metric, figures in result.figures.items():
        if not figures.get("checked") or metric == "kernel_counters":
            continue
        if metric == "transcript_bytes":
            lines.append(
                f"| transcript bytes/task | {figures['bytes_per_task_baseline']} | {figures['window_means'][-1:]} | "
                f"total {figures['total']} | {figures['slope']} B | {figures['window_means']} | "
                f"≤ {figures['allowed']} B |"
            )
            continue
        lines.append(
            f"| {metric} | {_fmt(figures['baseline'])} | {_fmt(figures['final'])} | {_fmt(figures['peak'])} | "
            f"{figures['slope']:.0f} B | {figures['window_slopes']} | {figures['limit']:.0f} B |"
        )
    met = targets(result)
    if met:
        lines += ["", "## Against the targets", "", "| figure | measured | target | |", "|---|---|---|---|"]
        units = {"seconds_per_500_tasks": (1, "s"), "kernel_rss_slope_per_task": (1024, "KiB/task"),
                 "kernel_rss_peak": (MIB, "MiB")}  # fmt: skip
        for name, t in met.items():
            scale, unit = units[name]
            lines.append(f"| {name} | {t['measured'] / scale:.2f} {unit} | ≤ {t['target'] / scale:.0f} {unit} | "
                         f"{'met' if t['met'] else 'MISSED'} |")  # fmt: skip
    b = result.bounds
    each = "" if result.loops == 1 else f" (a loop's own tasks; the kernel's: all {result.loops} loops' together)"
    lines += [
        "",
        f"Bounds: warm-up {b.warmup} tasks excluded; counters back to their baseline every {b.quiet_every} tasks "
        f"(up to {b.settle_retries} settle retries); memory fails when two consecutive windows of "
        f"{b.window_for(result.tasks)} tasks{each} break the slope limit, or on the growth ceiling "
        f"({_fmt(b.kernel_growth_ceiling)} kernel, {_fmt(b.agent_growth_ceiling)} agent) or the kernel's peak "
        f"ceiling ({_fmt(b.kernel_peak_ceiling)})."
        if result.judged
        else "Bounds: none judged (`--count-only`): the samples are plotted, not checked.",
        "",
        "Plots: " + ", ".join(f"`{name}.png`" for name in PLOTTED),
        "",
    ]
    path.write_text("\n".join(lines))
    return path


def _throughput_lines(result: SoakResult) -> list[str]:
    """Tasks/s and completion tokens/s, all the loops together and each; with several loops, what each
    loop's own bounds measured."""
    total = result.throughput
    if not total:
        return []
    server = f" on `{result.endpoint['url']}` (model `{result.endpoint['model']}`)" if result.endpoint else ""
    tokens = ("no completion tokens reported by the agent" if total["output_tokens"] is None else
              f"{total['output_tokens']} completion tokens, {total['tokens_per_second']} tokens/s "
              f"({total['tasks_with_tokens']} tasks reported them)")  # fmt: skip
    lines = [
        "## Throughput",
        "",
        f"{total['loops']} loop(s) at once{server}: {total['done']} tasks in {total['seconds']} s, "
        f"{total['tasks_per_second']} tasks/s; {tokens}.",
        "",
        "| loop | tasks | seconds | tasks/s | completion tokens | tokens/s | terminals |",
        "|---|---|---|---|---|---|---|",
    ]
    for loop in result.per_loop:
        lines.append(f"| {loop['loop']} | {loop['done']} of {loop['tasks']} | {loop['seconds']} | "
                     f"{loop['tasks_per_second']} | {loop['output_tokens']} | {loop['tokens_per_second']} | "
                     f"{loop['terminals']} |")  # fmt: skip
    judged = [(loop["loop"], loop["figures"]) for loop in result.per_loop if loop.get("figures")]
    if judged:
        lines += ["", "Each loop's own bounds (its agent, its transcript):", "",
                  "| loop | agent RSS baseline | final | slope/task | transcript bytes/task (baseline, windows) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for number, figures in judged:
            rss, transcript = figures.get("agent_rss") or {}, figures.get("transcript_bytes") or {}
            memory = (f"{_fmt(rss['baseline'])} | {_fmt(rss['final'])} | {rss['slope']:.0f} B"
                      if rss.get("checked") else "not measured | | ")  # fmt: skip
            written = (f"{transcript['bytes_per_task_baseline']}, {transcript['window_means']}"
                       if transcript.get("checked") else "not judged")  # fmt: skip
            lines.append(f"| {number} | {memory} | {written} |")
    counters = result.figures.get("kernel_counters")
    if counters:
        lines += ["", f"The kernel's fds, threads and children before the loops started: {counters['before']}; "
                  f"after all had ended: {counters['after']}."]  # fmt: skip
    return [*lines, ""]


def _write_plots(result: SoakResult, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    samples = result.samples
    tasks = [s.task for s in samples]
    written = []
    for metric, (title, scale, unit) in PLOTTED.items():
        values = _series(result, metric)
        if not values or all(v is None for v in values):
            continue
        figure, axes = pyplot.subplots(figsize=(8, 3.5))
        axes.plot(tasks[: len(values)], [float("nan") if v is None else v / scale for v in values], linewidth=1)
        axes.axvspan(0, result.bounds.warmup, color="0.9", label="warm-up (excluded)")
        slope_limit = _slope_line(result, metric)
        if slope_limit is not None:  # the bound that decides: growth at the limit from the baseline on
            (x0, y0), (x1, y1) = slope_limit
            axes.plot([x0, x1], [y0 / scale, y1 / scale], color="tab:purple", linestyle=":", linewidth=1.2,
                      label="slope limit from the baseline")  # fmt: skip
        low, high = axes.get_ylim()  # the run's own range: a far-off ceiling would flatten it to a line
        for (label, value), color in zip(_bound_lines(result, metric), ("tab:red", "tab:orange"), strict=False):
            if low <= value / scale <= high + (high - low):
                axes.axhline(value / scale, color=color, linestyle="--", linewidth=1, label=label)
            else:
                axes.plot([], [], color=color, linestyle="--", label=f"{label}: {value / scale:.1f} {unit} (off scale)")
        axes.set_title(f"{title} over {len(samples)} tasks ({result.mode}, {result.agent})")
        axes.set_xlabel("tasks completed")
        axes.set_ylabel(unit)
        axes.legend(loc="best", fontsize="small")
        figure.tight_layout()
        path = directory / f"{metric}.png"
        figure.savefig(path, dpi=90)
        pyplot.close(figure)
        written.append(path)
    return written


def _series(result: SoakResult, metric: str) -> list[Any]:
    if metric == "transcript_per_task":
        totals = [s.transcript_bytes for s in result.samples]
        return [totals[0], *(b - a for a, b in itertools.pairwise(totals))] if totals else []
    return [getattr(s, metric) for s in result.samples]


def _bound_lines(result: SoakResult, metric: str) -> list[tuple[str, float]]:
    """The bound to draw: the baseline for counters, ceilings for memory, the allowance for transcripts."""
    b = result.bounds
    after = [s for s in result.samples if s.task > b.warmup]
    if not after:
        return []
    first = after[0]
    if metric in ("kernel_fds", "kernel_threads", "kernel_children"):
        return [("baseline (must return to it)", getattr(first, metric))]
    if metric in ("kernel_rss", "kernel_uss", "tracemalloc_current"):
        lines = [("growth ceiling", getattr(first, metric) + b.kernel_growth_ceiling)]
        return lines + ([("peak ceiling", b.kernel_peak_ceiling)] if metric == "kernel_rss" else [])
    if metric == "agent_rss" and first.agent_rss is not None:
        return [("growth ceiling", first.agent_rss + b.agent_growth_ceiling)]
    if metric == "transcript_per_task" and result.figures.get("transcript_bytes", {}).get("checked"):
        return [("allowed bytes/task", result.figures["transcript_bytes"]["allowed"])]
    return []


def _slope_line(result: SoakResult, metric: str) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """From the first sample after the warm-up, growth at the metric's slope limit to the last task."""
    limits = {"kernel_rss": "kernel_rss_slope", "kernel_uss": "kernel_uss_slope",
              "tracemalloc_current": "tracemalloc_slope", "agent_rss": "agent_rss_slope"}  # fmt: skip
    b = result.bounds
    after = [s for s in result.samples if s.task > b.warmup and getattr(s, metric, None) is not None]
    if metric not in limits or len(after) < 2:
        return None
    per_task = getattr(b, limits[metric])
    first, last = after[0], after[-1]
    start = getattr(first, metric)
    return (first.task, start), (last.task, start + per_task * (last.task - first.task))


def _fmt(value: float) -> str:
    return f"{value / MIB:.1f} MiB" if value >= MIB else f"{value:.0f}"
