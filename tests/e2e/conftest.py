"""A real `loop-harness serve` on a loopback port, talked to with httpx."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest


@dataclass
class Server:
    url: str
    token: str
    state: Path
    process: subprocess.Popen[str]

    def client(self, *, token: str | None = None, **headers: str) -> httpx.Client:
        auth = {"Authorization": f"Bearer {self.token if token is None else token}"} if token != "" else {}
        return httpx.Client(base_url=self.url, headers={**auth, **headers}, timeout=10)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.process.send_signal(sig)
        self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


def start_server(state: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> Server:
    """Start `loop-harness serve --port 0`, wait for its address line; fails with its stderr if it exits."""
    process = subprocess.Popen([sys.executable, "-m", "harness", "serve", "--port", "0", "--state", str(state)],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=cwd,
                               env={**os.environ, **(env or {})})  # fmt: skip
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"serving on (http://\S+)", line)
    if found is None:
        rest = process.stderr.read()
        process.wait(timeout=10)
        process.stderr.close()
        raise RuntimeError(f"the server did not start (exit {process.returncode}): {line}{rest}")
    given = (env or {}).get("LOOP_HARNESS_SERVER_TOKEN")
    state = (cwd or Path.cwd()) / state
    return Server(found.group(1), given or (state / "token").read_text().strip(), state, process)


@pytest.fixture(name="server_factory")
def server_factory_fixture(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(state: Path | None = None, env: dict[str, str] | None = None, cwd: Path | None = None) -> Server:
        server = start_server(state or tmp_path / "state", env, cwd)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.kill(signal.SIGTERM)


@pytest.fixture(name="server")
def server_fixture(server_factory: Callable[..., Server]) -> Server:
    return server_factory()
