"""Preconditions, checked at activation and at every task boundary.

Each failure is a `BlockedPrecondition` stop whose reason names the check:

    agent_permission_support  the bound agent declares it supports permission requests
    policy_non_empty          the policy has at least one rule
    host_authorized           the queue's host accepts our credentials
    git_worktree              the workspace is a git worktree
    git_edit_session          no rebase, merge, cherry-pick, revert or bisect in progress
    git_upstream              the branch has an upstream
    git_unpushed_commits      no commits ahead of the upstream
    git_clean_tree            no working-tree changes that no task owns

The git checks cost one in-process libgit2 read (about 0.5 ms), not a `git` subprocess.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2
from pygit2.enums import FileStatus, RepositoryState

from ..record._terminals import Stop, Terminal
from ._upstreams import Upstreams

__all__ = ["GitState", "blocked", "check_git", "find_git_dir", "read_git_state", "repository_dirs"]

_EDIT_SESSIONS = {
    RepositoryState.MERGE: "merge",
    RepositoryState.REVERT: "revert",
    RepositoryState.REVERT_SEQUENCE: "revert",
    RepositoryState.CHERRYPICK: "cherry-pick",
    RepositoryState.CHERRYPICK_SEQUENCE: "cherry-pick",
    RepositoryState.BISECT: "bisect",
    RepositoryState.REBASE: "rebase",
    RepositoryState.REBASE_INTERACTIVE: "rebase",
    RepositoryState.REBASE_MERGE: "rebase",
    RepositoryState.APPLY_MAILBOX: "am",
    RepositoryState.APPLY_MAILBOX_OR_REBASE: "rebase",
}
# Porcelain-style two-letter codes for the change list in a reason.
_INDEX_CODES = (
    (FileStatus.INDEX_NEW, "A"),
    (FileStatus.INDEX_MODIFIED, "M"),
    (FileStatus.INDEX_DELETED, "D"),
    (FileStatus.INDEX_RENAMED, "R"),
    (FileStatus.INDEX_TYPECHANGE, "T"),
)
_WORKTREE_CODES = (
    (FileStatus.WT_MODIFIED, "M"),
    (FileStatus.WT_DELETED, "D"),
    (FileStatus.WT_RENAMED, "R"),
    (FileStatus.WT_TYPECHANGE, "T"),
)


@dataclass(frozen=True)
class GitState:
    branch: str | None  # None when HEAD is detached or unborn
    upstream: str | None
    ahead: int
    changes: tuple[str, ...]  # "XY path" entries, untracked included, ignored excluded (but a self-hiding .gitignore)
    edit_session: str | None
    ignored: frozenset[str] = frozenset()  # the ignored paths as git reports them (a change meter's start)
    head: pygit2.Oid | None = None  # the commit HEAD names (None: unborn)


def blocked(check: str, detail: str, **facts: Any) -> Stop:
    return Stop(Terminal.BLOCKED_PRECONDITION, {"kind": "precondition", "check": check, "detail": detail, **facts})


def find_git_dir(worktree: Path) -> Path | None:
    """The worktree's own git dir, or None if the workspace is not in a git worktree."""
    found = pygit2.discover_repository(str(worktree))
    if found is None:
        return None
    try:
        repo = pygit2.Repository(found)
    except pygit2.GitError:
        return None
    return None if repo.is_bare else Path(repo.path)


_IGNORED = int(FileStatus.IGNORED)  # a plain int: IntFlag's & runs Python code for every entry


def repository_dirs(git_dir: Path) -> list[Path]:
    """The worktree's git dir and, for a linked worktree, the repository's shared one (named in `commondir`)."""
    try:
        return [git_dir, (git_dir / (git_dir / "commondir").read_text().strip()).resolve()]
    except OSError:
        return [git_dir]


def read_git_state(
    worktree: Path, git_dir: Path, repo: pygit2.Repository | None = None, upstreams: Upstreams | None = None
) -> GitState:
    """One in-process read (libgit2) of everything the git checks need.

    Pass the same `repo` on every call of a run: libgit2 re-reads the index, refs and config
    when they change on disk (tests change each of them between reads), so only opening the
    repository, about half the cost, is saved; and the same `upstreams` (over that `repo`), which
    keeps which ref a branch tracks while no configuration file changed.
    """
    repo = repo or pygit2.Repository(str(git_dir))
    upstreams = upstreams or Upstreams(repo, repository_dirs(git_dir))
    status = repo.status(ignored=True)
    changes = tuple(f"{_code(flags)} {path}" for path, flags in sorted(status.items())
                    if not flags & _IGNORED or _hides_itself(path))  # fmt: skip
    ignored = frozenset(path for path, flags in status.items() if flags & _IGNORED)
    edit = _EDIT_SESSIONS.get(repo.state())  # keyed by RepositoryState, an IntEnum: its int finds it
    try:
        head = repo.head  # one read of HEAD for all below (head_is_unborn and head_is_detached are a read each)
    except pygit2.GitError:  # unborn: the branch HEAD names has no commit yet
        return GitState(None, None, 0, changes, edit, ignored)
    oid = head.target if isinstance(head.target, pygit2.Oid) else None
    if head.name == "HEAD":  # detached: HEAD holds a commit, not a branch's name
        return GitState(None, None, 0, changes, edit, ignored, oid)
    branch = head.shorthand
    upstream = None
    ahead = 0
    tracked = upstreams.name(branch)
    ref = repo.references.get(tracked) if tracked is not None else None  # read at every boundary: a push shows
    try:
        target = ref.resolve().target if ref is not None else None
    except pygit2.GitError:  # a symbolic ref to nothing
        target = None
    if ref is not None and isinstance(target, pygit2.Oid):
        upstream = ref.shorthand
        ahead = 0 if target == head.target else repo.ahead_behind(head.target, target)[0]
    return GitState(branch, upstream, ahead, changes, edit, ignored, oid)


def _hides_itself(path: str) -> bool:
    """An ignored `.gitignore`: no committed file is ignored, so an uncommitted ignore file hides itself (and
    whatever it ignores beside it) from the clean-tree check. It is a change the task left, shown as `!!`."""
    return path == ".gitignore" or path.endswith("/.gitignore")


def _code(flags: int) -> str:
    if flags & FileStatus.IGNORED:
        return "!!"
    if flags & FileStatus.WT_NEW:
        return "??"
    if flags & FileStatus.CONFLICTED:
        return "UU"
    index = next((c for f, c in _INDEX_CODES if flags & f), ".")
    worktree = next((c for f, c in _WORKTREE_CODES if flags & f), ".")
    return index + worktree


def check_git(state: GitState, *, left_by_task: str | None = None) -> Stop | None:
    """The first failing git check, or None when the workspace is ready for a task."""
    if state.edit_session is not None:
        return blocked("git_edit_session", f"a {state.edit_session} is in progress", session=state.edit_session)
    if state.branch is None:
        return blocked("git_upstream", "HEAD is detached: there is no branch to push")
    if state.upstream is None:
        return blocked("git_upstream", f"branch {state.branch!r} has no upstream", branch=state.branch)
    if state.ahead > 0:
        return blocked(
            "git_unpushed_commits",
            f"{state.ahead} commit(s) on {state.branch!r} are not pushed to {state.upstream}",
            ahead=state.ahead,
            upstream=state.upstream,
            **({"left_by_task": left_by_task} if left_by_task else {}),
        )
    if state.changes:
        owner = f"left by task {left_by_task}" if left_by_task else "that no task owns"
        return blocked(
            "git_clean_tree",
            f"{len(state.changes)} working-tree change(s) {owner}",
            changes=list(state.changes[:50]),
            **({"left_by_task": left_by_task} if left_by_task else {}),
        )
    return None
