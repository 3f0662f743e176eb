"""No descriptor of the kernel's reaches a process it spawns, whichever event loop spawns it.

The stock loop spawns through `subprocess` with `close_fds=True`. uvloop (what `loop-harness run` runs on)
does not implement `close_fds` (a TODO in its `loop.pyx`): a descriptor the kernel process holds inheritable
would reach the agent, and through bubblewrap (which closes nothing) the sandboxed agent too. Python opens its
own descriptors close-on-exec, but not those the kernel *inherited*: a make jobserver's pipe (`make run`), a
CI runner's socket or log file, a directory whoever started the kernel left open: an agent could write there,
or escape its mounts through a directory descriptor. So before every spawn each descriptor from 3 up is made
close-on-exec: the child keeps only the stdio the spawn gives it.
"""

from __future__ import annotations

import os

__all__ = ["close_on_exec_inherited"]

FALLBACK_HIGHEST = 1024  # without /proc: the usual soft limit


def close_on_exec_inherited() -> None:
    """Mark every open descriptor above stderr close-on-exec (a few dozen `fcntl`s; spawns are rare)."""
    try:
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        descriptors = list(range(3, FALLBACK_HIGHEST))
    for fd in descriptors:
        if fd <= 2:
            continue
        try:
            if os.get_inheritable(fd):
                os.set_inheritable(fd, False)
        except OSError:  # not open (the listing's own descriptor, closed by now)
            continue
