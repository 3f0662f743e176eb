"""`loop-harness fake-model responses|messages --script FILE [--host H] [--port N] [--requests FILE]`.

Serves a stand-in model API on loopback playing a script (`_script.py`), so Codex or Claude Code can be driven
offline with no key. The first line on stdout is the base URL to configure (`http://HOST:PORT/v1` for the
Responses API, `http://HOST:PORT` for the Messages API, as `ANTHROPIC_BASE_URL` wants it); it serves until
SIGTERM or SIGINT, then exits 0. A script that cannot be played exits 2 before anything listens.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["register"]

_APIS = {
    "responses": "the OpenAI Responses API, for Codex (prints http://HOST:PORT/v1)",
    "messages": "the Anthropic Messages API, for Claude Code (prints http://HOST:PORT, ANTHROPIC_BASE_URL)",
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fake = commands.add_parser("fake-model", help="a stand-in model API on loopback playing a script (drive Codex "
                               "or Claude Code offline, no key)")  # fmt: skip
    fake.add_argument("api", choices=sorted(_APIS), help="; ".join(f"{name}: {what}" for name, what in _APIS.items()))
    fake.add_argument("--script", type=Path, required=True, metavar="FILE",
                      help="the replies, in YAML: a list of replies, each a list of {say: TEXT}, {shell: COMMAND} "
                           "or {tool: NAME, input: {...}}")  # fmt: skip
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    fake.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed in the URL)")
    fake.add_argument("--requests", type=Path, metavar="FILE",
                      help="append every request the adapter sends as one JSON line: method, path, body")  # fmt: skip
    fake.set_defaults(handler=_handle)


class _RequestLog:
    """Appends each request as a JSON line, flushed at once so a reader sees it while the adapter waits."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def __call__(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(record) + "\n")
            self._out.flush()


def _handle(args: argparse.Namespace) -> int:
    from ._messages import FakeMessages
    from ._responses import FakeResponses
    from ._script import ScriptError, load_script

    try:
        script = load_script(args.script)
    except ScriptError as exc:
        print(f"fake-model: {exc}", file=sys.stderr)
        return 2
    try:
        log = args.requests.open("a", encoding="utf-8") if args.requests else None
    except OSError as exc:
        print(f"fake-model: --requests {args.requests}: {exc}", file=sys.stderr)
        return 2
    stops = {signal.SIGTERM, signal.SIGINT}
    # Blocked before the server's threads start (they inherit the mask), so the signal waits for sigwait here
    # and the server closes in order rather than dying mid-answer.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        kind = FakeResponses if args.api == "responses" else FakeMessages
        try:
            fake = kind.from_script(script, host=args.host, port=args.port,
                                    on_request=_RequestLog(log) if log else None,
                                    on_error=lambda m: print(f"fake-model: answered 400: {m}", file=sys.stderr,
                                                             flush=True))  # fmt: skip
        except OSError as exc:
            print(f"fake-model: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        with fake:
            print(fake.url, flush=True)
            print(f"fake-model: the {args.api} API on {fake.url}, {len(script.replies)} replies from {args.script} "
                  "(SIGTERM or Ctrl-C stops it)", file=sys.stderr, flush=True)  # fmt: skip
            signal.sigwait(stops)
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        if log is not None:
            log.close()
