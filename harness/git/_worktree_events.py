"""Whether anything in the worktree may have changed since the last look: inotify watches on its
directories (any process's writes, the sandboxed agent's too: a watch is on the inode, not the mount).
A change measure that finds no event since the last one costs a read of this queue instead of a `git
status` (about 290k instructions on a two-file repository, half of it libgit2's config snapshot).

Only the repository's own `.git` is left out (`RepositoryEvents` watches it); a `.git` below the root is
watched like any directory. Events beneath a directory git reported ignored at its last read (`target/`,
`out/`) say nothing: the meter counts such a directory as one entry, there or not, and its parent's events
say that; except a file there with more than one link, which may be a tracked file's other name. A
directory that stops being ignored (a `.gitignore` edit, itself an event) is watched again whole, and one
made (or moved in) beneath an ignored directory is watched as it appears.

What it does not see, and who does instead:
- `.git` is not watched: a commit moves HEAD, which the change meter compares itself (and the boundary's
  read taken while the agent closes a session is confirmed by `RepositoryEvents`, which watches it).
- A write through a shared memory mapping raises no event until the file's last mapping goes (nor does a
  Linux AIO write, `io_submit`, until its descriptor is closed); a measure
  before that (another event triggers one) counts it, and so does the next full git read: the task
  boundary's, unless the write came while the agent closed the session, after the read taken then (the
  boundary keeps that read when no event came: the next boundary's read sees the write).
- An ignore rule changed in `.git/info/exclude` or a global excludes file (neither is watched; the
  sandbox keeps `.git` read-only): what it un-ignores is counted at the next git read.
- A file hard-linked into the worktree and written through a name outside it (with the sandbox on, the
  worktree is a mount of its own and such a link cannot be made: EXDEV).
- More directories than `max_watches`, or a watch the kernel refuses (its per-user limit): the queue
  says "changed" from then on, and every measure reads git, as it would without this.
"""

from __future__ import annotations

import os
from pathlib import Path

from inotify_simple import Event, INotify
from inotify_simple import flags as IN

__all__ = ["WorktreeEvents"]

MAX_WATCHES = 20_000  # past this many directories the watches cost more than the git reads they save
CHANGES = (IN.MODIFY | IN.ATTRIB | IN.CLOSE_WRITE | IN.CREATE | IN.DELETE | IN.MOVED_FROM | IN.MOVED_TO
           | IN.DELETE_SELF | IN.MOVE_SELF)  # fmt: skip
WATCH = CHANGES | IN.ONLYDIR | IN.DONT_FOLLOW


class WorktreeEvents:
    def __init__(self, root: Path, *, max_watches: int = MAX_WATCHES) -> None:
        self.root = root
        self.max_watches = max_watches
        self.blind = False  # a watch could not be kept: every look says "changed"
        self._inotify = INotify(nonblocking=True)
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._told: frozenset[str] = frozenset()  # the ignored directories as git named them, last time
        self._ignored: frozenset[str] = frozenset()  # ... as "/abs/path/"
        self._inside: dict[int, bool] = {}  # watch descriptor -> beneath an ignored directory (a cache)
        self._watch_tree(str(root))

    def ignore(self, directories: frozenset[str]) -> None:
        """The directories (worktree-relative, `out/`) git reported ignored at its last read."""
        if directories == self._told:  # as last time (every read between tasks, usually)
            return
        ignored = frozenset(os.path.join(self.root, d.rstrip("/"), "") for d in directories)
        if self._ignored - ignored:  # one is ignored no more: what was made in it meanwhile is not watched
            self._watch_tree(str(self.root))
        self._told, self._ignored = directories, ignored
        self._inside.clear()

    def changed(self, *, strict: bool = False) -> bool:
        """True if anything may have changed since the last call. New directories are watched before this
        returns, so a read that follows sees what was written before, and an event says what came after.
        `strict`: events beneath ignored directories count too (no reasoning about what git would report)."""
        events = self._inotify.read(timeout=0)
        if self.blind:
            return True
        changed = False
        linked: dict[tuple[int, str], bool] = {}  # one lstat a name per look, however many writes it had
        gone = {(e.wd, e.name) for e in events if e.mask & (IN.DELETE | IN.MOVED_FROM)}  # names removed meanwhile
        for event in events:
            if event.mask & IN.Q_OVERFLOW:  # events were lost, directory creations among them
                self._watch_tree(str(self.root))
                changed = True
                continue
            inside = self._inside_ignored(event.wd)
            if event.mask & IN.IGNORED:  # the directory is gone (its parent had the event), ignored or not
                self._dirs.pop(event.wd, None)
                self._inside.pop(event.wd, None)  # the kernel may hand the descriptor out again
                changed = changed or strict or not inside
                continue
            if inside:  # a directory made here is watched all the same: a hard link written in it counts
                if event.mask & IN.ISDIR and event.mask & (IN.CREATE | IN.MOVED_TO) and event.wd in self._dirs:
                    self._watch_tree(os.path.join(self._dirs[event.wd], event.name))
                if not strict and not self._linked_elsewhere(event, linked, gone):
                    continue
            changed = True
            if event.mask & IN.ISDIR and event.mask & (IN.MOVED_FROM | IN.MOVED_TO) and not inside:
                self._watch_tree(str(self.root))  # a moved directory's watches carry their old paths: renew all
            elif event.mask & IN.ISDIR and event.mask & IN.CREATE and event.wd in self._dirs and not inside:
                self._watch_tree(os.path.join(self._dirs[event.wd], event.name))
        return changed

    def _linked_elsewhere(self, event: Event, looked: dict[tuple[int, str], bool], gone: set[tuple[int, str]]) -> bool:
        """A file that may have another name (a hard link from `build/f` to the tracked `src/f`): written
        through its ignored name, it changed a file that counts. The link count is read now, after the
        write: a name removed or renamed since (or missing now) may have been such a link, unlinked to hide
        the write, so it counts too (a build's write-then-rename costs a git read, no more)."""
        if event.mask & IN.ISDIR or not event.mask & (IN.MODIFY | IN.CLOSE_WRITE) or not event.name:
            return False  # only a content change through this name can change the other
        key = (event.wd, event.name)
        if key in gone:
            return True
        if key not in looked:
            try:
                looked[key] = os.lstat(os.path.join(self._dirs[event.wd], event.name)).st_nlink > 1
            except OSError:
                looked[key] = True
        return looked[key]

    def _inside_ignored(self, wd: int) -> bool:
        if wd not in self._inside:
            directory = self._dirs.get(wd)
            here = None if directory is None else os.path.join(directory, "")
            self._inside[wd] = here is not None and any(here.startswith(ignored) for ignored in self._ignored)
        return self._inside[wd]

    def close(self) -> None:
        self._inotify.close()

    def _watch_tree(self, top: str) -> None:
        own = os.path.join(self.root, ".git")  # the repository's own (RepositoryEvents): a `.git` below is watched
        if top == own:
            return
        for directory, subdirs, _files in os.walk(top, onerror=self._unlisted, followlinks=False):
            if directory == str(self.root):
                subdirs[:] = [d for d in subdirs if os.path.join(directory, d) != own]
            if self.blind or not self._watch(directory):
                return

    def _unlisted(self, error: OSError) -> None:
        if not isinstance(error, FileNotFoundError):  # one it cannot list may hold what it cannot watch
            self.blind = True

    def _watch(self, directory: str) -> bool:
        if len(self._dirs) >= self.max_watches:
            self.blind = True
            return False
        try:
            wd = self._inotify.add_watch(directory, WATCH)
        except FileNotFoundError:
            return True  # gone again: its parent's event said so
        except OSError:  # ENOSPC (the per-user limit), EACCES: this directory cannot be watched
            self.blind = True
            return False
        self._dirs[wd] = directory  # the same directory again: the same descriptor, its path renewed
        self._inside.pop(wd, None)
        return True
