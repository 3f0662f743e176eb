"""`loop-harness`: the command line, a thin shell over the library.

    loop-harness run CONFIG.yaml [--json] [--task ID | --prompt TEXT] [--transcript PATH]
    loop-harness bench kernel [--tasks N] [--sandbox | --outside]
    loop-harness bench changes
    loop-harness bench boundary
    loop-harness limits CONFIG.yaml [--json]
    loop-harness check [--json] -- AGENT_COMMAND...
    loop-harness serve [--host H] [--port N] [--state DIR]

Exit status of `run`: 0 when the run ends `Idle` or `Completed`, 1 for any
other terminal, 2 for a config that cannot be used (the message names the key).
With `--json` the last line of stdout is one JSON object describing the run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import signal
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .bench import register as register_bench
from .config._config import NO_QUEUE, load_config
from .config._exceptions import ConfigError
from .conformance._check_cli import register as register_check
from .fake_model._cli import register as register_fake_model
from .server._cli import register as register_serve

if TYPE_CHECKING:  # the kernel (and the ACP SDK) load only for `run`
    from .kernel._kernel import Kernel
    from .record._results import RunResult

__all__ = ["COMMANDS_GROUP", "main"]

#: Entry points in this group are `register(subparsers)` functions adding a command (`set_defaults(handler=...)`).
COMMANDS_GROUP = "loop_harness.commands"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "agent":
        from .inference import serve

        return serve(
            model=args.model,
            seed=args.seed,
            threads=args.threads,
            max_tokens=args.max_tokens,
            max_steps=args.max_steps,
            trace=args.trace,
            endpoint=args.endpoint,
            stream=args.stream,
            connect_timeout=args.connect_timeout,
            read_timeout=args.read_timeout,
            n_ctx=args.n_ctx,
        )
    if args.command == "limits":
        return _limits(args)
    if args.command == "models":
        from ._models_cli import models_command

        return models_command(args.action, args.name)
    handler = getattr(args, "handler", None)
    if handler is not None:  # a command another package registered (loop_harness.commands)
        return int(handler(args))
    parser.print_help(sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loop-harness", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, nargs=0, help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command")

    run = commands.add_parser("run", help="drain the configured queue once and exit")
    run.add_argument("config", type=Path, help="the run config (YAML)")
    run.add_argument("--json", action="store_true", help="print the run as one JSON object on the last line")
    target = run.add_mutually_exclusive_group()
    target.add_argument("--task", metavar="ID", help="run only this task (ends Completed when it completes)")
    target.add_argument("--prompt", metavar="TEXT", help="run one prompt with no queue (ends EndTurn)")
    run.add_argument("--transcript", type=Path, metavar="PATH", help="write the JSONL transcript here")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    agent = commands.add_parser("agent", help="serve an agent on stdio (ACP)")
    agent.add_argument("which", choices=["inference"], help="the inference agent (local llama.cpp, or --endpoint)")
    agent.add_argument("--model", metavar="NAME", help="a model in models.lock (default: its default); with "
                       "--endpoint, the model the server serves (default: the one it lists first); "
                       "else $LOOP_HARNESS_MODEL")  # fmt: skip
    agent.add_argument("--endpoint", metavar="URL", help="an OpenAI-compatible server's base URL (e.g. "
                       "http://127.0.0.1:8080/v1): its chat completions instead of the local model; else "
                       "$LOOP_HARNESS_ENDPOINT")  # fmt: skip
    agent.add_argument("--no-stream", dest="stream", action="store_false", help="with --endpoint: ask for whole "
                       "answers (for servers that cannot stream tool calls, such as llama-cpp-python's)")  # fmt: skip
    agent.add_argument("--connect-timeout", type=float, metavar="S", help="with --endpoint: seconds to connect "
                       "(default 5)")  # fmt: skip
    agent.add_argument("--read-timeout", type=float, metavar="S", help="with --endpoint: seconds without a byte "
                       "from the server (default 120)")  # fmt: skip
    agent.add_argument("--n-ctx", type=int, metavar="N", help="context size (default 4096; with --endpoint, "
                       "what the server reports, else 4096)")  # fmt: skip
    agent.add_argument("--seed", type=int, default=42, help="sampling seed (default 42)")
    agent.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    agent.add_argument("--max-tokens", type=int, default=512, help="token budget per prompt turn (default 512)")
    agent.add_argument("--max-steps", type=int, default=6, help="model steps per prompt turn (default 6)")
    agent.add_argument("--trace", metavar="FILE", help="append every completion (prompt, text, timings) as JSONL; "
                       "with --endpoint, every request's body, answer, usage and timings")  # fmt: skip

    limits = commands.add_parser("limits", help="the resolved budgets and stall rules, each with its source")
    limits.add_argument("config", type=Path, help="the run config (YAML)")
    limits.add_argument("--json", action="store_true", help="print them as one JSON object")

    models = commands.add_parser("models", help="the pinned models in models.lock")
    models.add_argument(
        "action", choices=["fetch", "verify", "path"], help="fetch+verify, verify the cache, print the path"
    )
    models.add_argument("name", nargs="?", help="a model in models.lock (default: its default)")

    register_bench(commands)
    register_check(commands)
    register_serve(commands)
    register_fake_model(commands)

    # Commands from other packages (the soak's `soak`): each registers its own parser and handler, so
    # the kernel's CLI imports none of them.
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            entry.load()(commands)
        except Exception as exc:  # a broken plugin loses its own command, never `run`
            print(f"loop-harness: command {entry.name!r} ({entry.value}) not loaded: {exc!r}", file=sys.stderr)
    return parser


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _config_error(args, exc)
    from ._display import RunDisplay
    from .kernel._kernel import Kernel

    if args.prompt is None and not config.queue_written:  # the contract's default: an empty queue, Idle, exit 0
        print(f"warning: queue: {NO_QUEUE}", file=sys.stderr)
    display = None if args.quiet else RunDisplay()
    kernel = Kernel(
        config,
        transcript_path=args.transcript,
        observer=display,
        interactive_handler=_ask_on_terminal if sys.stdin.isatty() else None,
    )
    try:
        result = asyncio.run(_run_with_signals(kernel, task_id=args.task, prompt=args.prompt))
    except ConfigError as exc:  # e.g. a transcripts directory that cannot be written
        return _config_error(args, exc)
    finally:
        if display is not None:
            display.close()
    if args.json:
        from .record._transcript import finite_numbers  # loaded with the kernel already

        print(json.dumps(finite_numbers(result.to_json()), allow_nan=False))  # strict JSON: NaN as a string
    else:
        _print_summary(result)
    return result.exit_code


def _limits(args: argparse.Namespace) -> int:
    """The resolved stack: every budget and stall key, its value and where it came from, then warnings."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _config_error(args, exc)
    limits = config.resolved_limits()
    if args.json:
        print(json.dumps(limits))
        return 0
    width = max(len(key) for key in limits["values"])
    for key, value in limits["values"].items():
        shown = "null (off)" if value is None else json.dumps(value)
        print(f"{key:<{width}}  {shown:<14}  {limits['sources'][key]}")
    for warning in limits["warnings"]:
        print(f"warning: {warning}")
    return 0


def _config_error(args: argparse.Namespace, exc: ConfigError) -> int:
    print(f"loop-harness: config error in {args.config}: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps({"error": {"kind": "config", "key": exc.key, "message": str(exc)}}))
    return 2


async def _run_with_signals(kernel: Kernel, *, task_id: str | None, prompt: str | None) -> RunResult:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, kernel.cancel)
    try:
        return await kernel.run(task_id=task_id, prompt=prompt)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _print_summary(result: RunResult) -> None:
    from rich.console import Console

    from ._display import summary_table

    console = Console(highlight=False)
    console.print(summary_table(result))
    console.print(f"reason: {json.dumps(result.reason)}")
    console.print(f"transcript: {result.transcript}")


async def _ask_on_terminal(params: dict[str, Any]) -> dict[str, Any]:
    """The interactive path (an empty rule list): ask the person at the terminal."""
    call = params["toolCall"]
    options = params["options"]
    lines = [f"\nThe agent asks: {call.get('title', call.get('toolCallId'))} ({call.get('kind', 'other')})"]
    lines += [f"  [{i}] {o['name']} ({o['kind']})" for i, o in enumerate(options, start=1)]
    lines.append("choose a number (anything else cancels): ")
    answer = await _read_line("\n".join(lines))
    if answer.strip().isdigit() and 1 <= int(answer) <= len(options):
        return {"outcome": "selected", "optionId": options[int(answer) - 1]["optionId"]}
    return {"outcome": "cancelled"}


async def _read_line(prompt: str) -> str:
    """input() on a daemon thread: a cancelled question must not keep the process from exiting
    (asyncio.to_thread's executor thread would be waited for at shutdown)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def ask() -> None:
        try:
            text = input(prompt)
        except EOFError:
            text = ""
        loop.call_soon_threadsafe(_settle, answer, text)

    threading.Thread(target=ask, daemon=True, name="interactive-permission").start()
    return await answer


def _settle(answer: asyncio.Future[str], text: str) -> None:
    """Answer the prompt unless it was already settled (cancelled by the run's end)."""
    if not answer.done():
        answer.set_result(text)


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked (not at every start)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        try:
            version = importlib.metadata.version("loop-harness")
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed)"
        print(f"{parser.prog} {version}")
        parser.exit()


if __name__ == "__main__":
    sys.exit(main())
