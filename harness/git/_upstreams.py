"""Which ref a branch's upstream is, as libgit2 resolves it, resolved again only when the configuration changed.

libgit2's `git_branch_upstream_name` looks the remote up, and that reads the whole configuration: about 400k
instructions, more than the `git status` beside it, at every task boundary of a run. What it answers depends
on the configuration alone (`branch.<b>.remote`, `branch.<b>.merge`, the remote's URLs and fetch refspecs),
so the answer is kept while no configuration file libgit2 reads changed on disk. The test is libgit2's own
for reloading one (inode, size, modification time; the change time too), with git's guard against racy
timestamps: a file modified in the last two seconds may change again within the same tick, so nothing is
kept until it is older. An edit that keeps the size and puts the modification time back is asked of libgit2
again, which does not see it either (it answers from the configuration it had). A configuration with an
include (`include.path`, `includeIf.*.path`) names files this does not follow: it is resolved every time.

The ref itself (what the upstream points at) is read at every boundary: a push is seen at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pygit2
from pygit2.enums import ConfigLevel

__all__ = ["Upstreams"]

RACY_S = 2.0  # a file modified this recently is not trusted to show its next change (coarse timestamps)
_FILES = {ConfigLevel.PROGRAMDATA: "config", ConfigLevel.SYSTEM: "gitconfig", ConfigLevel.XDG: "config",
          ConfigLevel.GLOBAL: ".gitconfig"}  # fmt: skip

Stamp = tuple[int, int, int, int] | None


class Upstreams:
    def __init__(self, repo: pygit2.Repository, git_dirs: list[Path]) -> None:
        self.repo = repo
        self.resolved = 0  # how many times libgit2 was asked (the others were kept answers)
        self._files = [*_user_files(), *(str(d / n) for d in git_dirs for n in ("config", "config.worktree"))]
        self._stamps: list[Stamp] | None = None
        self._names: dict[str, str | None] = {}

    def name(self, branch: str) -> str | None:
        """The full name of the ref `branch` tracks (`refs/remotes/origin/main`), or None: none is set."""
        stamps = self._read_stamps()
        if stamps == self._stamps and branch in self._names:
            return self._names[branch]
        if stamps != self._stamps:
            self._stamps, self._names = None, {}
        self.resolved += 1
        try:
            upstream = self.repo.branches.local[branch].upstream_name
        except (KeyError, pygit2.GitError):  # no such branch, or no (valid) upstream configured
            upstream = None
        if self._keepable(stamps) and stamps == self._read_stamps():  # and nothing changed meanwhile
            self._stamps = stamps
            self._names[branch] = upstream
        return upstream

    def _read_stamps(self) -> list[Stamp]:
        return [_stamp(f) for f in self._files]

    def _keepable(self, stamps: list[Stamp]) -> bool:
        # A write sets both times to the clock's tick: the stamp shows it unless the file's modification time
        # (never later than its change time) is already in that tick.
        newest = max((s[2] for s in stamps if s is not None), default=0)
        if time.time_ns() - newest < RACY_S * 1e9:
            return False
        return not any(s is not None and _includes(f) for f, s in zip(self._files, stamps, strict=True))


def _user_files() -> list[str]:
    """The system, XDG and global configuration files libgit2 looks for (each search path may hold several
    directories)."""
    files = []
    for level, name in _FILES.items():
        try:
            paths = pygit2.settings.search_path[level]
        except (ValueError, pygit2.GitError):
            continue
        files += [os.path.join(d, name) for d in str(paths or "").split(os.pathsep) if d]
    return files


def _stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _includes(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return b"include" in f.read().lower()
    except OSError:
        return True
