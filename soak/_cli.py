"""`loop-harness soak --tasks N --report DIR`: the soak with a progress bar and a report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._checks import Bounds
from ._report import summary, write_report
from ._runner import SoakRunner

__all__ = ["register", "soak_command"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`loop-harness soak`, added to the kernel's CLI through the `loop_harness.commands` entry point."""
    soak = commands.add_parser("soak", help="drain many tasks and fail if a resource keeps growing")
    soak.add_argument("--tasks", type=int, default=500, help="tasks to drain (default 500)")
    soak.add_argument("--report", type=Path, metavar="DIR", help="write report.json, summary.md and plots here")
    soak.add_argument("--mode", choices=["shared", "per-task"], default="shared", help="agent process per run or task")
    soak.add_argument("--agent", choices=["scripted", "inference"], default="scripted", help="which agent")
    soak.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="LEAK",
        help="leak on purpose: fd, thread, child, memory, transcript (proves the checks fail)",
    )
    soak.add_argument("--warmup", type=int, help="tasks excluded from every check (default 50)")
    soak.add_argument("--json", action="store_true", help="print the summary as JSON")
    soak.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return soak_command(tasks=args.tasks, report=args.report, mode=args.mode, agent=args.agent, inject=args.inject,
                        warmup=args.warmup, as_json=args.json)  # fmt: skip


def soak_command(
    *,
    tasks: int,
    report: Path | None,
    mode: str,
    agent: str,
    inject: list[str],
    warmup: int | None,
    as_json: bool,
) -> int:
    bounds = Bounds() if warmup is None else Bounds(warmup=warmup)
    console = Console(stderr=True)
    columns = (TextColumn("soak"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("soak", total=tasks)
        runner = SoakRunner(
            tasks=tasks,
            mode=mode,
            agent=agent,
            bounds=bounds,
            inject=tuple(inject),
            progress=lambda done, total: progress.update(bar, completed=done),
        )
        result = runner.run()
    if report is not None:
        for path in write_report(result, report):
            console.print(f"wrote {path}")
    if as_json:
        print(json.dumps(summary(result), default=str))
    else:
        verdict = "passed" if result.passed else "FAILED"
        print(f"soak {verdict}: {len(result.samples)}/{tasks} tasks in {result.seconds:.1f} s "
              f"({result.tasks_per_second} tasks/s), terminals {result.terminals}")  # fmt: skip
        for metric, figures in result.figures.items():
            if figures.get("checked") and "window_slopes" in figures:
                print(f"  {metric}: slope {figures['slope']:.0f} B/task, peak {figures['peak'] / 2**20:.1f} MiB")
        if result.error is not None:
            print(f"  broken bound: {result.error}", file=sys.stderr)
    return 0 if result.passed else 1
