"""The workspace permission policy: four rule kinds, deny wins, default refuse.

Every request the agent makes (a permission request, an `fs/*` call, a
`terminal/create`) is reduced to targets of one rule kind: worktree paths for
read and write, simple commands for execute, hosts for network. Each target
must be matched by an allow rule and by no deny rule, whatever the rule order.
Paths are resolved (symlinks, `..`) before matching, and a path outside the
worktree is never a worktree path. Protected paths are never writable, and
neither is any directory that holds one (deleting or moving `.` or `.git`);
a deny rule likewise covers the directories above what it denies. A request
the policy cannot make sense of (wrong types, unparseable commands) is refused.

A `Verdict` names the rule ids that decided it; the kernel records them. For
paths it also carries where they resolved, so the kernel acts on exactly the
file that was judged.

With an empty rule list (the interactive path) a person answers permission
requests; `fs/*` and `terminal/*` then reach only what a person approved in
the current turn (`approve`), still confined to the worktree.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ._config import RuleConfig
from ._shell import Unparseable, parse_invocation

__all__ = ["DEFAULT_PROTECTED", "TOOL_KIND_TO_RULE_KIND", "Policy", "Verdict", "glob_matches"]

#: Written by no agent, whatever the rules say (relative to the worktree): all of `.git`, which
#: covers its config, refs, packed-refs, hooks and modules, and a linked worktree's gitfile.
DEFAULT_PROTECTED = (".git", ".git/**")

#: ACP tool kinds and the rule kind that governs them; `think` needs no permission.
TOOL_KIND_TO_RULE_KIND = {
    "read": "read",
    "search": "read",
    "edit": "write",
    "delete": "write",
    "move": "write",
    "execute": "execute",
    "fetch": "network",
}

#: A rawInput key that names a place we do not read (`dir_path`, `directory`, `cwd`, ...): not "no path".
_LOCATION_WORDS = re.compile(r"path|dir|folder|root|cwd|location|file", re.IGNORECASE)
_PATH_KEYS = ("file_path", "path", "notebook_path", "source", "destination", "target", "old_path", "new_path")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule_ids: tuple[str, ...] = ()
    reason: Mapping[str, Any] = field(default_factory=dict)
    paths: tuple[str, ...] = ()  # the judged paths, resolved, relative to the worktree


class Policy:
    """Judges requests against the rules of one worktree.

    Parameters:
        rules: the workspace rules; an empty list means the interactive path.
        worktree: the git worktree the agent works in.
        protected_globs: extra protected paths, relative to the worktree.
        protected_files: absolute files or directories the agent may never write (config, role, transcripts).
    """

    def __init__(
        self,
        rules: Sequence[RuleConfig],
        worktree: Path,
        *,
        protected_globs: Iterable[str] = (),
        protected_files: Iterable[Path] = (),
    ) -> None:
        self.rules = tuple(rules)
        self.worktree = Path(os.path.realpath(worktree))
        self._protected_globs = (*DEFAULT_PROTECTED, *protected_globs)
        # Absolute files or directories outside the globs' reach: the run's config, role, transcripts.
        self._protected_paths = tuple(os.path.realpath(p) for p in protected_files)
        self._root = str(self.worktree)  # string prefixes: this runs for every path an agent names
        self._approved: set[tuple[str, str]] = set()  # interactive path: (rule kind, target) a person allowed

    @property
    def interactive(self) -> bool:
        """No rules: permission requests go to the interactive handler, not the policy."""
        return not self.rules

    # --- requests ------------------------------------------------------------------------------

    def judge_tool_call(self, tool_call: Mapping[str, Any]) -> Verdict:
        """Judge a `session/request_permission` by what its tool call would touch."""
        return _safely(self._judge_tool_call, tool_call)

    def judge_read(self, path: str) -> Verdict:
        return _safely(self._judge_fs, "read", path)

    def judge_write(self, path: str) -> Verdict:
        return _safely(self._judge_fs, "write", path)

    def judge_execute(
        self, command: str | Sequence[str], args: Sequence[str] | None = None, *, cwd: str | None = None
    ) -> Verdict:
        """Judge a command: every simple command in it, and every file it redirects to."""
        return _safely(self._judge_execute, command, args, cwd)

    def approve(self, tool_call: Mapping[str, Any]) -> None:
        """The interactive path: a person allowed this tool call; its targets become reachable."""
        kind = TOOL_KIND_TO_RULE_KIND.get(str(tool_call.get("kind")))
        raw = tool_call.get("rawInput") if isinstance(tool_call.get("rawInput"), Mapping) else {}
        if kind in ("read", "write"):
            for path in tool_call_paths(tool_call):
                rel = self.resolve(path) if isinstance(path, str) else None
                if rel is not None:
                    self._approved.add((kind, rel))
        elif kind == "execute" and raw.get("command"):
            try:
                invocation = parse_invocation(
                    raw["command"], raw.get("args") if isinstance(raw["command"], str) else None
                )
            except Unparseable:
                return
            self._approved.update(("execute", c.text) for c in invocation.commands)

    def forget_approvals(self) -> None:
        """A turn ended: what a person approved in it is not approved for the next."""
        self._approved.clear()

    def _judge_tool_call(self, tool_call: Mapping[str, Any]) -> Verdict:
        kind = tool_call.get("kind")
        if kind == "think":
            return Verdict(True, ("builtin:think",), {"kind": "no_permission_needed"})
        rule_kind = TOOL_KIND_TO_RULE_KIND.get(str(kind))
        if rule_kind is None:
            return _refuse("unmatched", why="no rule kind governs this tool kind", tool_kind=kind)
        raw = tool_call.get("rawInput")
        raw = raw if isinstance(raw, Mapping) else {}
        if rule_kind in ("read", "write"):
            paths = tool_call_paths(tool_call)
            if not paths and kind == "search" and not any(_LOCATION_WORDS.search(str(k)) for k in raw):
                paths = ["."]  # Grep/Glob with no path search the session cwd: the worktree
            if not paths:
                return _refuse("no_target", why="the request names no path", tool_kind=kind)
            return self._judge_paths(rule_kind, paths)
        if rule_kind == "execute":
            command = raw.get("command") or raw.get("cmd")
            if not command:
                return _refuse("no_target", why="the request names no command", tool_kind=kind)
            cwd = raw.get("cwd") or raw.get("workdir")
            args = raw.get("args") if isinstance(command, str) else None
            return self.judge_execute(command, args, cwd=cwd)
        hosts = [h for h in (_host_of(raw.get(k)) for k in ("url", "uri", "host")) if h]
        if not hosts:
            return _refuse("no_target", why="the request names no host", tool_kind=kind)
        return self._judge("network", hosts)

    def _judge_fs(self, kind: str, path: str) -> Verdict:
        return self._judge_paths(kind, [path])

    def _judge_execute(self, command: str | Sequence[str], args: Sequence[str] | None, cwd: str | None) -> Verdict:
        base = self.worktree
        if cwd:
            resolved = self.resolve(cwd)
            if resolved is None:
                return _refuse("outside_worktree", path=cwd, why="the command's cwd is outside the worktree")
            base = self.worktree / resolved
        try:
            invocation = parse_invocation(command, args)
        except Unparseable as exc:
            return _refuse("unparseable", command=_as_text(command, args), why=str(exc))
        verdict = self._judge("execute", [c.text for c in invocation.commands])
        if not verdict.allowed:
            return verdict
        moves = [c.words[0] for c in invocation.commands if c.words[0] in ("cd", "pushd", "popd")]
        if invocation.redirects and moves:
            why = f"a redirection in a script that changes directory ({moves[0]}) cannot be placed"
            return _refuse("unparseable", command=_as_text(command, args), why=why)
        rule_ids = list(verdict.rule_ids)
        for redirect in invocation.redirects:
            if redirect.target == "/dev/null":
                rule_ids.append("builtin:dev-null")
                continue
            target = str(base / redirect.target)
            sub = self._judge_paths("write" if redirect.writes else "read", [target])
            if not sub.allowed:
                return sub
            rule_ids.extend(sub.rule_ids)
        return Verdict(True, tuple(dict.fromkeys(rule_ids)), {"kind": "allowed"})

    # --- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The path relative to the worktree after resolving symlinks and `..`; None if outside."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"not a path: {path!r}")
        real = os.path.realpath(os.path.join(self._root, path))  # an absolute `path` replaces the root
        if real == self._root:
            return "."
        return real[len(self._root.rstrip("/")) + 1 :] if _inside(real, self._root) else None

    def is_protected(self, relative: str) -> bool:
        """A protected path, inside one, or a directory that holds one (deleting `.` takes `.git`)."""
        if relative == ".":
            return True
        if any(glob_matches(g, relative) or _holds(relative, g) for g in self._protected_globs):
            return True
        real = os.path.join(self._root, relative)
        return any(real == p or _inside(real, p) or _inside(p, real) for p in self._protected_paths)

    def _judge_paths(self, kind: str, paths: Sequence[str]) -> Verdict:
        relative: list[str] = []
        for path in paths:
            rel = self.resolve(path)
            if rel is None:
                resolved = os.path.realpath(os.path.join(self.worktree, path))
                return _refuse("outside_worktree", path=path, resolved=resolved)
            if kind == "write" and self.is_protected(rel):
                return Verdict(False, ("protected",), {"kind": "protected_path", "path": rel})
            relative.append(rel)
        verdict = self._judge(kind, relative)
        return Verdict(verdict.allowed, verdict.rule_ids, verdict.reason, tuple(relative))

    # --- rules ---------------------------------------------------------------------------------

    def _judge(self, kind: str, targets: Sequence[str]) -> Verdict:
        """Every target needs an allow rule and no deny rule (deny wins, order ignored)."""
        if self.interactive:  # only what a person approved in this turn (confinement already checked)
            for target in targets:
                if (kind, target) not in self._approved:
                    return _refuse("not_approved", rule_kind=kind, target=target)
            return Verdict(True, ("interactive",), {"kind": "interactive"})
        rules = [r for r in self.rules if r.kind == kind]
        allowed_by: list[str] = []
        for target in targets:
            for rule in rules:
                if rule.decision == "deny" and _rule_matches(rule, target):
                    return Verdict(False, (rule.id,), {"kind": "denied", "rule_id": rule.id, "target": target})
        for target in targets:
            allow = next((r for r in rules if r.decision == "allow" and _rule_matches(r, target)), None)
            if allow is None:
                return _refuse("unmatched", rule_kind=kind, target=target)
            allowed_by.append(allow.id)
        return Verdict(True, tuple(dict.fromkeys(allowed_by)), {"kind": "allowed"})


def tool_call_paths(tool_call: Mapping[str, Any]) -> list[str]:
    """Every path a tool call names: locations, diff contents, and the usual rawInput keys."""
    paths: list[str] = []
    for location in tool_call.get("locations") or ():
        if isinstance(location, Mapping) and isinstance(location.get("path"), str):
            paths.append(location["path"])
    for item in tool_call.get("content") or ():
        if isinstance(item, Mapping) and item.get("type") == "diff" and isinstance(item.get("path"), str):
            paths.append(item["path"])
    raw = tool_call.get("rawInput")
    if isinstance(raw, Mapping):
        for key in _PATH_KEYS:
            if isinstance(raw.get(key), str):
                paths.append(raw[key])
        if isinstance(raw.get("paths"), list):
            paths.extend(p for p in raw["paths"] if isinstance(p, str))
        if isinstance(raw.get("changes"), Mapping):  # Codex apply_patch: {abs path: change}
            paths.extend(str(p) for p in raw["changes"])
    return list(dict.fromkeys(paths))


def glob_matches(pattern: str, path: str) -> bool:
    """Match a worktree-relative path against a glob: `*` stays in one segment, `**` spans them."""
    return _compile_glob(pattern).fullmatch(path) is not None


@functools.lru_cache(maxsize=1024)
def _compile_glob(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _rule_matches(rule: RuleConfig, target: str) -> bool:
    if rule.kind in ("read", "write"):
        # A deny also covers the directories that hold what it denies: deleting `.` reaches `secrets/`.
        deny = rule.decision == "deny"
        return any(glob_matches(p, target) or (deny and _holds(target, p)) for p in rule.patterns)
    if rule.kind == "network":
        return any(fnmatch.fnmatchcase(target.lower(), p.lower()) for p in rule.patterns)
    return any(fnmatch.fnmatchcase(target, p) for p in rule.patterns)


def _inside(path: str, directory: str) -> bool:
    """`path` lies strictly below `directory` (both absolute and normalised)."""
    return path.startswith(directory.rstrip("/") + "/")


def _holds(directory: str, pattern: str) -> bool:
    """`directory` is an ancestor of everything `pattern` can match (its literal leading part)."""
    literal = re.split(r"[*?\[]", pattern, maxsplit=1)[0].rstrip("/")
    return directory == "." or (bool(literal) and literal.startswith(directory + "/"))


def _safely(judge: Any, *args: Any) -> Verdict:
    """Anything a request makes the policy trip over is a refusal, never an exception."""
    try:
        return judge(*args)
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        return _refuse("unparseable", why=f"the request could not be judged: {type(exc).__name__}: {exc}")


def _refuse(kind: str, **detail: Any) -> Verdict:
    return Verdict(False, (), {"kind": kind, **detail})


def _host_of(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    host = urlsplit(value if "//" in value else f"//{value}").hostname
    return host or None


def _as_text(command: str | Sequence[str], args: Sequence[str] | None) -> str:
    if isinstance(command, str):
        return " ".join([command, *(args or ())])
    return " ".join(str(w) for w in command)
