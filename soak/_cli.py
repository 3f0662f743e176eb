"""`loop-harness soak --tasks N --report DIR`: the soak with a progress bar and a report.

`--agent inference --endpoint URL|llama-cpp-server [--model NAME] --loops N` soaks N loops at once against
one OpenAI-compatible server (`llama-cpp-server` starts llama-cpp-python's on the pinned model for the soak)
and reports their aggregate and per-loop tasks/s and completion tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._checks import Bounds
from ._report import summary, write_report

if TYPE_CHECKING:  # harness.testing loads the kernel: only when a soak runs
    from harness.testing import Endpoint

    from ._runner import SoakResult

LLAMA_CPP_SERVER = "llama-cpp-server"  # harness.testing.LLAMA_CPP_SERVER, without loading it at start

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
    soak.add_argument("--loops", type=int, default=1, help="kernel loops at once, each with its own workspace, "
                      "queue and agent, draining its share of --tasks (default 1)")  # fmt: skip
    soak.add_argument("--endpoint", metavar="URL|llama-cpp-server", help="with --agent inference: the "
                      "OpenAI-compatible server its model runs on (its base URL, http://HOST:PORT/v1), or "
                      "llama-cpp-server to start llama-cpp-python's on the pinned model")  # fmt: skip
    soak.add_argument("--model", metavar="NAME", help="with --endpoint URL: the model to ask for (default: the one "
                      "the server lists first)")  # fmt: skip
    soak.add_argument("--endpoint-args", metavar="ARGS", default="", help="with --endpoint: more inference agent "
                      "options, split as a shell does (--endpoint-args='--no-stream --read-timeout 300')")  # fmt: skip
    soak.add_argument("--count-only", action="store_true", help="drain and count tasks/s and tokens/s without "
                      "judging any bound, so any length will do (a short run against a model server)")  # fmt: skip
    soak.add_argument("--threads", type=int, default=2, help="inference: CPU threads of the local model, or of the "
                      "server llama-cpp-server starts (default 2)")  # fmt: skip
    soak.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    agent = args.agent_command or args.agent
    return soak_command(tasks=args.tasks, report=args.report, mode=args.mode, agent=agent, inject=args.inject,
                        warmup=args.warmup, window=args.window, as_json=args.json,
                        agent_env=dict(args.agent_env), loops=args.loops, endpoint=args.endpoint,
                        model=args.model, endpoint_args=shlex.split(args.endpoint_args),
                        threads=args.threads, judge=not args.count_only)  # fmt: skip


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
    loops: int = 1,
    endpoint: str | None = None,
    model: str | None = None,
    endpoint_args: list[str] | None = None,
    threads: int = 2,
    judge: bool = True,
) -> int:
    """Exit 0 when every bound held, 1 when one broke, 2 when the soak could not judge anything (too short,
    a bad option, no plotting library for the report, a server that would not start): that is said before a
    single task runs. With `judge=False` (`--count-only`) nothing is judged: 0 when every task was drained."""
    given = {k: v for k, v in {"warmup": warmup, "window": window}.items() if v is not None}
    console = Console(stderr=True)
    if report is not None and not _can_plot():
        print("soak: --report draws its plots with matplotlib, which is not installed: "
              "pip install 'loop-harness[soak]', or leave --report out", file=sys.stderr)  # fmt: skip
        return 2
    if any(v < 1 for v in given.values()) or min(tasks, loops, threads) < 1:
        print("soak: --tasks, --warmup, --window, --loops and --threads must be at least 1", file=sys.stderr)
        return 2
    wrong = _endpoint_options(agent, endpoint, model, endpoint_args or [])
    if wrong is not None:
        print(f"soak: {wrong}", file=sys.stderr)
        return 2
    if not judge and (given or inject):
        print("soak: --count-only judges no bound: --warmup, --window and --inject have nothing to do",
              file=sys.stderr)  # fmt: skip
        return 2
    bounds = Bounds().with_overrides(**given)
    short = bounds.too_short(tasks, loops) if judge else None
    if short is not None:
        print(f"soak: {short}", file=sys.stderr)
        return 2
    from ._runner import SoakRunner  # the kernel: imported when a soak runs, not for every command's start

    with contextlib.ExitStack() as stack:
        try:
            served = _serve(stack, endpoint, model, endpoint_args or [], report, threads, console)
        except _ServerUnavailable as exc:
            print(f"soak: --endpoint {endpoint}: {exc}", file=sys.stderr)
            return 2
        try:
            runner = SoakRunner(tasks=tasks, mode=mode, agent=agent, agent_env=agent_env, bounds=bounds,
                                inject=tuple(inject), loops=loops, endpoint=served, threads=threads,
                                judge=judge)  # fmt: skip
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
        _print_summary(result, tasks)
    if result.error is not None:  # on stderr with --json too: a CI log shows why without parsing
        print(f"  broken bound: {result.error}", file=sys.stderr)
    return 0 if result.passed else 1


def _print_summary(result: SoakResult, tasks: int) -> None:
    verdict = ("passed" if result.judged else "drained (no bound judged)") if result.passed else "FAILED"
    print(f"soak {verdict}: {result.done}/{tasks} tasks in {result.seconds:.1f} s "
          f"({result.tasks_per_second} tasks/s), terminals {result.terminals}")  # fmt: skip
    for metric, figures in result.figures.items():
        if figures.get("checked") and "window_slopes" in figures:
            print(f"  {metric}: slope {figures['slope']:.0f} B/task, peak {figures['peak'] / 2**20:.1f} MiB")
    total = result.throughput
    if result.loops == 1 and total.get("output_tokens") is None:
        return  # one loop, no tokens: the line above says it all
    server = f" on {result.endpoint['url']} ({result.endpoint['model']})" if result.endpoint else ""
    tokens = "" if total["output_tokens"] is None else (
        f", {total['tokens_per_second']} completion tokens/s ({total['output_tokens']} tokens)")  # fmt: skip
    print(f"  {result.loops} loop(s) at once{server}: {total['tasks_per_second']} tasks/s{tokens} in aggregate")
    for loop in result.per_loop:
        tokens = "" if loop["output_tokens"] is None else f", {loop['tokens_per_second']} tokens/s"
        print(f"    loop {loop['loop']}: {loop['done']}/{loop['tasks']} tasks in {loop['seconds']} s, "
              f"{loop['tasks_per_second']} tasks/s{tokens}")  # fmt: skip


def _endpoint_options(agent: str | list[str], endpoint: str | None, model: str | None,
                      endpoint_args: list[str]) -> str | None:  # fmt: skip
    """Why the endpoint options do not fit together, or None."""
    if endpoint is None:
        return "--model and --endpoint-args go with --endpoint" if model or endpoint_args else None
    if agent != "inference":
        return "--endpoint is the inference agent's model server: give --agent inference"
    if endpoint == LLAMA_CPP_SERVER:
        return f"{LLAMA_CPP_SERVER} serves the pinned model under its own name: leave --model out" if model else None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--endpoint {endpoint!r}: a base URL (http://HOST:PORT/v1), or {LLAMA_CPP_SERVER}"
    return None


class _ServerUnavailable(Exception):
    """The model server the soak was to start did not (the cause is the message)."""


def _serve(stack: contextlib.ExitStack, endpoint: str | None, model: str | None, endpoint_args: list[str],
           report: Path | None, threads: int, console: Console) -> Endpoint | None:  # fmt: skip
    """The soak's model server until `stack` closes (None with no --endpoint); _ServerUnavailable when the one
    it starts does not come up, before any task runs."""
    if endpoint is None:
        return None
    from harness.models import LockError, ModelHashMismatch, ModelUnavailable
    from harness.testing import serve_endpoint

    place = report or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loop-harness-soak-server-")))
    log = place / f"{LLAMA_CPP_SERVER}.log"
    if endpoint == LLAMA_CPP_SERVER:
        console.print(f"starting llama-cpp-python's server on the pinned model (log: {log})")
    try:
        return stack.enter_context(serve_endpoint(endpoint, model=model, agent_args=endpoint_args, log=log,
                                                  threads=threads))  # fmt: skip
    except (RuntimeError, OSError, LockError, ModelUnavailable, ModelHashMismatch) as exc:
        raise _ServerUnavailable(str(exc)) from None


def _can_plot() -> bool:
    """Whether the report's plots can be drawn: asked before the soak, not after an hour of it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
