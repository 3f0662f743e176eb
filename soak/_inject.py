"""Leaks on purpose, one per task, to prove each soak check can fail.

Each injector leaks one unit of its resource in the kernel process at every
task boundary; `release()` undoes it all when the soak ends. The transcript
leak is the agent's: its messages grow with every session (`growing_message`); so are `agent-fd` and
`agent-thread`, which the scripted agent leaks in its own process every task (its `leak` step).
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

__all__ = ["INJECTABLE", "Injector"]

INJECTABLE = ("fd", "thread", "child", "memory", "transcript", "agent-fd", "agent-thread")


class Injector:
    def __init__(self, kinds: tuple[str, ...]) -> None:
        unknown = set(kinds) - set(INJECTABLE)
        if unknown:
            raise ValueError(f"unknown leak(s) {sorted(unknown)} (known: {', '.join(INJECTABLE)})")
        self.kinds = kinds
        self.agent_leaks = tuple(k.removeprefix("agent-") for k in kinds if k.startswith("agent-"))
        self._fds: list[int] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._children: list[subprocess.Popen[Any]] = []
        self._memory: list[bytearray] = []

    def leak(self) -> None:
        if "fd" in self.kinds:
            self._fds.append(os.open(os.devnull, os.O_RDONLY))
        if "thread" in self.kinds:
            thread = threading.Thread(target=self._stop.wait, name=f"injected-leak-{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if "child" in self.kinds:
            self._children.append(subprocess.Popen(["sleep", "600"]))
        if "memory" in self.kinds:
            self._memory.append(bytearray(256 * 1024))

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for child in self._children:
            child.kill()
            child.wait()
        self._fds, self._threads, self._children, self._memory = [], [], [], []
