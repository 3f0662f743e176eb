"""A minimal ACP agent (standard library only) that tests the kernel's side of the agent's process contract.

`python process_agent.py MODE` answers `initialize` and `session/new`, then, at `session/prompt`:

    trap-term       answers `end_turn`; on SIGTERM writes `trapped SIGTERM` to stderr and exits 42 (a clean-up
                    that ran); it outlives its stdin's EOF, so the kernel's teardown must signal it
    trap-term-hang  the same, but answers the prompt only when it is cancelled (`cancelled`)
    ignore-term     answers `end_turn`, ignores SIGTERM and outlives its stdin's EOF: only SIGKILL ends it
    kill-self       kills itself with SIGKILL before answering
    exit-N          exits with status N before answering (`exit-137`: by itself, not by a signal)
    close-stdout    closes its stdout and sleeps, stdin's EOF or not (only SIGTERM's default action ends it)

It runs inside the kernel's sandbox as well as outside it: it writes nothing but its stdio.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

MODES = ("trap-term", "trap-term-hang", "ignore-term", "kill-self", "exit-N", "close-stdout")


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def trapped(_number: int, _frame: object) -> None:
    os.write(2, b"trapped SIGTERM\n")
    os._exit(42)


def main(mode: str) -> int:
    code = int(mode[5:]) if mode.startswith("exit-") and mode[5:].isdigit() else None
    if mode not in MODES and code is None:
        sys.stderr.write(f"usage: process_agent.py {'|'.join(MODES)}\n")
        return 2
    if mode.startswith("trap-term"):
        signal.signal(signal.SIGTERM, trapped)
    elif mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hanging: object = None  # the prompt's id while it waits for a cancel
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if method == "initialize":
            capabilities = {"loadSession": False, "mcpCapabilities": {"http": True, "sse": False}}
            send({"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": 1, "agentCapabilities": capabilities,
                                                              "authMethods": []}})  # fmt: skip
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": ident, "result": {"sessionId": "s1"}})
        elif method == "session/prompt" and mode == "kill-self":
            os.kill(os.getpid(), signal.SIGKILL)
        elif method == "session/prompt" and code is not None:
            os._exit(code)
        elif method == "session/prompt" and mode == "close-stdout":
            sys.stdout.flush()
            os.close(1)
            break
        elif method == "session/prompt" and mode == "trap-term-hang":
            hanging = ident
        elif method == "session/prompt":
            send({"jsonrpc": "2.0", "id": ident, "result": {"stopReason": "end_turn"}})
        elif method == "session/cancel" and hanging is not None:
            send({"jsonrpc": "2.0", "id": hanging, "result": {"stopReason": "cancelled"}})
            hanging = None
        elif ident is not None:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})
    while True:  # stdin's EOF (or a closed stdout) does not end it: a signal must
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
