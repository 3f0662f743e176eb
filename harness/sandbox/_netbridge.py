"""The agent's entry into its sandbox: loopback ports that lead out, its own stdio, and its own exit status.

The sandbox has no network; the kernel listens on Unix sockets in the run's directory (its filtering proxy,
its host-tools server) and this relays a loopback TCP port inside to each of them, then runs the command and
exits as it exits. Standard library only, run as
`python3 -I -S _netbridge.py [--stdio IN,OUT] [--report FD] PORT=SOCKET ... -- COMMAND...`
so it starts in milliseconds and imports nothing from the worktree.

For the agent (`--stdio`, `--report`) it also keeps the agent's process contract (issue 35):
- `--stdio IN,OUT`: the agent's stdin and stdout come in as other descriptors and only the command gets them as
  0 and 1; bwrap, its init and this bridge hold /dev/null there, so the agent's closing its stdout is an EOF the
  kernel sees at once;
- the kernel signals the agent's process group itself (bwrap's init's: the command is in it): this bridge, in
  the same group, lets SIGTERM, SIGINT and SIGHUP pass it by rather than die of them or pass them on twice;
- `--report FD`: the command's own exit status (`-N` for signal N), written before this bridge ends the same
  way: bwrap can only say `128 + N`, which an agent's own `exit(137)` also reads as.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

_PASSED_BY = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: list[str]) -> int:
    split = argv.index("--")
    options, routes = _options(argv[:split])
    for route in routes:
        port, path = route.split("=", 1)
        server = socket.create_server(("127.0.0.1", int(port)), backlog=64)
        threading.Thread(target=_accept, args=(server, path), daemon=True).start()
    # a handler (not SIG_IGN) for the group's signals: the command's exec resets it to the default action
    for number in _PASSED_BY:
        signal.signal(number, _passed_by)
    stdio = options.get("stdio")
    if stdio is None:  # stdio, environment and cwd are the command's own
        child = subprocess.Popen(argv[split + 1 :])
    else:
        stdin, stdout = (int(fd) for fd in stdio.split(","))
        child = subprocess.Popen(argv[split + 1 :], stdin=stdin, stdout=stdout)
        for fd in (stdin, stdout):
            os.close(fd)
    code = child.wait()  # PEP 475: a signal passing by does not end the wait
    if "report" in options:
        with contextlib.suppress(OSError):
            os.write(int(options["report"]), f"{code}\n".encode())
            os.close(int(options["report"]))
    if code < 0:  # killed by a signal: end the same way, so whoever waits on us sees that signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep their action anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _options(words: list[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    routes: list[str] = []
    words = list(words)
    while words:
        word = words.pop(0)
        if word in ("--stdio", "--report"):
            options[word[2:]] = words.pop(0)
        else:
            routes.append(word)
    return options, routes


def _passed_by(_number: int, _frame: object) -> None:
    """The command is in the same process group: the signal reached it too."""


def _accept(server: socket.socket, path: str) -> None:
    while True:
        inside, _ = server.accept()
        threading.Thread(target=_relay, args=(inside, path), daemon=True).start()


def _relay(inside: socket.socket, path: str) -> None:
    with inside, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as outside:
        try:
            outside.connect(path)
        except OSError:
            return
        back = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
        back.start()
        _pump(inside, outside)
        back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until EOF and pass the half-close on; on an error, end both directions."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
