"""The kernel's commit after a completed task (`workspace.commit`).

Under the sandbox `.git` is read-only to the agent: the trusted kernel owns git. After a task ends
Completed with changes, it commits them and pushes to the upstream, so the next task starts on a clean
tree. Git runs here outside the sandbox, so nothing the agent could have planted runs with it: hooks and
fsmonitor are off, no pager, no signing prompt, no credential prompt.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from ._config import CommitConfig
from ._transport import pin_git

__all__ = ["commit_task"]

_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "commit.gpgsign=false",
         "-c", "core.pager=cat", "--no-pager")  # fmt: skip


async def commit_task(workspace: Path, settings: CommitConfig, task_id: str, title: str) -> dict[str, Any]:
    """Commit every change in the worktree, then push: what the transcript records of it."""
    status = await _git(workspace, "status", "--porcelain", "--untracked-files=all")
    if status[0] != 0:
        return {"committed": False, "error": status[1]}
    record: dict[str, Any] = {"committed": False}
    if status[1].strip():
        identity: tuple[str, ...] = ()
        if settings.author:
            name, email = re.fullmatch(r"(.+) <(.+)>", settings.author).groups()  # type: ignore[union-attr]
            identity = ("-c", f"user.name={name}", "-c", f"user.email={email}")
        message = settings.message.format(id=task_id, title=title)
        for args in (("add", "-A"), (*identity, "commit", "-q", "--no-verify", "-m", message)):
            code, output = await _git(workspace, *args)
            if code != 0:
                return {"committed": False, "error": output}
        code, sha = await _git(workspace, "rev-parse", "HEAD")
        record = {"committed": True, "sha": sha.strip(), "message": message}
    if settings.push:  # also what the agent committed itself (sandbox.git_writable): the upstream is outside
        code, output = await _git(workspace, "push", "-q")
        record["pushed"] = code == 0
        if code != 0:
            record["error"] = output
    return record


async def _git(workspace: Path, *args: str) -> tuple[int, str]:
    env = pin_git({**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true"})
    process = await asyncio.create_subprocess_exec(
        "git", *_SAFE, *args, cwd=workspace, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode(errors="replace")[-2000:]
