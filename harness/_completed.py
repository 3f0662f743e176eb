"""What a memory queue completed in earlier runs, so that a rerun does not do it again.

GitHub closes an issue once its task completes; the memory host has no memory past its process. So
the kernel keeps the ids of the memory queue's completed tasks beside the transcripts
(`<transcripts>/.completed/<key>.json`), one file per workspace and queue: the worktree's path and
git directory, the config file and its content (an edited config is a fresh record), the queue's
trigger. A run killed after T1 completed skips T1 on the rerun of the same config, and its result
says so. Delete the file (or the directory) to run them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["CompletedTasks"]


class CompletedTasks:
    def __init__(self, transcripts: Path, *, workspace: Path, git_dir: Path | None, queue: str) -> None:
        identity = [os.path.realpath(workspace), queue]
        if git_dir is not None:
            with contextlib.suppress(OSError):  # a recreated repository at the same path is another queue
                identity.append(str(os.stat(git_dir).st_ino))
        key = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:20]
        self.path = transcripts / ".completed" / f"{key}.json"
        self._identity = identity

    def load(self) -> dict[str, dict[str, Any]]:
        """Task id -> where and when it completed; empty when nothing was recorded (or it is unreadable)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        tasks = data.get("tasks") if isinstance(data, dict) else None
        return {str(k): v for k, v in tasks.items() if isinstance(v, dict)} if isinstance(tasks, dict) else {}

    def add(self, task_id: str, transcript: Path) -> None:
        """Record a completed task (atomically: a crash leaves the old file or the new one)."""
        tasks = self.load()
        tasks[task_id] = {"transcript": str(transcript), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"queue": self._identity, "tasks": tasks}), encoding="utf-8")
        os.replace(partial, self.path)
