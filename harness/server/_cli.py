"""`loop-harness serve [--host 127.0.0.1] [--port N] [--state DIR]`: the control server on uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

__all__ = ["AUTONOMY_VARIABLE", "register"]

AUTONOMY_VARIABLE = "AGENTUP_AUTONOMY_ENABLED"  # seed 000's name: the switch at start


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="the control server: the autonomy switch, workspaces and their loops")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    serve.add_argument("--state", type=Path, default=Path("loop-harness-state"),
                       help="the state directory: state.db (SQLite) and the bearer token")  # fmt: skip
    serve.add_argument("--allow-once-after", type=float, metavar="S",
                       default=float(os.environ.get("LOOP_HARNESS_ALLOW_ONCE_AFTER_S", "15")),
                       help="seed 002's idle allow-once countdown, seconds (default 15; 0 turns it off)")  # fmt: skip
    serve.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    import uvicorn

    from ._app import create_app
    from ._state import State, StateError

    state = State.open(args.state.expanduser())
    switch = os.environ.get(AUTONOMY_VARIABLE)
    if switch is not None:
        try:
            state.set_autonomy(switch.strip().lower() in ("1", "true", "yes", "on"))
        except StateError as exc:
            print(f"serve: {AUTONOMY_VARIABLE}={switch}: {exc}", file=sys.stderr)
            return 2
    listener = socket.create_server((args.host, args.port), reuse_port=False)
    # Accepted connections inherit it (Linux): without it a kept-alive client waits ~40 ms per answer on
    # Nagle against delayed ACKs, as uvicorn writes a response's head and body apart.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    host, port = listener.getsockname()[:2]
    print(f"serving on http://{host}:{port} (state {state.directory}, token in {state.directory / 'token'})",
          file=sys.stderr, flush=True)  # fmt: skip
    app = create_app(state, allow_once_after_s=args.allow_once_after)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    try:
        asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))
    finally:
        state.close()
    return 0
