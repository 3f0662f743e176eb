"""Where a path lands: resolved into the worktree, protected or not, what a directory holds, and its verdict.

Paths are resolved (symlinks, `..`) before matching; a path outside the worktree is never a worktree path,
`/proc` is never readable, and a file with more than one hard link is refused. A directory read or written
whole is judged with everything beneath it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from .._paths import real_path
from ._rules import Rules, glob_matches, holds, may_hold, may_name_a_child
from ._verdict import Verdict, refuse, safely

__all__ = ["DEFAULT_PROTECTED", "Places", "hard_linked"]

#: Written by no agent, whatever the rules say (relative to the worktree): all of `.git`, which
#: covers its config, refs, packed-refs, hooks and modules, and a linked worktree's gitfile.
#: (`.git` at any depth is protected too: see `Places.is_protected`.)
DEFAULT_PROTECTED = (".git", ".git/**")
_MAX_CONTENTS = 100_000  # paths beneath a directory read or written whole, before it is too large to judge


class Places:
    """The paths of one worktree (`root`, absolute and real) judged against its rules and protected paths.

    Parameters:
        rules: the policy's rules (deny rules see what a directory holds).
        root: the worktree, resolved.
        protected_globs: protected paths relative to the worktree, `DEFAULT_PROTECTED` among them.
        protected_paths: absolute, resolved files or directories the agent may never write.
    """

    def __init__(self, rules: Rules, root: str, protected_globs: Sequence[str], protected_paths: Sequence[str]) -> None:
        self._rules = rules
        self.root = root  # string prefixes: this runs for every path an agent names
        self._protected_globs = tuple(protected_globs)
        self._protected_paths = tuple(protected_paths)

    # --- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The path relative to the worktree after resolving symlinks and `..`; None if outside."""
        return self.locate(path)[1]

    def locate(self, path: str) -> tuple[str, str | None]:
        """Where `path` really is (absolute), and that relative to the worktree (None if outside)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"not a path: {path!r}")
        real = real_path(os.path.join(self.root, path))  # an absolute `path` replaces the root
        if real == self.root:
            return real, "."
        return real, real[len(self.root.rstrip("/")) + 1 :] if _inside(real, self.root) else None

    def judge_place(self, kind: str, relative: str) -> Verdict:
        """`relative` (to the worktree, already resolved: no link is followed) judged by place alone: a protected
        path for a write, then the rules (deny wins, no rule refuses). What the change set's judgement asks."""
        if kind == "write" and self.is_protected(relative):
            return Verdict(False, ("protected",), {"kind": "protected_path", "path": relative})
        return self._rules.judge(kind, [relative], frozenset())

    def is_protected(self, relative: str) -> bool:
        """A protected path, inside one, or a directory that holds one (deleting `.` takes `.git`)."""
        if relative == "." or ".git" in relative.lower().split("/"):  # every .git, nested ones too
            return True
        if any(glob_matches(g, relative) or holds(relative, g) for g in self._protected_globs):
            return True
        real = os.path.join(self.root, relative)
        return any(real == p or _inside(real, p) or _inside(p, real) for p in self._protected_paths)

    def nested_repository(self, place: str) -> str | None:
        """The nearest directory from `place` up to (not including) the worktree root that git would
        take for a repository of its own: one holding `.git`, or one that looks like a bare repository."""
        relative = self.resolve(place) or "."
        parts = [] if relative == "." else relative.split("/")
        while parts:
            here = os.path.join(self.root, *parts)
            if os.path.lexists(os.path.join(here, ".git")) or _looks_like_git_dir(here):
                return "/".join(parts)
            parts.pop()
        return None

    def places_from(self, cwds: Sequence[str], directory: str, *, logical: bool = False) -> list[str] | None:
        """Where `git -C DIR` (the kernel resolves it) or `cd DIR` leads from each possible cwd; None if any
        reading leads outside. Bash's `cd` is logical: it drops `link/..` as text before it looks (and
        falls back to the kernel's reading when that fails), so a `cd` is judged both ways."""
        places: list[str] = []
        for cwd in cwds:
            physical = self.resolve(os.path.join(cwd, directory))
            if physical is None:
                return None
            places.append(physical)
            if logical:
                text = os.path.normpath(os.path.join(cwd, directory))
                if os.path.isabs(directory) and _inside(text, self.root):
                    text = text[len(self.root.rstrip("/")) + 1 :]
                if text == ".." or text.startswith("../") or os.path.isabs(text) or self.resolve(text) is None:
                    return None
                places.append(text)
        return list(dict.fromkeys(places))

    # --- judging paths -------------------------------------------------------------------------

    def judge(
        self,
        kind: str,
        paths: Sequence[str],
        approvals: frozenset[tuple[str, str]],
        *,
        confine_only: bool = False,
        recursive: bool = True,
        follows: bool = False,
        masked: bool = False,
    ) -> Verdict:
        """Paths read or written: confined to the worktree, never `/proc`, protected or hard-linked, then with
        what a directory holds (`recursive`, `follows` its links, `masked`: denied reads hidden) by the rules."""
        relative: list[str] = []
        for path in paths:
            real, rel = self.locate(path)
            if real == "/proc" or real.startswith("/proc/"):  # the kernel's environment, memory and fds
                return refuse("proc", path=path, resolved=real)
            if rel is None:
                return refuse("outside_worktree", path=path, resolved=real)
            if kind == "write" and self.is_protected(rel):
                return Verdict(False, ("protected",), {"kind": "protected_path", "path": rel})
            if hard_linked(real):
                why = "a file with another name may be outside the worktree, protected or denied"
                return refuse("hard_link", path=rel, why=why)
            relative.append(rel)
        whole = recursive or kind == "write"
        masked = masked and kind == "read"  # what a read deny matches beneath is masked: only links out matter
        beneath: list[str] = []
        for rel in relative if whole else ():
            if follows and kind == "read":
                refusal, contents = self._linked_contents(rel)
            elif masked:
                continue
            else:
                refusal, contents = self._contents(kind, rel)
            if refusal is not None:
                return refusal
            beneath += [] if masked else contents
        if confine_only:
            return Verdict(True, ("interactive",), {"kind": "interactive"}, tuple(relative))
        verdict = self._rules.judge(kind, relative, approvals, whole=whole and not masked, also_denied=beneath)
        return Verdict(verdict.allowed, verdict.rule_ids, verdict.reason, tuple(relative))  # not replace(): 30 us

    def judge_stored(self, lexical: str) -> Verdict:
        """A pathspec's files read from git's object store, named as git names them (`lexical`: relative to the
        worktree, no link followed). Any revision may hold anything at or below it, so a read deny that may
        match there applies, whatever the worktree holds now (`**/.env` may match below any path). One outside
        the worktree is left to the judge of the place it resolves to, which refuses it."""
        for rule in self._rules:
            if rule.kind == "read" and rule.decision == "deny":
                for pattern in rule.patterns:
                    if may_hold(lexical, pattern):  # it matches there, or below it, or may
                        return Verdict(False, (rule.id,), {"kind": "denied", "rule_id": rule.id, "target": lexical})
        return Verdict(True)

    def _contents(self, kind: str, relative: str) -> tuple[Verdict | None, list[str]]:
        """A directory written or read whole is reached with everything beneath it: a protected path there
        refuses a write (deleting `src` takes `src/sub/.git`), and deny rules see each path there (with
        `**/secrets/**` denied, deleting `src` takes `src/secrets/`). Symlinks beneath are not followed:
        deleting or moving one never reaches its target. `.` is already covered: it holds everything."""
        real = os.path.join(self.root, relative)
        if relative == "." or not os.path.isdir(real) or os.path.islink(real):
            return None, []
        denies = [p for r in self._rules if r.kind == kind and r.decision == "deny" for p in r.patterns]
        if kind == "read" and not any(may_hold(relative, p) for p in denies):
            return None, []
        found: list[str] = []
        for top, dirs, files in os.walk(real):
            for name in (*dirs, *files):
                entry = f"{top}/{name}"[len(self.root.rstrip("/")) + 1 :]
                if kind == "write" and self.is_protected(entry):
                    return Verdict(False, ("protected",), {"kind": "protected_path", "path": entry, "in": relative}), []
                if name in files and hard_linked(f"{top}/{name}"):  # `cp -r x/. docs` writes through it too
                    why = "a file beneath has another name that may be outside the worktree, protected or denied"
                    return refuse("hard_link", path=entry, why=why), []
                found.append(entry)
            if len(found) > _MAX_CONTENTS:
                return refuse("too_many_files", path=relative, why=f"more than {_MAX_CONTENTS} paths to judge"), []
        return None, found

    def _linked_contents(self, relative: str) -> tuple[Verdict | None, list[str]]:
        """A directory read whole by a reader that follows symlinks (`grep -R`, `rg -L`, `zip -r`, `find -L`):
        every path beneath, as it is reached and where it really is. A link that leads outside refuses."""
        real = os.path.join(self.root, relative)
        if not os.path.isdir(real):
            return None, []
        found: list[str] = []
        seen = {os.path.realpath(real)}
        for top, dirs, files in os.walk(real, followlinks=True):
            # a directory reached twice (a link back up, `a/loop -> ..`) is walked once
            dirs[:] = [d for d in dirs if os.path.realpath(f"{top}/{d}") not in seen]
            seen.update(os.path.realpath(f"{top}/{d}") for d in dirs)
            for name in (*dirs, *files):
                entry = f"{top}/{name}"
                if name in files and hard_linked(entry):
                    why = "a file beneath has another name that may be outside the worktree, protected or denied"
                    return refuse("hard_link", path=entry[len(self.root.rstrip("/")) + 1 :], why=why), []
                if not os.path.islink(entry) and top == os.path.realpath(top):
                    found.append(entry[len(self.root.rstrip("/")) + 1 :])
                    continue
                target = self.resolve(entry)
                if target is None:
                    why = "a symlink beneath leads outside the worktree and the reader follows it"
                    return refuse("outside_worktree", path=entry, resolved=os.path.realpath(entry), why=why), []
                found += [entry[len(self.root.rstrip("/")) + 1 :], target]
            if len(found) > _MAX_CONTENTS:  # a cycle of links ends here too
                return refuse("too_many_files", path=relative, why=f"more than {_MAX_CONTENTS} paths to judge"), []
        return None, found

    # --- where programs are found --------------------------------------------------------------

    def search_path(self, value: str) -> str:
        """`Policy.search_path`: `PATH` without the directories an agent could plant a program in."""
        kept = []
        for entry in value.split(os.pathsep):
            if not os.path.isabs(entry):
                continue
            rel = self.resolve(entry)
            if rel is not None and (self._writable(os.path.join(entry, "planted")) or any(
                may_name_a_child(rel, p) for r in self._rules if r.kind == "write" and r.decision == "allow"
                for p in r.patterns)):  # fmt: skip
                continue  # `write src/git` lets it plant the `git` an allowed `git status` would run
            if self._links_to_writable(entry):
                continue
            kept.append(entry)
        return os.pathsep.join(kept)

    def _links_to_writable(self, directory: str) -> bool:
        """A symlink in `directory` whose target a write rule lets the agent write (a committed
        `bin/git -> ../docs/g` under `write docs/**`): what runs by that name is the agent's."""
        try:
            with os.scandir(directory) as entries:
                links = [entry.path for entry in entries if entry.is_symlink()]  # d_type: no stat per name
        except (FileNotFoundError, NotADirectoryError):
            return False  # nothing there to run
        except OSError:
            return True  # what it holds cannot be seen (a directory it may not list): it may hold such a link
        # Only a link into the worktree can be writable: asking the policy of those alone keeps a PATH of
        # 800 system links (/usr/bin) at their realpath cost.
        inside = [link for link in links if _inside(os.path.realpath(link), self.root)]
        return any(self._writable(link) for link in inside)

    def _writable(self, path: str) -> bool:
        """What `Policy.judge_write` answers for `path`, with no approvals."""
        return safely(self.judge, "write", [path], frozenset()).allowed


def _inside(path: str, directory: str) -> bool:
    """`path` lies strictly below `directory` (both absolute and normalised)."""
    return path.startswith(directory.rstrip("/") + "/")


def _looks_like_git_dir(directory: str) -> bool:
    """What git's discovery takes for a bare repository: HEAD beside objects/ and refs/."""
    return all(os.path.lexists(os.path.join(directory, name)) for name in ("HEAD", "objects", "refs"))


def hard_linked(real: str) -> bool:
    """A regular file with more than one name (not followed if a link): its other name may be outside, protected
    or denied. The sandbox masks these too."""
    try:
        st = os.lstat(real)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1
