"""Paths as the system resolves them (`real_path`), and containment between resolved paths: what holds what."""

from __future__ import annotations

import os

__all__ = ["overlaps", "real_path", "within"]


def real_path(path: str) -> str:
    """`os.path.realpath(path)`, asked of the system when the whole path exists: open it (`O_PATH`: nothing
    is read, a fifo does not block) and read back where the descriptor leads. Four system calls instead of
    a Python `lstat` and `readlink` per component (18 us -> 5 us for a five-component path); every path it
    cannot open (a name not there yet, a loop, no search permission) and one unlinked meanwhile go to
    `os.path.realpath` as before. The policy resolves every path an agent names with it."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return os.path.realpath(path)
    try:
        found = os.readlink(f"/proc/self/fd/{fd}")
        gone = os.fstat(fd).st_nlink == 0  # unlinked after the open: the link reads "... (deleted)"
    except OSError:  # no /proc here
        return os.path.realpath(path)
    finally:
        os.close(fd)
    if gone or not found.startswith("/"):
        return os.path.realpath(path)
    return found


def within(path: str, directory: str) -> bool:
    """`path` is `directory` or lies beneath it."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def overlaps(a: str, b: str) -> bool:
    """One holds the other (or they are the same)."""
    return within(a, b) or within(b, a)
