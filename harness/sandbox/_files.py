"""Read and write exactly the worktree file the policy judged.

The policy resolves a path once (symlinks, `..`) and judges the result. Between that and the open,
an agent could swap a directory on the way for a symlink, or the file for a hard link to something
else. So the file is reached component by component from an open worktree descriptor with
`O_NOFOLLOW` (a symlink anywhere on the way fails the call), and only a regular file with a single
link is read or written. A write checks that before it truncates.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

__all__ = ["MAX_READ_BYTES", "read_beneath", "write_beneath"]

MAX_READ_BYTES = 8 << 20
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def read_beneath(root: str, relative: str, limit: int = MAX_READ_BYTES) -> str:
    """The text of `root/relative` (a regular, singly linked file of at most `limit` bytes)."""
    *parents, name = relative.split("/")
    with _directory(root, parents, create=False) as parent:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    try:  # plain reads on the descriptor: a file object would ask the terminal driver whether it is one
        _check_single_regular(fd, relative)
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{name} is larger than {limit} bytes")
    return data.decode("utf-8", errors="replace")


def write_beneath(root: str, relative: str, content: str) -> None:
    """Write `content` to `root/relative`, creating missing directories (never through a symlink)."""
    *parents, name = relative.split("/")
    with _directory(root, parents, create=True) as parent:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if _check_single_regular(fd, relative).st_size:  # checked before truncating: a hard link's other
            os.ftruncate(fd, 0)  # name is never emptied; a new file needs no truncation (it costs ~0.5 ms)
        f.write(content)


@contextlib.contextmanager
def _directory(root: str, parts: list[str], *, create: bool) -> Iterator[int]:
    """An open descriptor of `root/parts...`, reached one component at a time without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(f"{part!r} is not a plain path component")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _check_single_regular(fd: int, relative: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{relative} is not a regular file")
    if st.st_nlink > 1:
        raise OSError(f"{relative} has {st.st_nlink} hard links")
    return st
