"""What a task changed, judged by the policy (issue 30): what lands is what the rules allow.

Requests are not the only writes: an agent writes with its own tools, and commands write what they like where
the sandbox lets them. So at every task boundary (a task ended Completed) and again in the kernel's commit, every
path the task changed is judged by the function that judges a write request (`Policy.judge_write`: deny wins,
protected paths, no rule is a refusal), and one a read-deny rule covers is refused too (the agent could not
have been allowed to write it). One refused path ends the task `BlockedPolicy`, nothing of it committed or
pushed; the refused changes stay in the tree for a person to see (the next run's clean-tree check names them).

The change set (`read_change_set`), from one in-process libgit2 read (the tree was clean when the task started,
a precondition): every path `git status` lists against HEAD (created, modified, deleted, both sides of a rename,
a mode or type change, a symlink; a repository the task made, `dir/`, as itself), every path ignored now that
was not when the task started (an ignored directory is walked to name its files, up to `MAX_WALKED`), and every
path a commit the agent made itself changed (`sandbox.git_writable`: HEAD against the task's starting commit).

`judge_change` is the one judgement: the boundary refuses what it refuses; the commit stages only what it
allows, and commits nothing at all when it finds a refused path the boundary did not see (written since).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import pygit2
from pygit2.enums import FileStatus

from .._paths import within
from ..sandbox._overlay import OverlayChange, WorktreeOverlay
from ._policy import Policy, Verdict

__all__ = [
    "HEAD_NOW",
    "Change",
    "ChangeSetUnreadable",
    "Judged",
    "change_refusal",
    "judge_change",
    "judge_change_set",
    "judge_overlay",
    "read_change_set",
    "refusal_reason",
    "unreadable_reason",
]

MAX_NAMED = 100  # refused paths a reason names (`total` counts them all)
MAX_WALKED = 10_000  # files named beneath one directory the task made under an ignore rule
_IGNORED = int(FileStatus.IGNORED)
_GITLINK = 0o160000


class ChangeSetUnreadable(Exception):
    """The task's changes could not be read: the boundary fails closed."""


@dataclass(frozen=True)
class Change:
    """One path the task changed, relative to the worktree's root as git spells it (a directory ends in "/")."""

    path: str
    gitlink: bool = False  # a submodule entry, in HEAD or in the worktree
    why: str | None = None  # refused whatever the rules say (too many files beneath to name)


@dataclass(frozen=True)
class Judged:
    """One changed path and the policy's answer: `why` is None when it is allowed."""

    path: str
    why: str | None
    rule_ids: tuple[str, ...] = ()  # the rule that decided a refusal, where one did
    ours: bool = True  # the task's change (False: ignored when the task started, whatever ignore files say now)

    @property
    def refused(self) -> bool:
        """A change of the task's that the policy refuses: it ends the task."""
        return self.why is not None and self.ours

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"path": self.path, "why": self.why}
        if self.rule_ids:
            entry["rule_ids"] = list(self.rule_ids)
        return entry


#: `start_head` for a task whose commits are not its own to judge (HEAD as it is now is where it started).
HEAD_NOW: Any = object()


def read_change_set(
    repo: pygit2.Repository, *, start_head: pygit2.Oid | Any | None, ignored_at_start: AbstractSet[str]
) -> list[Change]:
    """Every path the task changed since it started (see the module docstring); with `start_head` HEAD_NOW, the
    worktree against HEAD only. Raises `pygit2.GitError` or `OSError` when git cannot be read: the caller fails
    closed."""
    top = repo.workdir
    if top is None:
        raise ChangeSetUnreadable("the repository has no worktree")
    changes: dict[str, Change] = {}
    for path, flags in repo.status(untracked_files="all", ignored=True).items():
        if flags & _IGNORED:
            if was_ignored(path, ignored_at_start):  # there when the task started: not its change
                continue
            for change in _beneath(top, path) if path.endswith("/") else (Change(path),):
                changes.setdefault(change.path, change)
        elif not path.endswith("/") and _in_index_as_gitlink(repo, path):
            changes[path] = Change(path, gitlink=True)  # a submodule entry (its worktree changed, or it moved)
        else:
            changes[path] = Change(path)
    try:
        target = repo.head.target
        head = target if isinstance(target, pygit2.Oid) else None
    except pygit2.GitError:  # unborn
        head = None
    if start_head is not HEAD_NOW and head != start_head:  # commits since the start: what they changed, both sides
        if head is None:
            raise ChangeSetUnreadable("HEAD names no commit now, and it named one when the task started")
        old = repo[start_head].peel(pygit2.Tree) if start_head is not None else _empty_tree(repo)
        for delta in old.diff_to_tree(repo[head].peel(pygit2.Tree)).deltas:
            gitlink = _GITLINK in (delta.old_file.mode, delta.new_file.mode)
            for path in dict.fromkeys((delta.old_file.path, delta.new_file.path)):
                known = changes.get(path)
                changes[path] = Change(path, gitlink or (known is not None and known.gitlink))
    return [changes[path] for path in sorted(changes)]


def judge_change_set(changes: Iterable[Change], policy: Policy, ignored: AbstractSet[str], top: str) -> list[Judged]:
    return [judge_change(change, policy, ignored, top) for change in changes]


def judge_change(change: Change, policy: Policy, ignored: AbstractSet[str], top: str) -> Judged:
    """The policy's answer on one changed path: as a write request to it would be judged (and a symlink at its
    own place too, not only where it leads), a read deny refusing as well. `ignored`: what git reported
    ignored when the task started (not the task's change); `top`: the worktree's root."""
    ours = not was_ignored(change.path, ignored)
    if change.why is not None:
        return Judged(change.path, change.why, (), ours)
    if change.path.endswith("/"):  # git lists a directory whole only when it holds a repository
        return Judged(change.path, "a repository of its own: committed, it would be a gitlink (a submodule entry)",
                      (), ours)  # fmt: skip
    if change.gitlink:
        return Judged(change.path, "a submodule (gitlink): the kernel's commit never changes one", (), ours)
    where = os.path.join(top, change.path)  # the policy's workspace may be below the worktree's root
    read = policy.judge_read(where)
    if not read.allowed and read.reason.get("kind") == "denied":  # a read rule's deny, not a missing allow
        return Judged(change.path, _refusal("read", read), read.rule_ids, ours)
    if os.path.islink(where):  # its own place: a write request to it would be judged where it leads
        own = _judge_in_place(policy, where)
        if not own.allowed:
            return Judged(change.path, _refusal("write", own), own.rule_ids, ours)
    write = policy.judge_write(where)
    if not write.allowed:
        return Judged(change.path, _refusal("write", write), write.rule_ids, ours)
    if not ours:
        return Judged(change.path, "ignored when the task started (an ignore file written since un-ignores it)",
                      (), ours)  # fmt: skip
    return Judged(change.path, None, write.rule_ids, ours)


def refusal_reason(judged: Sequence[Judged]) -> dict[str, Any] | None:
    """A `BlockedPolicy` reason naming the refused changes (up to MAX_NAMED, `total` counts them), or None."""
    refused = [j for j in judged if j.refused]
    return change_refusal([j.to_json() for j in refused[:MAX_NAMED]], len(refused)) if refused else None


def change_refusal(paths: Sequence[dict[str, Any]], total: int) -> dict[str, Any]:
    """The reason for refused changes named as `Judged.to_json` does (`rule_id`: the first rule that decided)."""
    first = next((p["rule_ids"][0] for p in paths if p.get("rule_ids")), None)
    return {
        "kind": "policy_refusal",
        "source": "change",
        "rule_id": first,
        "paths": list(paths),
        "total": total,
        "detail": f"{total} path(s) the task changed are not what the policy allows: nothing of it is committed",
    }


def unreadable_reason(error: str) -> dict[str, Any]:
    """The reason when the change set could not be read: the boundary fails closed."""
    return {"kind": "policy_refusal", "source": "change", "rule_id": None, "paths": [], "total": 0,
            "detail": f"the task's changes could not be read, so they could not be judged: {error}",
            "error": error}  # fmt: skip


def was_ignored(path: str, ignored: AbstractSet[str]) -> bool:
    """`path` or a directory above it is in `ignored` (git lists an ignored directory once, as `dir/`)."""
    if path in ignored:
        return True
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in ignored for i in range(1, len(parts)))


def _beneath(top: str, directory: str) -> list[Change]:
    """The files (and symlinks, fifos, ...) beneath a directory git lists whole as ignored, never following a
    symlink; past MAX_WALKED, the directory itself, refused (too many to name)."""
    found: list[Change] = []
    root = os.path.join(top, directory)
    for here, dirs, files in os.walk(root):
        for name in (*files, *(d for d in dirs if os.path.islink(os.path.join(here, d)))):
            found.append(Change(os.path.relpath(os.path.join(here, name), top)))
            if len(found) > MAX_WALKED:
                why = f"more than {MAX_WALKED} files beneath a directory the task made under an ignore rule"
                return [Change(directory, why=why)]
    return found


def _judge_in_place(policy: Policy, where: str) -> Verdict:
    """A symlink judged where it is, not where it leads: its directory resolved, its own name kept."""
    directory = policy.resolve(os.path.dirname(where))
    if directory is None:
        return Verdict(False, (), {"kind": "outside_worktree", "resolved": os.path.realpath(os.path.dirname(where))})
    relative = os.path.basename(where) if directory == "." else f"{directory}/{os.path.basename(where)}"
    return policy.judge_place("write", relative)  # the rules alone: deny wins, no rule refuses


# --- the overlay's change set (harness/sandbox/_overlay.py) ------------------------------------------------------


def judge_overlay(changes: Sequence[OverlayChange], overlay: WorktreeOverlay, policy: Policy) -> list[Judged]:
    """Each path the overlay's upper layer says the task changed, judged by place as a write request to it
    would be: every path the upper layer holds is already resolved (its directories are real directories in
    the agent's view), so nothing is followed. A deletion or an opaque directory is judged on every path of
    the worktree it takes away; a symlink where it is and where it leads; a special file (a fifo, a socket)
    is refused. A directory is no change of its own (git holds none): what it holds is judged."""
    judged: list[Judged] = []
    repositories: set[str] = set()
    for change in changes:
        parts = change.path.split("/")
        nested = next((i for i, part in enumerate(parts) if part.lower() == ".git"), None)
        if nested is not None:  # a repository of its own, named once (as git would list it)
            repository = "/".join(parts[:nested]) + "/" if nested else ".git"  # `.git`: at the workspace itself
            if repository not in repositories:
                repositories.add(repository)
                judged.append(Judged(repository, "a repository of its own: committed, it would be a gitlink (a "
                                                 "submodule entry)"))  # fmt: skip
            continue
        holder = _repository_above(overlay, parts)
        if holder is not None:  # inside a submodule's or a nested repository's worktree: never the kernel's to land
            if holder not in repositories:
                repositories.add(holder)
                judged.append(Judged(holder, "inside a repository of its own (a submodule or a nested repository):"
                                             " the kernel's commit never changes one"))  # fmt: skip
            continue
        if change.kind == "special":
            judged.append(Judged(change.path, "a special file (a fifo, a socket, a device): never landed"))
            continue
        places = [] if change.kind == "dir" else [change.path]  # a directory is no content: git lists none
        if change.kind == "deleted" or change.opaque:
            gone = overlay.deleted_beneath(change, MAX_WALKED)
            if len(gone) > MAX_WALKED:
                judged.append(Judged(change.path, f"takes away more than {MAX_WALKED} paths: too many to name"))
                continue
            places = gone
        places_judged = [_judge_overlay_place(policy, overlay.worktree, place) for place in places]
        if change.kind == "symlink" and change.target is not None and not any(j.refused for j in places_judged):
            places_judged = [_judge_link_target(policy, overlay, change.path, change.target)]
        judged.extend(places_judged)
    return judged


def _repository_above(overlay: WorktreeOverlay, parts: list[str]) -> str | None:
    """The nearest directory above a changed path that holds a `.git` in the worktree (a submodule, a nested
    repository): its path, or None."""
    for depth in range(len(parts) - 1, 0, -1):
        holder = "/".join(parts[:depth])
        if os.path.lexists(os.path.join(overlay.worktree, holder, ".git")):
            return holder
    return None


def _judge_overlay_place(policy: Policy, top: str, path: str) -> Judged:
    relative = _relative_to(policy, os.path.join(top, path))
    if relative is None:
        return Judged(path, "outside the policy's workspace")
    read = policy.judge_place("read", relative)
    if not read.allowed and read.reason.get("kind") == "denied":  # a read rule's deny, not a missing allow
        return Judged(path, _refusal("read", read), read.rule_ids)
    write = policy.judge_place("write", relative)
    return Judged(path, None if write.allowed else _refusal("write", write), write.rule_ids)


def _judge_link_target(policy: Policy, overlay: WorktreeOverlay, path: str, target: str) -> Judged:
    """Where a symlink leads, resolved as the OS will resolve it in the agent's view (each link on the way
    followed, `..` taken after it): it must stay in the workspace and be a place a write may reach."""
    where = _resolve_link(overlay, path, target)
    relative = None if where is None else _relative_to(policy, where)
    if relative is None:
        return Judged(path, f"it resolves outside the workspace, to {where or target}")
    verdict = policy.judge_place("write", relative)
    return Judged(path, None if verdict.allowed else _refusal("write", verdict), verdict.rule_ids)


def _resolve_link(overlay: WorktreeOverlay, path: str, target: str, hops: int = 40) -> str | None:
    """The absolute path a symlink at `path` (relative to the worktree) with text `target` leads to: component
    by component, every link on the way read where the agent sees it (the merged view, else the worktree).
    None past `hops` links (a loop)."""
    top, view = overlay.worktree, overlay.view or overlay.worktree
    pending = target.split("/")
    current = "/" if os.path.isabs(target) else os.path.join(top, os.path.dirname(path))
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        seen = view + candidate[len(top) :] if within(candidate, top) else candidate
        if os.path.islink(seen):
            hops -= 1
            if hops < 0:
                return None
            text = os.readlink(seen)
            pending = [*text.split("/"), *pending]
            current = "/" if os.path.isabs(text) else current
            continue
        current = candidate
    return current


def _relative_to(policy: Policy, where: str) -> str | None:
    root = str(policy.worktree)
    if where == root:
        return "."
    return where[len(root.rstrip("/")) + 1 :] if where.startswith(root.rstrip("/") + "/") else None


def _in_index_as_gitlink(repo: pygit2.Repository, path: str) -> bool:
    try:
        return bool(repo.index[path].mode == _GITLINK)
    except (KeyError, ValueError):
        return False


def _empty_tree(repo: pygit2.Repository) -> pygit2.Tree:
    empty = repo.get(repo.TreeBuilder().write())
    assert isinstance(empty, pygit2.Tree)
    return empty


def _refusal(kind: str, verdict: Verdict) -> str:
    reason = verdict.reason
    what = reason.get("kind")
    if what == "denied":
        return f"{kind}-denied by rule {reason.get('rule_id')}"
    if what == "unmatched":
        return f"no {kind} rule allows it"
    if what == "protected_path":
        return "a protected path"
    if what == "outside_worktree":
        return f"it resolves outside the workspace, to {reason.get('resolved')}"
    if what == "hard_link":
        return "a file with another hard link (its other name may be outside, protected or denied)"
    return f"refused by the policy ({what})"
