"""`loop-harness soak --tasks N --report DIR`: the soak with a progress bar and a report."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._checks import Bounds
from ._report import summary, write_report

__all__ = ["register", "soak_command"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`loop-harness soak`, added to the kernel's CLI through the `loop_harness.commands` entry point."""
    soak = commands.add_parser("soak", help="drain many tasks and fail if a resource keeps growing")
    soak.add_argument("--tasks", type=int, default=500, help="tasks to drain (default 500)")
    soak.add_argument("--report", type=Path, metavar="DIR", help="write report.json, summary.md and plots here")
    soak.add_argument("--mode", choices=["shared", "per-task"], default="shared", help="agent process per run or task")
    agent = soak.add_mutually_exclusive_group()
    agent.add_argument("--agent", choices=["scripted", "inference"], default="scripted", help="one of ours")
    agent.add_argument(
        "--agent-command",
        metavar="COMMAND",
        type=_command_line,
        help='any ACP agent: its command line, split as a shell does ("python my_agent.py --flag")',
    )
    soak.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE", type=_variable,
                      help="a variable for --agent-command's agent (it gets a trimmed environment)")  # fmt: skip
    soak.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="LEAK",
        help="leak on purpose: fd, thread, child, memory, transcript, agent-fd, agent-thread (proves the checks fail)",
    )
    soak.add_argument("--warmup", type=int, help="tasks excluded from every check (default 50)")
    soak.add_argument(
        "--window", type=int, help="tasks per check window (default: a quarter of those after the warm-up)"
    )
    soak.add_argument("--json", action="store_true", help="print the summary as JSON")
    soak.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    agent = args.agent_command or args.agent
    return soak_command(tasks=args.tasks, report=args.report, mode=args.mode, agent=agent, inject=args.inject,
                        warmup=args.warmup, window=args.window, as_json=args.json,
                        agent_env=dict(args.agent_env))  # fmt: skip


def _command_line(text: str) -> list[str]:
    command = shlex.split(text)
    if not command:
        raise argparse.ArgumentTypeError("the agent's command line is empty")
    return command


def _variable(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def soak_command(
    *,
    tasks: int,
    report: Path | None,
    mode: str,
    agent: str | list[str],
    inject: list[str],
    warmup: int | None,
    as_json: bool,
    window: int | None = None,
    agent_env: dict[str, str] | None = None,
) -> int:
    """Exit 0 when every bound held, 1 when one broke, 2 when the soak could not judge anything (too short,
    a bad option, no plotting library for the report): that is said before a single task runs."""
    given = {k: v for k, v in {"warmup": warmup, "window": window}.items() if v is not None}
    console = Console(stderr=True)
    if report is not None and not _can_plot():
        print("soak: --report draws its plots with matplotlib, which is not installed: "
              "pip install 'loop-harness[soak]', or leave --report out", file=sys.stderr)  # fmt: skip
        return 2
    if any(v < 1 for v in given.values()) or tasks < 1:
        print("soak: --tasks, --warmup and --window must be at least 1", file=sys.stderr)
        return 2
    bounds = Bounds().with_overrides(**given)
    short = bounds.too_short(tasks)
    if short is not None:
        print(f"soak: {short}", file=sys.stderr)
        return 2
    from ._runner import SoakRunner  # the kernel: imported when a soak runs, not for every command's start

    try:
        runner = SoakRunner(tasks=tasks, mode=mode, agent=agent, agent_env=agent_env, bounds=bounds,
                            inject=tuple(inject))  # fmt: skip
    except ValueError as exc:  # a leak our agent cannot make for this one, an unknown leak
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    columns = (TextColumn("soak"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("soak", total=tasks)
        runner.progress = lambda done, total: progress.update(bar, completed=done)
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
    if result.error is not None:  # on stderr with --json too: a CI log shows why without parsing
        print(f"  broken bound: {result.error}", file=sys.stderr)
    return 0 if result.passed else 1


def _can_plot() -> bool:
    """Whether the report's plots can be drawn: asked before the soak, not after an hour of it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
