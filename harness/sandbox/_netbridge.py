"""Inside the sandbox's network namespace: loopback ports that lead out through the kernel's Unix sockets.

The sandbox has no network; the kernel listens on Unix sockets in the run's directory (its filtering proxy,
its host-tools server) and this relays a loopback TCP port inside to each of them, then runs the command and
exits as it exits. Standard library only, run as `python3 -I -S _netbridge.py PORT=SOCKET ... -- COMMAND...`
so it starts in milliseconds and imports nothing from the worktree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading


def main(argv: list[str]) -> int:
    split = argv.index("--")
    for route in argv[:split]:
        port, path = route.split("=", 1)
        server = socket.create_server(("127.0.0.1", int(port)), backlog=64)
        threading.Thread(target=_accept, args=(server, path), daemon=True).start()
    child = subprocess.Popen(argv[split + 1 :])  # stdio, environment and cwd are the command's own
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda n, _frame: child.send_signal(n))
    code = child.wait()
    if code < 0:  # killed by a signal: end the same way, so whoever waits on us sees that signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


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
