"""`loop-harness check [OPTIONS] -- AGENT_COMMAND...`: the conformance check's command line.

A table on stderr (one row per invariant: status and evidence), `--json` for CI (the last line of stdout),
exit 0 when no check failed, 1 when one did, 2 for a command line that cannot be used (or a check that could
not run at all).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check",
        help="check any ACP agent against the invariants an unattended loop depends on",
        usage="loop-harness check [options] -- AGENT_COMMAND [ARGS...]",
    )
    check.add_argument("agent", nargs=argparse.REMAINDER, help="the agent's command line (after --)")
    check.add_argument("--json", action="store_true", help="print the results as one JSON object (last line)")
    check.add_argument("--sessions", type=int, default=12,
                       help="sessions on one agent for the growth check (12; 0 skips it)")  # fmt: skip
    check.add_argument("--startup-timeout", type=float, default=30.0, metavar="S",
                       help="bound on initialize and on session/new, seconds (30)")  # fmt: skip
    check.add_argument("--turn-timeout", type=float, default=120.0, metavar="S", help="bound on one prompt (120)")
    check.add_argument("--cancel-grace", type=float, default=5.0, metavar="S",
                       help="time to answer session/cancel, and to exit once stdin closes (5)")  # fmt: skip
    check.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="a variable for the agent (it gets a trimmed environment)")  # fmt: skip
    check.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                       help="a host the agent may reach through the sandbox's proxy (its model API)")  # fmt: skip
    check.add_argument("--sandbox", choices=["workspace-write", "read-only", "off"],
                       help="the OS sandbox mode (default: a run's default, workspace-write)")  # fmt: skip
    check.add_argument("--keep", type=Path, metavar="DIR", help="keep the probes' workspaces and transcripts here")
    check.add_argument("--strict", action="store_true", help="a check the agent gave no occasion to judge fails")
    check.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    command = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if not command:
        print("check: name the agent after --: loop-harness check -- python my_agent.py", file=sys.stderr)
        return 2
    env = {}
    for item in args.env:
        name, equals, value = item.partition("=")
        if not equals or not name:
            print(f"check: --env {item!r} is not NAME=VALUE", file=sys.stderr)
            return 2
        env[name] = value
    from rich.console import Console

    from ._conformance import CHECKS, Conformance, Status

    console = Console(stderr=True)
    try:
        conformance = Conformance(
            command,
            env=env,
            sessions=args.sessions,
            startup_timeout=args.startup_timeout,
            turn_timeout=args.turn_timeout,
            cancel_grace=args.cancel_grace,
            allow_hosts=args.allow_host,
            sandbox=args.sandbox,
            workdir=args.keep,
            progress=lambda probe: console.print(f"[dim]probe: {probe}[/dim]"),
        )
    except ValueError as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        print(f"check: --keep {args.keep} is not empty: give a new directory", file=sys.stderr)
        return 2
    try:
        results = conformance.run()
    except Exception as exc:  # the check's own fault, not the agent's: never read as a failed check
        print(f"check: could not run the probes: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in results if r.status is Status.FAIL or (args.strict and r.status is Status.NOT_EXERCISED)]
    _table(console, results, CHECKS)
    if failed and args.keep is None:
        console.print("re-run with --keep DIR to keep the transcripts named above")
    if args.json:
        print(json.dumps({"agent": command, "passed": not failed, "checks": [r.as_dict() for r in results]}))
    return 1 if failed else 0


def _table(console: object, results: list, checks: dict[str, str]) -> None:  # type: ignore[type-arg]
    from rich.console import Console
    from rich.table import Table

    assert isinstance(console, Console)
    table = Table(title="ACP conformance")
    for column in ("check", "status", "evidence"):
        table.add_column(column, overflow="fold")
    colour = {"pass": "green", "fail": "red bold", "not exercised": "yellow"}
    for result in results:
        status = result.status.value
        table.add_row(result.check, f"[{colour[status]}]{status}[/]", result.evidence)
    console.print(table)
