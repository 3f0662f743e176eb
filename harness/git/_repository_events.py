"""Whether anything the boundary's git read depends on, inside the repository's own directories, may have
changed since the last look: inotify watches on the git dir and the shared one of a linked worktree (HEAD,
the index, the configuration, `packed-refs`, the edit-session files: MERGE_HEAD, rebase-merge/, ...), each
`info/` (the exclude file) and every directory under each `refs/`. Git replaces each of those files by
renaming a lock file over it, or appends to it in place: either is an event on a watched directory. Objects
and logs are not watched: git's own writes there change nothing the read takes (commits are immutable). What
git does not write is not followed: a watched name made a symlink to elsewhere, a submodule's git dir.

With `WorktreeEvents` it lets the boundary read git while the agent closes the session: the read stands only
if neither queue had an event from just before it until the close was answered (`Run._boundary_state`), and
only where the agent cannot write `.git` at all (the sandbox on, `git_writable` off) and the index holds no
submodule: there this queue is for what someone else does meanwhile (a person's commit, a branch switch).

Any event counts, and the watches are renewed then (a new directory under `refs/`, an `info/` made since):
between task boundaries events here are rare (a commit, a push, a fetch). Past `max_watches` directories, or
when a watch cannot be kept, the queue says "changed" from then on and every boundary reads git afresh.
"""

from __future__ import annotations

import os
from pathlib import Path

from inotify_simple import INotify

from ._worktree_events import WATCH

__all__ = ["RepositoryEvents"]

MAX_WATCHES = 2_000  # a refs tree this deep (thousands of branch folders) is read afresh at every boundary


class RepositoryEvents:
    def __init__(self, git_dirs: list[Path], *, max_watches: int = MAX_WATCHES) -> None:
        self.git_dirs = list(dict.fromkeys(git_dirs))
        self.max_watches = max_watches
        self.blind = False
        self._inotify = INotify(nonblocking=True)
        self._watches = 0
        self._watch_all()

    def changed(self) -> bool:
        """True if anything may have changed since the last call (the watches are renewed before it returns)."""
        events = self._inotify.read(timeout=0)
        if events and not self.blind:
            self._watch_all()
        return bool(events) or self.blind

    def close(self) -> None:
        self._inotify.close()

    def _watch_all(self) -> None:
        """Every directory watched again (the same directory keeps its descriptor): a new one is watched, one
        gone has left an event already."""
        self._watches = 0
        for git_dir in self.git_dirs:
            if not self._watch(str(git_dir)):
                return
            if os.path.isdir(git_dir / "info") and not self._watch(str(git_dir / "info")):
                return
            for directory, _subdirs, _files in os.walk(git_dir / "refs", onerror=self._unlisted, followlinks=False):
                if self.blind or not self._watch(directory):
                    return

    def _unlisted(self, error: OSError) -> None:
        if not isinstance(error, FileNotFoundError):
            self.blind = True

    def _watch(self, directory: str) -> bool:
        if self._watches >= self.max_watches:
            self.blind = True
            return False
        try:
            self._inotify.add_watch(directory, WATCH)
        except FileNotFoundError:
            return True  # gone: an event on its parent said so
        except OSError:
            self.blind = True
            return False
        self._watches += 1
        return True
