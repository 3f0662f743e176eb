"""What a memory queue completed in a run that did not drain it, so that the rerun does not do it again.

GitHub closes an issue once its task completes; the memory host has no memory past its process. So
the kernel keeps the ids of the memory queue's completed tasks beside the transcripts
(`<transcripts>/.completed/<key>.json`), one file per workspace and queue: the worktree's path and
git directory, the config file and its content (an edited config is a fresh record), the queue's
trigger. A run killed (or blocked) after T1 completed skips T1 on the rerun of the same config, and
its result says so; a run that drains the queue (`Idle`) clears the record, so the next one starts
afresh. Delete the file to run them again sooner.

A caller that knows the queue's identity better than a config can (the control server: one workspace,
one host and queue, whatever else its config says) names the file itself, and keeps it past `Idle`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

__all__ = ["CompletedTasks"]


class CompletedTasks:
    def __init__(self, path: Path, *, forget_when_drained: bool = True) -> None:
        self.path = path
        self.forget_when_drained = forget_when_drained  # `Idle` clears the record (a CLI run's queue)
        self._fd: int | None = None  # opened at the first completion, kept for the run (`close`)

    @classmethod
    def beside(cls, transcripts: Path, *, workspace: Path, git_dir: Path | None, queue: str) -> CompletedTasks:
        """A CLI run's record: keyed by the worktree, its repository and the queue as the config writes it."""
        identity = [os.path.realpath(workspace), queue]
        if git_dir is not None:
            with contextlib.suppress(OSError):  # a recreated repository at the same path is another queue
                identity.append(str(os.stat(git_dir).st_ino))
        key = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:20]
        return cls(transcripts / ".completed" / f"{key}.jsonl")

    def load(self) -> dict[str, dict[str, Any]]:
        """Task id -> where and when it completed; empty when nothing was recorded. One JSON line per
        completion, appended: a line torn by a crash is skipped, the others stand."""
        tasks: dict[str, dict[str, Any]] = {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return tasks
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return tasks
            lines = f.read(16 << 20).decode("utf-8", errors="replace").splitlines()
        for line in lines:
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                entry = json.loads(line)
                # only the fields the kernel writes, as text: a line cannot rewrite the reason it becomes
                tasks[str(entry["id"])] = {k: str(entry[k]) for k in ("transcript", "at") if k in entry}
        return tasks

    def add(self, task_id: str, transcript: Path) -> None:
        """Record a completed task: one line appended (one write(2)), before the kernel acts on the
        completion."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not stat.S_ISDIR(os.lstat(self.path.parent).st_mode):
                raise OSError(f"{self.path.parent} is not a directory")
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, 0o644)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = json.dumps({"id": task_id, "transcript": str(transcript), "at": at}) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def clear(self) -> None:
        self.close()
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(self.path.parent).st_mode):  # never through a symlinked directory
                self.path.unlink(missing_ok=True)
