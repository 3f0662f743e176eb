"""One loop per worktree: a lock file in the worktree's git dir, held for the whole run.

`loop-harness run`, the control server's loops and any other kernel on the machine take the same lock, so a
second loop on a worktree is refused (`BlockedPrecondition workspace_free`, or the server's 409
`workspace_busy`) instead of racing the first one's agent. It lives in `.git/info`, which the sandbox keeps
read-only even when the agent may commit (`git_writable`): an agent that could unlink it would let a second
loop lock a fresh file on the same worktree. A symlink planted there is not followed (filelock opens with
O_NOFOLLOW): the lock cannot be taken, and nothing it names is touched.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["WorktreeBusy", "lock_worktree"]


class WorktreeBusy(Exception):
    def __init__(self, lock_file: str, why: str = "another loop holds it: one workspace, one loop") -> None:
        super().__init__(f"{lock_file}: {why}")
        self.lock_file = lock_file


def lock_worktree(git_dir: Path) -> FileLock:
    """The worktree's lock, taken now (WorktreeBusy when another loop holds it, or it cannot be taken). Not
    thread-local: the server takes it in a worker thread and gives it back on the event loop's."""
    path = git_dir / "info" / "loop-harness.lock"
    lock = FileLock(path, thread_local=False)
    try:
        path.parent.mkdir(exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        raise WorktreeBusy(str(path)) from None
    except OSError as exc:  # a planted symlink (ELOOP), a read-only or missing directory
        raise WorktreeBusy(str(path), f"cannot be taken ({exc.strerror or exc})") from None
    return lock
