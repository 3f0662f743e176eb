"""Which event loop the command line runs on: uvloop, unless `LOOP_HARNESS_EVENT_LOOP=asyncio`.

A task is a dozen pipe messages each way between two processes, so the loop's own Python code (scheduling a
callback, a selector round, a stream read) is a large share of the kernel's work: libuv's C loop cut the
kernel's instructions a task by about 14 % (callgrind, 3.70 M -> 3.20 M, issue 15). The kernel itself runs on
any asyncio loop (a library user's own `asyncio.run(kernel.run())` is the stock one, as are the tests that run
it in process); the run's first record names the loop it ran on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ENV", "chosen", "loop_name", "run"]

ENV = "LOOP_HARNESS_EVENT_LOOP"
T = TypeVar("T")


def chosen() -> str:
    """The loop the environment asks for (`uvloop` by default); ValueError naming the variable otherwise."""
    choice = os.environ.get(ENV) or "uvloop"
    if choice not in ("uvloop", "asyncio"):
        raise ValueError(f"{ENV} must be 'uvloop' or 'asyncio', not {choice!r}")
    return choice


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    if choice == "asyncio":
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)


def loop_name() -> str:
    """The running loop's library: `uvloop` or `asyncio` (or whichever a library user runs the kernel on)."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
