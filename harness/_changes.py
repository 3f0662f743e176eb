"""Files and lines changed since a task started, from git (seed 002's change accounting).

    a tracked text file     its changed lines: deletions + additions, an added line of L bytes counting
                            ceil(L / 80) (a dense payload with few newlines cannot slip under the cap)
    an untracked text file  its lines, or ceil(size / 80) when that is more
    a binary file           counts toward the file cap, zero lines (git's test: a NUL in the first 8000 bytes)
    an ignored path         zero lines, one file per entry git reports (`target/` whole), when it was not
                            there when the task started; a git failure charges it as untracked

`measure()` first reads `git status` (about 0.2 ms here) and the size and mtime of each changed path;
when neither changed since the last measure, the last figures stand. Only then does it diff the task's
starting tree against the worktree.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import DeltaStatus, DiffOption, FileStatus

__all__ = ["ChangeMeter", "Changes"]

BYTES_PER_LINE = 80
COUNT_NEWLINES_UP_TO = 8 << 20
BINARY_PROBE = 8000  # git reads this much of a file for a NUL before calling it binary
_WORKTREE = DiffOption.INCLUDE_UNTRACKED | DiffOption.RECURSE_UNTRACKED_DIRS


@dataclass(frozen=True)
class Changes:
    files: int
    lines: int


class ChangeMeter:
    """One task's change accounting against the tree it started from."""

    def __init__(self, workspace: Path, git_dir: Path) -> None:
        self.workspace = workspace
        self.repo = pygit2.Repository(str(git_dir))
        self._start_tree: pygit2.Tree | None = None
        self._start_head: pygit2.Oid | None = None
        self._ignored_at_start: frozenset[str] = frozenset()
        self._fingerprint: object = None
        self._last = Changes(0, 0)

    def start(self) -> None:
        """The task starts now: what is there now is not its change."""
        self._start_head = self._head()
        self._start_tree = None if self._start_head is None else self.repo.head.peel(pygit2.Commit).tree
        status = self.repo.status(untracked_files="all", ignored=True)
        self._ignored_at_start = frozenset(p for p, flags in status.items() if flags & FileStatus.IGNORED)
        self._fingerprint, self._last = None, Changes(0, 0)

    def measure(self) -> Changes:
        status = self.repo.status(untracked_files="all", ignored=True)
        head = self._head()
        fingerprint = (head, tuple(sorted((p, f, self._stat(p, f)) for p, f in status.items())))
        if fingerprint == self._fingerprint:
            return self._last
        ignored = [p for p, flags in status.items() if flags & FileStatus.IGNORED and p not in self._ignored_at_start]
        files, lines = len(ignored), 0
        if head != self._start_head or any(not flags & FileStatus.IGNORED for flags in status.values()):
            changed_files, changed_lines = self._diff()
            files, lines = files + changed_files, changed_lines
        self._fingerprint, self._last = fingerprint, Changes(files, lines)
        return self._last

    def _head(self) -> pygit2.Oid | None:
        if self.repo.head_is_unborn:
            return None
        target = self.repo.head.target
        return target if isinstance(target, pygit2.Oid) else None

    def _stat(self, path: str, flags: int) -> tuple[int, int] | None:
        if flags & FileStatus.IGNORED:
            return None  # an ignored path charges no lines: only whether it is there matters
        try:
            st = os.lstat(self.workspace / path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _diff(self) -> tuple[int, int]:
        """The starting tree against the worktree: changed files and charged lines."""
        tree = self._start_tree
        if tree is None:  # no commit yet: everything is new
            empty = self.repo.get(self.repo.TreeBuilder().write())
            assert isinstance(empty, pygit2.Tree)
            tree = empty
        diff = tree.diff_to_workdir(_WORKTREE)
        files = lines = 0
        for index, delta in enumerate(diff.deltas):
            if delta.status == DeltaStatus.IGNORED:
                continue
            files += 1
            if delta.status == DeltaStatus.UNTRACKED:
                lines += _untracked_lines(self.workspace / delta.new_file.path)
                continue
            patch = diff[index]
            if patch is None or delta.is_binary:
                continue
            lines += _patch_lines(patch)
        return files, lines


def _untracked_lines(path: Path) -> int:
    """A new file's lines, or ceil(size / 80) when that is more; a binary file charges none. Only a regular
    file is read, never through a symlink and never blocking: the agent may plant a fifo, or a link to
    /dev/zero or to a file outside, where the kernel would otherwise hang or read what is not the task's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0  # gone, or a symlink (git stores its target path: a line at most)
    with open(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        head = file.read(BINARY_PROBE)
        if b"\0" in head:
            return 0
        if st.st_size > COUNT_NEWLINES_UP_TO:  # ceil(size / 80) is over any sensible cap already
            return math.ceil(st.st_size / BYTES_PER_LINE)
        newlines = head.count(b"\n") + file.read(COUNT_NEWLINES_UP_TO).count(b"\n")
    return max(newlines, math.ceil(st.st_size / BYTES_PER_LINE))


def _patch_lines(patch: pygit2.Patch) -> int:
    lines = 0
    for hunk in patch.hunks:
        for line in hunk.lines:
            if line.origin == "-":
                lines += 1
            elif line.origin == "+":
                lines += max(1, math.ceil(len(line.raw_content) / BYTES_PER_LINE))
    return lines
