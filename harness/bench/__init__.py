"""`loop-harness bench WHAT`: each benchmark compares two things in one run and prints their ratio.

    kernel     the kernel vs a bare SDK client (`--sandbox`: overlay vs bind vs off; `--outside`: whole processes)
    inference  the inference agent's decode vs bare llama-cpp
    changes    the change meter's incremental measure vs git
    boundary   the overlay's judge-and-apply vs git status, by the change's size
    server     loops at once vs one loop, the API's latency, and what keep-draining costs an idle server
    endpoint   the inference agent's endpoint backend vs a bare OpenAI client on one llama.cpp server; 1 vs N loops

The command registers as `check` and `serve` do (`register(subparsers)`); each bench module loads only
when its bench runs.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser(
        "bench", help="benchmarks: the kernel vs a bare SDK client; inference vs bare llama; a change measure"
    )
    bench.add_argument("what", choices=["kernel", "inference", "changes", "server", "boundary", "endpoint"],
                       help="what to measure")  # fmt: skip
    bench.add_argument("--loops", type=int, default=4, help="server, endpoint: loops at once (default 4)")
    bench.add_argument("--idle-seconds", type=float, default=10.0,
                       help="server: how long the kept-draining loops' idle cost is measured (default 10)")  # fmt: skip
    bench.add_argument("--tasks", type=int, help="tasks per side (default: kernel 300, inference 3, endpoint 1 per "
                       "side and per loop)")  # fmt: skip
    bench.add_argument("--threads", type=int, default=2, help="inference: CPU threads; endpoint: the server's "
                       "(default 2)")  # fmt: skip
    bench.add_argument("--endpoint", metavar="URL", help="endpoint: your OpenAI-compatible server's base URL "
                       "(default: llama-cpp-python's on the pinned model, started by the bench)")  # fmt: skip
    bench.add_argument("--model", metavar="NAME", help="endpoint: with --endpoint, the model to ask for")
    bench.add_argument("--no-stream", dest="stream", action="store_false", help="endpoint: with --endpoint, the "
                       "agent asks for whole answers (for a server that cannot stream tool calls)")  # fmt: skip
    bench.add_argument(
        "--rounds",
        type=int,
        help="rounds; medians reported, `kernel --outside` the best (default: kernel 3, inference 5, endpoint 2)",
    )
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.add_argument("--sandbox", action="store_true", help="kernel: the OS sandbox on vs off, and a terminal's cost")
    bench.add_argument(
        "--outside",
        action="store_true",
        help="kernel: `loop-harness run` vs a bare SDK client as whole processes, steady state (default 400 tasks, "
        "best of 2)",
    )
    bench.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if args.what != "endpoint" and (args.endpoint or args.model or not args.stream):
        print("bench: --endpoint, --model and --no-stream are the endpoint bench's", file=sys.stderr)
        return 2
    if args.what == "endpoint":
        return _endpoint(args)
    if args.what == "inference":
        from ._inference import bench_inference

        rounds = args.rounds or 5
        return bench_inference(tasks=args.tasks or 3, threads=args.threads, rounds=rounds, as_json=args.json)
    if args.what == "server":
        from ._server import bench_server

        return bench_server(loops=args.loops, tasks=args.tasks or 100, as_json=args.json, idle_s=args.idle_seconds)
    if args.what == "boundary":
        from ._boundary import bench_boundary

        return bench_boundary(rounds=args.rounds or 3, as_json=args.json)
    if args.what == "changes":
        from ._changes import bench_changes

        return bench_changes(rounds=args.rounds or 3, as_json=args.json)
    if args.outside:
        from ._outside import bench_outside

        return bench_outside(tasks=args.tasks or 400, rounds=args.rounds or 3, as_json=args.json)
    if args.sandbox:
        from ._sandbox import bench_sandbox

        return bench_sandbox(tasks=args.tasks or 300, rounds=args.rounds or 3, as_json=args.json)
    from ._kernel import bench_kernel

    return bench_kernel(tasks=args.tasks or 300, rounds=args.rounds or 3, as_json=args.json)


def _endpoint(args: argparse.Namespace) -> int:
    if (args.model or not args.stream) and not args.endpoint:
        print("bench endpoint: --model and --no-stream go with --endpoint (the server the bench starts is asked "
              "without streaming, as it needs)", file=sys.stderr)  # fmt: skip
        return 2
    given = [args.loops, args.threads, *(n for n in (args.tasks, args.rounds) if n is not None)]
    if min(given) < 1:
        print("bench endpoint: --loops, --tasks, --rounds and --threads must be at least 1", file=sys.stderr)
        return 2
    from ._endpoint import bench_endpoint

    return bench_endpoint(tasks=args.tasks or 1, rounds=args.rounds or 2, loops=args.loops, threads=args.threads,
                          url=args.endpoint, model=args.model, stream=args.stream, as_json=args.json)  # fmt: skip
