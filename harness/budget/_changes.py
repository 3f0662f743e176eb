"""Files and lines changed since a task started, from git (change accounting: docs/budgets.md).

    a tracked text file     its changed lines: deletions + additions, an added line of L bytes counting
                            ceil(L / 80) (a dense payload with few newlines cannot slip under the cap)
    a new text file         its lines, or ceil(size / 80) when that is more
    a binary file           counts toward the file cap, zero lines (git's test: a NUL in the first 8000 bytes)
    an ignored path         zero lines, one file per entry git reports (`target/` whole), when it was not
                            there when the task started
    anything else           (a symlink, a fifo, a deleted binary) a file, zero lines; never opened or followed

`measure()` first asks the worktree's inotify queue (`WorktreeEvents`): no event since the last measure
and HEAD where it was, the last figures stand, for the cost of one read of the queue. Otherwise it reads
`git status` (it uses the index's stat cache) and the size and mtime of each changed path; when neither
moved since the last measure, the last figures stand. Otherwise only the paths status names (and those a
commit since the start changed) are compared with the task's starting tree, each file read once: the cost
grows with the change, not with the repository (`loop-harness bench changes`).

A task starts from the task boundary's own git read when that found the tree clean (`boundary()`): its
figures are zero as of the queue drained just before that read, so the first measure needs no git read
of its own when nothing happened since.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import DiffOption, FileStatus

from ..git._worktree_events import WorktreeEvents
from ..sandbox._overlay import WorktreeOverlay

__all__ = ["ChangeCount", "ChangeMeter"]

BYTES_PER_LINE = 80
BINARY_PROBE = 8000  # git reads this much of a file for a NUL before calling it binary
READ_UP_TO = 8 << 20  # past this, ceil(size / 80) is over any sensible cap already: the rest is not read


@dataclass(frozen=True)
class ChangeCount:
    """Files and lines changed since the task started (the budget model for its caps is `_limits.Changes`)."""

    files: int
    lines: int


@dataclass(frozen=True)
class _Boundary:
    ignored: frozenset[str]  # what git reported ignored there
    head: pygit2.Oid | None
    drained: bool  # the event queue was emptied just before that read


class ChangeMeter:
    """One task's change accounting against the tree it started from."""

    def __init__(self, workspace: Path, git_dir: Path, events: WorktreeEvents | None = None) -> None:
        self.workspace = workspace
        self.repo = pygit2.Repository(str(git_dir))
        self.events = events
        self.git_reads = 0  # measures that read git (the others were answered by the event queue)
        self._start_tree: pygit2.Tree | None = None
        self._start_head: pygit2.Oid | None = None
        self._ignored_at_start: frozenset[str] = frozenset()
        self._fingerprint: object = None
        self._last = ChangeCount(0, 0)
        self._last_head: pygit2.Oid | None = None
        self._current = False  # `_last` holds as of the last drain of the event queue
        self._boundary: _Boundary | None = None
        self._started = False
        #: with a copy-on-write worktree, the agent's changes are its upper layer until the boundary applies them
        self.overlay: WorktreeOverlay | None = None

    def before_boundary_read(self) -> None:
        """The task boundary reads git next: empty the event queue first, so that what it reads is all that
        happened before, and an event is what came after."""
        if self.events is not None:
            self.events.changed()

    @property
    def ignored_at_start(self) -> frozenset[str]:
        """What git reported ignored when the task started: never the task's own change, whatever `.gitignore`
        the task wrote since (the kernel's commit leaves these out)."""
        return self._ignored_at_start

    @property
    def start_head(self) -> pygit2.Oid | None:
        """The commit HEAD named when the task started (None: unborn): the agent's own commits since are its change."""
        return self._start_head

    @property
    def started(self) -> bool:
        """The last `start()` read where the task starts from (False: it failed, the task's changes are unknown)."""
        return self._started

    def boundary(self, *, clean: bool, ignored: frozenset[str], head: pygit2.Oid | None) -> None:
        """What the boundary read found: when clean, the next task may start from it (its ignored paths,
        git lists them as `measure` does when the tree is clean)."""
        drained = self.events is not None and not self.events.blind
        self._boundary = _Boundary(ignored, head, drained) if clean else None
        self._tell_ignored(ignored)

    def start(self) -> None:
        """The task starts now: what is there now is not its change. From a clean boundary the figures are
        zero; a path ignored there and gone since would go uncounted if made again, one that appeared in
        between is counted (the safe way)."""
        boundary, self._boundary = self._boundary, None
        self._started = False  # until the start below is read whole
        # From a boundary, its HEAD: a commit since then is one since the start, and the first measure finds
        # HEAD moved and reads git (nothing else in the kernel moves HEAD between the two).
        head = boundary.head if boundary is not None else self._head()
        if head != self._start_head or self._start_tree is None:  # the last task's tree, when HEAD stayed
            self._start_tree = None if head is None else self._tree(head)
        self._start_head = head
        if boundary is not None:
            self._ignored_at_start, self._current = boundary.ignored, boundary.drained
        else:
            status = self.repo.status(untracked_files="all", ignored=True)
            self._ignored_at_start = frozenset(p for p, flags in status.items() if flags & FileStatus.IGNORED)
            self._tell_ignored(self._ignored_at_start)
            self._current = False  # the tree may differ from HEAD already: the first measure reads git
        self._fingerprint, self._last, self._last_head = None, ChangeCount(0, 0), self._start_head
        self._started = True

    def measure(self) -> ChangeCount:
        if self.overlay is not None and self.overlay.view is not None:
            return self._measure_overlay(self.overlay, self.overlay.view)
        quiet = self.events is not None and not self.events.changed()  # drained before any read below
        head = self._head()
        if quiet and self._current and head == self._last_head:
            return self._last
        self.git_reads += 1
        status = self.repo.status(untracked_files="all", ignored=True)
        self._tell_ignored(p for p, flags in status.items() if flags & FileStatus.IGNORED)
        fingerprint = (head, tuple(sorted((p, f, self._stat(p, f)) for p, f in status.items())))
        if fingerprint != self._fingerprint:
            self._fingerprint, self._last = fingerprint, self._count(status, head)
        self._last_head = head
        self._current = self.events is not None and not self.events.blind
        return self._last

    def _measure_overlay(self, overlay: WorktreeOverlay, view: str) -> ChangeCount:
        """The figures from the overlay's upper layer: each path the task changed there, its lines against the
        starting tree as the agent sees the file now (the worktree itself is untouched until the boundary)."""
        self.git_reads += 1
        paths: list[str] = []
        for change in overlay.task_changes():
            if change.kind == "dir" and not change.opaque:
                continue
            if change.kind == "deleted" or change.opaque:
                paths += overlay.deleted_beneath(change, 100_000)
            if change.kind != "deleted":
                paths.append(change.path)
        fingerprint = tuple(sorted((p, self._stat_in(view, p)) for p in paths))
        if fingerprint != self._fingerprint:
            tree = self._start_tree or self._empty_tree()
            files, lines = 0, 0
            for path in sorted(set(paths)):
                charged = self._path_lines(tree, path, Path(view))
                if charged is not None:
                    files, lines = files + 1, lines + charged
            self._fingerprint, self._last = fingerprint, ChangeCount(files, lines)
        return self._last

    def _stat_in(self, base: str, path: str) -> tuple[int, int] | None:
        try:
            st = os.lstat(os.path.join(base, path))
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def close(self) -> None:
        if self.events is not None:
            self.events.close()

    def _tell_ignored(self, paths: Iterable[str]) -> None:
        """The event queue learns which directories git last reported ignored (their events say nothing)."""
        if self.events is not None:
            self.events.ignore(frozenset(p for p in paths if p.endswith("/")))

    def diff_now(self) -> ChangeCount:
        """The same figures from libgit2's diff of the starting tree against the worktree (it reads every file:
        no index, so no stat cache), whatever status says: what `measure` saves (`loop-harness bench changes`)."""
        status = self.repo.status(untracked_files="all", ignored=True)
        tree = self._start_tree or self._empty_tree()
        diff = tree.diff_to_workdir(DiffOption.INCLUDE_UNTRACKED | DiffOption.RECURSE_UNTRACKED_DIRS)
        changed = {d.new_file.path for d in diff.deltas} | {p for p, f in status.items() if f & FileStatus.IGNORED}
        return self._count({p: status.get(p, FileStatus.WT_MODIFIED) for p in changed}, self._head())

    # --- counting ----------------------------------------------------------------------------------

    def _count(self, status: dict[str, int], head: pygit2.Oid | None) -> ChangeCount:
        ignored = [p for p, flags in status.items() if flags & FileStatus.IGNORED and p not in self._ignored_at_start]
        paths = {p for p, flags in status.items() if not flags & FileStatus.IGNORED}
        tree = self._start_tree or self._empty_tree()
        if head != self._start_head and head is not None:  # a commit since the start: what it changed counts
            committed = tree.diff_to_tree(self._tree(head))
            paths |= {path for delta in committed.deltas for path in (delta.old_file.path, delta.new_file.path)}
        files, lines = len(ignored), 0
        for path in sorted(paths):
            charged = self._path_lines(tree, path)
            if charged is not None:
                files, lines = files + 1, lines + charged
        return ChangeCount(files, lines)

    def _path_lines(self, tree: pygit2.Tree, path: str, base: Path | None = None) -> int | None:
        """The lines `path` (as it is beneath `base`, the worktree by default) charges against the starting
        tree; None when it is as it was."""
        base = base or self.workspace
        old = _blob(self.repo, tree, path)
        if not os.path.lexists(base / path):  # deleted: its lines, as deletions
            return None if old is None else 0 if old.is_binary else _patch_lines(old.diff_to_buffer(b""))
        new = _read_regular(base / path)
        if new is None:  # a symlink, a fifo, a socket: a file, no lines
            return 0
        if old is not None and old.data == new:
            return None
        if b"\0" in new[:BINARY_PROBE] or (old is not None and old.is_binary):
            return 0
        if old is None:
            return max(new.count(b"\n"), math.ceil(_size(base / path, new) / BYTES_PER_LINE))
        return _patch_lines(old.diff_to_buffer(new))

    # --- helpers ------------------------------------------------------------------------------------

    def _head(self) -> pygit2.Oid | None:
        try:  # one resolution of HEAD (asking head_is_unborn first is a second)
            target = self.repo.head.target
        except pygit2.GitError:  # unborn: no commit yet
            return None
        return target if isinstance(target, pygit2.Oid) else None

    def _tree(self, commit: pygit2.Oid) -> pygit2.Tree:
        return self.repo[commit].peel(pygit2.Tree)

    def _empty_tree(self) -> pygit2.Tree:
        empty = self.repo.get(self.repo.TreeBuilder().write())
        assert isinstance(empty, pygit2.Tree)
        return empty

    def _stat(self, path: str, flags: int) -> tuple[int, int] | None:
        if flags & FileStatus.IGNORED:
            return None  # an ignored path charges no lines: only whether it is there matters
        try:
            st = os.lstat(self.workspace / path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size


def _blob(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> pygit2.Blob | None:
    try:
        entry = tree[path]
    except KeyError:
        return None
    blob = repo.get(entry.id)
    return blob if isinstance(blob, pygit2.Blob) else None


def _read_regular(path: Path) -> bytes | None:
    """A regular file's bytes (up to READ_UP_TO), never through a symlink and never blocking: the agent may
    plant a fifo, or a link to /dev/zero or to a file outside, where the kernel would hang or read what is
    not the task's. None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(READ_UP_TO)


def _size(path: Path, read: bytes) -> int:
    """The file's whole size (what was read stops at READ_UP_TO)."""
    try:
        return max(len(read), os.lstat(path).st_size)
    except OSError:
        return len(read)


def _patch_lines(patch: pygit2.Patch) -> int:
    lines = 0
    for hunk in patch.hunks:
        for line in hunk.lines:
            if line.origin == "-":
                lines += 1
            elif line.origin == "+":
                lines += max(1, math.ceil(len(line.raw_content) / BYTES_PER_LINE))
    return lines
