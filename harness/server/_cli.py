"""`loop-harness serve [--host 127.0.0.1] [--port N] [--state DIR]`: the control server on uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["AUTONOMY_VARIABLE", "register"]

AUTONOMY_VARIABLE = "AGENTUP_AUTONOMY_ENABLED"  # the autonomy contract's name: the switch at start


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="the control server: the autonomy switch, workspaces and their loops")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    serve.add_argument("--state", type=Path, default=Path("loop-harness-state"),
                       help="the state directory: state.db (SQLite) and the bearer token")  # fmt: skip
    serve.add_argument("--allow-once-after", type=float, metavar="S",
                       default=float(os.environ.get("LOOP_HARNESS_ALLOW_ONCE_AFTER_S", "15")),
                       help="seconds after which a pending request no person answers is allowed once (the idle "
                            "allow-once countdown; default 15; 0 turns it off)")  # fmt: skip
    serve.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    import uvicorn

    from ._app import create_app
    from ._state import State, StateError

    os.umask(0o077)  # the database, its journal and the transcripts: the server user's alone
    from_environment = bool(os.environ.get("LOOP_HARNESS_SERVER_TOKEN"))
    try:
        state = State.open(args.state.expanduser())
    except StateError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    note = None
    switch = os.environ.get(AUTONOMY_VARIABLE)
    if switch is not None:  # a service set up this way starts, switch on, even before any host is connected
        enabled = switch.strip().lower() in ("1", "true", "yes", "on")
        state.set_autonomy(enabled, at_start=True)
        if enabled and not any(w.queue is not None for w in state.workspaces()):
            note = (
                f"serve: {AUTONOMY_VARIABLE}={switch}: the switch is on; no workspace has a host connection "
                "yet, so each activation is refused (no_host_connection) until one is registered with a queue"
            )
    listener = socket.create_server((args.host, args.port), reuse_port=False)
    # Accepted connections inherit it (Linux): without it a kept-alive client waits ~40 ms per answer on
    # Nagle against delayed ACKs, as uvicorn writes a response's head and body apart.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    host, port = listener.getsockname()[:2]
    token = "from LOOP_HARNESS_SERVER_TOKEN" if from_environment else f"in {state.directory / 'token'}"
    print(f"serving on http://{host}:{port} (state {state.directory}, token {token})", file=sys.stderr, flush=True)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    hosts = {args.host, "127.0.0.1", "localhost", "[::1]", "::1"}
    app = create_app(state, allow_once_after_s=args.allow_once_after, hosts=frozenset(f"{h}:{port}" for h in hosts))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=10)
    try:
        asyncio.run(_server_class()(config, app).serve(sockets=[listener]))
    finally:
        state.close()
    return 0


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn waits for open responses before the app's shutdown runs: an event stream watching a live
        loop would wait for ever (the loop ends only in that shutdown). A signal ends the streams first."""

        def __init__(self, config: uvicorn.Config, app: Any) -> None:
            super().__init__(config)
            self.app = app

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.app.state.stopping.set()
            super().handle_exit(sig, frame)

    return Server
