"""The agent's worktree as a copy-on-write overlay (issue 30): what a task changed is exactly the upper layer.

With `sandbox.worktree: overlay` the agent sandbox mounts the worktree W as an overlay (`bwrap --overlay-src W
--overlay UPPER WORK W`). The agent, everything it runs, every `terminal/*` command (they join the agent sandbox's
namespaces, `_sandbox_enter.py`) and the kernel's own `fs/*` calls (through a descriptor of the merged directory,
`view`) see W writable wherever the sandbox neither masks nor binds read-only; every write lands in UPPER, and W
itself is untouched until the kernel applies a task at its boundary:

    UPPER holds            it means
    a file, a symlink      created or changed (content, mode, type)
    a directory            created, or one that holds changes
    a char device 0/0      deleted (an overlay "whiteout")
    an opaque directory    replaced whole: what W holds beneath it is deleted, but for what UPPER holds again

So no write is missed (no inotify queue to overflow, no mmap or AIO blind spot, nothing under an ignored
directory skipped) and the change set costs a walk of UPPER: it grows with the change, not with the tree.

At a task boundary (`task_changes`) each changed path is judged (`_change_set.judge_place`); when every one is
allowed the kernel `apply`s them to W (each written afresh beneath W, never through a symlink, never into an
existing inode), otherwise nothing of the task reaches W and its changes are `set_aside` for a person, beside the
transcript. The agent process and its overlay live across tasks: UPPER keeps what was applied (W then holds the
same), so a task's changes are the entries whose signature (type, mode, size, mtime, ctime, inode) differs from
the one recorded when the entry was applied. Rewriting W beneath a mounted overlay is outside what overlayfs
promises; the kernel only ever writes what UPPER already shows at the same path, so the merged view cannot change.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["NAMESPACES", "OverlayChange", "OverlayUnreadable", "WorktreeOverlay"]

Kind = Literal["file", "dir", "symlink", "deleted", "special"]
#: The namespaces a terminal command joins, in the order `_sandbox_enter.py` takes their descriptors.
NAMESPACES = ("mnt", "net", "ipc", "uts", "cgroup", "pid")
_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1): the user namespace that owns a namespace
_OPAQUE = (b"user.overlay.opaque", b"trusted.overlay.opaque")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OverlayUnreadable(Exception):
    """The upper layer could not be read: the boundary fails closed."""


@dataclass(frozen=True)
class OverlayChange:
    """One path of the worktree a task changed, as the upper layer says it (`path` relative to the worktree)."""

    path: str
    kind: Kind
    opaque: bool = False  # a directory that replaces W's whole
    target: str | None = None  # a symlink's


class WorktreeOverlay:
    """The overlay of one run's agent sandbox: its layers (fresh at each agent start), the sandbox's namespaces
    and merged worktree once it runs, and what of the upper layer is already applied to W."""

    def __init__(self, worktree: str, base: Path) -> None:
        self.worktree = os.path.realpath(worktree)
        self.base = base
        self.upper: Path | None = None
        self._serial = 0
        self._info: int | None = None  # the read end of bwrap's --info-fd
        self._view: int | None = None  # a descriptor of the merged worktree, as the sandbox shows it
        self._namespaces: dict[str, int] = {}  # descriptors of the sandbox's namespaces ("user", "user_owner", ...)
        self._applied: dict[str, tuple[int, ...]] = {}  # path -> signature of its upper entry when applied

    # --- the sandbox's side -------------------------------------------------------------------------

    def mount(self) -> tuple[list[str], int]:
        """bwrap arguments for a new agent sandbox: a fresh upper and work directory (the last agent's, if any,
        are left as they were) and `--info-fd` to learn the sandbox's pid; the descriptor to pass bwrap."""
        self.close()
        self._serial += 1
        layers = self.base / str(self._serial)
        upper, work = layers / "upper", layers / "work"
        for directory in (self.base, layers, upper, work):
            directory.mkdir(mode=0o700, exist_ok=directory == self.base)
        self.upper, self._applied = upper, {}
        read, write = os.pipe2(os.O_CLOEXEC)
        self._info = read
        mount = ["--overlay-src", self.worktree, "--overlay", str(upper), str(work), self.worktree]
        return [*mount, "--info-fd", str(write)], write

    async def attach(self, timeout: float = 30.0) -> None:
        """Once bwrap runs: hold the sandbox's namespaces and its merged worktree by descriptor (a pid could be
        reused; a descriptor cannot). Raises OSError when bwrap said nothing (it failed to start)."""
        info, self._info = self._info, None
        if info is None:
            raise OSError("the agent sandbox was not started with an overlay")
        try:
            raw = await asyncio.wait_for(asyncio.to_thread(_read_all, info), timeout)
        finally:
            os.close(info)
        try:
            pid = int(json.loads(raw)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise OSError(f"bwrap reported no sandbox ({exc}): {raw[:200]!r}") from None
        await asyncio.wait_for(_set_up(pid), timeout)
        opened: dict[str, int] = {}
        try:
            for name in ("user", *NAMESPACES):
                opened[name] = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            opened["user_owner"] = fcntl.ioctl(opened["mnt"], _NS_GET_USERNS)
            view = os.open(f"/proc/{pid}/root{self.worktree}", _DIRECTORY)
        except OSError:
            for fd in opened.values():
                os.close(fd)
            raise
        self._namespaces, self._view = opened, view

    @property
    def view(self) -> str | None:
        """A path to the merged worktree, the agent's view (through the kernel's descriptor), once attached."""
        return None if self._view is None else f"/proc/self/fd/{self._view}"

    def namespace_fds(self) -> list[int]:
        """Descriptors of the sandbox's namespaces for `_sandbox_enter.py`: the user namespace that owns the
        mounts, the process's own one, then NAMESPACES in order. OSError when no sandbox is attached."""
        if not self._namespaces:
            raise OSError("the agent's sandbox is not running: a command cannot start in it")
        return [self._namespaces["user_owner"], self._namespaces["user"], *(self._namespaces[n] for n in NAMESPACES)]

    def close(self) -> None:
        """Let go of the last sandbox (its layers stay on disk until the run's directory goes)."""
        for fd in (self._info, self._view, *self._namespaces.values()):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._info, self._view, self._namespaces = None, None, {}

    # --- the boundary's side ------------------------------------------------------------------------

    def task_changes(self) -> list[OverlayChange]:
        """What the upper layer holds that was not applied yet, shallow first (a directory before what it
        holds). Raises OverlayUnreadable when it cannot be read whole: the caller fails closed."""
        if self.upper is None:
            return []
        found: list[OverlayChange] = []
        try:
            for relative, st in _walk(self.upper):
                if self._applied.get(relative) == _signature(st):
                    continue
                change = self._change(relative, st)
                if self._unchanged(change, st):  # copied up and no more (opened for writing, a hard link made)
                    self._applied[relative] = _signature(st)
                    continue
                found.append(change)
        except OSError as exc:
            raise OverlayUnreadable(f"{exc.filename or self.upper}: {exc.strerror or exc}") from None
        return found

    def deleted_beneath(self, change: OverlayChange, limit: int) -> list[str]:
        """The paths of W that a deletion or an opaque directory takes away (files and links, not followed),
        but those the upper layer holds again; at most `limit` + 1 (the caller refuses past `limit`)."""
        root = os.path.join(self.worktree, change.path)
        if (change.kind == "deleted" and not os.path.isdir(root)) or os.path.islink(root):
            return [change.path] if os.path.lexists(root) else []
        assert self.upper is not None
        gone: list[str] = []
        for here, dirs, files in os.walk(root):
            for name in (*files, *(d for d in dirs if os.path.islink(os.path.join(here, d)))):
                relative = os.path.relpath(os.path.join(here, name), self.worktree)
                if not os.path.lexists(self.upper / relative) or change.kind == "deleted":
                    gone.append(relative)
                    if len(gone) > limit:
                        return gone
        return gone

    def apply(self, changes: list[OverlayChange]) -> None:
        """Make W what the upper layer says of `changes` (judged and allowed as a whole), and remember each
        entry as applied. Deletions first, then shallow before deep."""
        assert self.upper is not None
        root = os.open(self.worktree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for change in sorted(changes, key=lambda c: (c.kind != "deleted", c.path.count("/"), c.path)):
                # the entry as it was before it is copied: one the agent changes meanwhile differs from this, so the
                # next boundary takes it again (a signature read after the copy could hide that change for good)
                before = os.lstat(self.upper / change.path)
                _apply_one(root, self.upper, change)
                self._applied[change.path] = _signature(before)
        finally:
            os.close(root)

    def set_aside(self, changes: list[OverlayChange], destination: Path) -> None:
        """A copy of what the task changed for a person to see (W is left as it was): its files and links under
        `destination`, and `changes.json` listing every path and what happened to it."""
        assert self.upper is not None
        destination.mkdir(parents=True, exist_ok=True, mode=0o700)
        for change in changes:
            source, target = self.upper / change.path, destination / "files" / change.path
            with contextlib.suppress(OSError):
                if change.kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                elif change.kind == "symlink":
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(os.readlink(source), target)
                elif change.kind == "file":
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target, follow_symlinks=False)
        listing = [{"path": c.path, "kind": c.kind, **({"opaque": True} if c.opaque else {}),
                    **({"target": c.target} if c.target is not None else {})} for c in changes]  # fmt: skip
        (destination / "changes.json").write_text(json.dumps(listing, indent=1) + "\n", encoding="utf-8")

    def _unchanged(self, change: OverlayChange, st: os.stat_result) -> bool:
        """The worktree holds the same thing at the same path: same type, the same permission bits and bytes, or
        the same link text; nothing there for a deletion. A directory is never a change on its own."""
        where = os.path.join(self.worktree, change.path)
        try:
            was = os.lstat(where)
        except FileNotFoundError:
            return change.kind == "deleted"
        if change.kind == "dir":
            return stat.S_ISDIR(was.st_mode) and not change.opaque
        if change.kind == "symlink":
            return stat.S_ISLNK(was.st_mode) and os.readlink(where) == change.target
        if change.kind != "file" or not stat.S_ISREG(was.st_mode):
            return False
        if stat.S_IMODE(was.st_mode) != stat.S_IMODE(st.st_mode) or was.st_size != st.st_size:
            return False
        assert self.upper is not None
        return _same_bytes(self.upper / change.path, where)

    def _change(self, relative: str, st: os.stat_result) -> OverlayChange:
        assert self.upper is not None
        mode = st.st_mode
        if stat.S_ISCHR(mode) and st.st_rdev == 0:
            return OverlayChange(relative, "deleted")
        if stat.S_ISDIR(mode):
            return OverlayChange(relative, "dir", opaque=_opaque(self.upper / relative))
        if stat.S_ISLNK(mode):
            return OverlayChange(relative, "symlink", target=os.readlink(self.upper / relative))
        if stat.S_ISREG(mode):
            return OverlayChange(relative, "file")
        return OverlayChange(relative, "special")


async def _set_up(pid: int) -> None:
    """Until the sandbox is built: bwrap tells its pid at once, and forks the command only when every mount and
    namespace is in place (`--disable-userns` makes the last user namespace after the mounts)."""
    while not _has_child(pid):  # gone (OSError): bwrap failed, the caller says so
        await asyncio.sleep(0.002)


def _has_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return bool(listing.read().strip())
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent, read instead
        os.stat(f"/proc/{pid}")  # raises when bwrap is gone
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with (contextlib.suppress(OSError, ValueError, IndexError),
                  open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat_file):  # fmt: skip
                if int(stat_file.read().rsplit(")", 1)[1].split()[1]) == pid:  # the parent's pid
                    return True
        return False


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _same_bytes(one: Path | str, other: Path | str) -> bool:
    """Two regular files hold the same bytes (neither followed if a link; anything else is not the same)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        with open(os.open(one, flags), "rb") as a, open(os.open(other, flags), "rb") as b:
            if not (stat.S_ISREG(os.fstat(a.fileno()).st_mode) and stat.S_ISREG(os.fstat(b.fileno()).st_mode)):
                return False
            while True:
                left, right = a.read(1 << 20), b.read(1 << 20)
                if left != right:
                    return False
                if not left:
                    return True
    except OSError:
        return False


def _walk(upper: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry of the upper layer (not following links), shallow first; errors raise."""
    pending = [""]
    while pending:
        directory = pending.pop()
        with os.scandir(upper / directory if directory else upper) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                relative = f"{directory}/{entry.name}" if directory else entry.name
                st = entry.stat(follow_symlinks=False)
                yield relative, st
                if stat.S_ISDIR(st.st_mode):
                    pending.append(relative)


def _signature(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_rdev)


def _opaque(path: Path) -> bool:
    for name in _OPAQUE:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def _apply_one(root: int, upper: Path, change: OverlayChange) -> None:
    *parents, name = change.path.split("/")
    parent = _descend(root, parents)
    try:
        if change.kind == "deleted":
            _remove(parent, name)
            return
        if change.kind == "dir":
            st = _lstat_at(parent, name)
            if change.opaque or (st is not None and not stat.S_ISDIR(st.st_mode)):
                _remove(parent, name)
                st = None
            if st is None:
                os.mkdir(name, 0o700, dir_fd=parent)
            os.chmod(name, stat.S_IMODE(os.lstat(upper / change.path).st_mode) & 0o777, dir_fd=parent,
                     follow_symlinks=False)  # fmt: skip
            return
        _remove(parent, name)  # a fresh inode: a hard link's other name, or what a link leads to, is untouched
        if change.kind == "symlink":
            assert change.target is not None
            os.symlink(change.target, name, dir_fd=parent)
        elif change.kind == "file":
            _copy_file(upper / change.path, parent, name)
        else:
            raise OSError(f"{change.path}: a special file is never applied")
    finally:
        os.close(parent)


def _copy_file(source: Path, parent: int, name: str) -> None:
    read = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(read)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{source} is no longer a regular file")
        write = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        stat.S_IMODE(st.st_mode) & 0o777, dir_fd=parent)  # fmt: skip
        try:
            while chunk := os.read(read, 1 << 20):
                os.write(write, chunk)
            os.fchmod(write, stat.S_IMODE(st.st_mode) & 0o777)  # the umask took bits the agent set
        finally:
            os.close(write)
    finally:
        os.close(read)


def _descend(root: int, parts: list[str]) -> int:
    """A descriptor of W/parts..., reached without following a link (what is there is a directory: the
    upper layer held each as one, applied shallow first)."""
    fd = os.dup(root)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(f"{part!r} is not a plain path component")
            child = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise
    return fd


def _lstat_at(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove(parent: int, name: str) -> None:
    """Remove `name` beneath `parent` whatever it is (a directory whole), never following a link."""
    st = _lstat_at(parent, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, _DIRECTORY, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            _remove(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
