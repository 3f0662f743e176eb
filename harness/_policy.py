"""The workspace permission policy: four rule kinds, deny wins, default refuse.

Every request the agent makes (a permission request, an `fs/*` call, a
`terminal/create`) is reduced to targets of one rule kind: worktree paths for
read and write, simple commands for execute, hosts for network. Each target
must be matched by an allow rule and by no deny rule, whatever the rule order.
Paths are resolved (symlinks, `..`) before matching, and a path outside the
worktree is never a worktree path. Protected paths are never writable.

A `Verdict` names the rule ids that decided it; the kernel records them.
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

#: Written by no agent, whatever the rules say (relative to the worktree).
DEFAULT_PROTECTED = (".git/config", ".git/refs/**", ".git/hooks/**")

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

_PATH_KEYS = ("file_path", "path", "notebook_path", "source", "destination", "target", "old_path", "new_path")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule_ids: tuple[str, ...] = ()
    reason: Mapping[str, Any] = field(default_factory=dict)


class Policy:
    """Judges requests against the rules of one worktree.

    Parameters:
        rules: the workspace rules; an empty list means the interactive path.
        worktree: the git worktree the agent works in.
        protected_globs: extra protected paths, relative to the worktree.
        protected_files: absolute files the agent may never write (the run's config, role file).
        git_dir: the repository's git dir, when it is not `<worktree>/.git`.
    """

    def __init__(
        self,
        rules: Sequence[RuleConfig],
        worktree: Path,
        *,
        protected_globs: Iterable[str] = (),
        protected_files: Iterable[Path] = (),
        git_dir: Path | None = None,
    ) -> None:
        self.rules = tuple(rules)
        self.worktree = Path(os.path.realpath(worktree))
        self._protected_globs = (*DEFAULT_PROTECTED, *protected_globs)
        protected = {Path(os.path.realpath(p)) for p in protected_files}
        self._protected_files = frozenset(protected)
        real_git_dir = Path(os.path.realpath(git_dir)) if git_dir else None
        self._protected_git_dir = real_git_dir if real_git_dir != self.worktree / ".git" else None

    @property
    def interactive(self) -> bool:
        """No rules: permission requests go to the interactive handler, not the policy."""
        return not self.rules

    # --- requests ------------------------------------------------------------------------------

    def judge_tool_call(self, tool_call: Mapping[str, Any]) -> Verdict:
        """Judge a `session/request_permission` by what its tool call would touch."""
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

    def judge_read(self, path: str) -> Verdict:
        return self._judge_paths("read", [path])

    def judge_write(self, path: str) -> Verdict:
        return self._judge_paths("write", [path])

    def judge_execute(
        self, command: str | Sequence[str], args: Sequence[str] | None = None, *, cwd: str | None = None
    ) -> Verdict:
        """Judge a command: every simple command in it, and every file it redirects to."""
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
        absolute = path if os.path.isabs(path) else os.path.join(self.worktree, path)
        real = Path(os.path.realpath(absolute))
        if real == self.worktree:
            return "."
        try:
            return real.relative_to(self.worktree).as_posix()
        except ValueError:
            return None

    def is_protected(self, relative: str) -> bool:
        real = self.worktree / relative
        if real in self._protected_files:
            return True
        if self._protected_git_dir is not None:
            try:
                inner = real.relative_to(self._protected_git_dir).as_posix()
            except ValueError:
                pass
            else:
                return any(glob_matches(g.removeprefix(".git/"), inner) for g in DEFAULT_PROTECTED)
        return any(glob_matches(g, relative) for g in self._protected_globs)

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
        return self._judge(kind, relative)

    # --- rules ---------------------------------------------------------------------------------

    def _judge(self, kind: str, targets: Sequence[str]) -> Verdict:
        """Every target needs an allow rule and no deny rule (deny wins, order ignored)."""
        if self.interactive:  # a person decided the permission; confinement checks already ran
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
        return any(glob_matches(p, target) for p in rule.patterns)
    if rule.kind == "network":
        return any(fnmatch.fnmatchcase(target.lower(), p.lower()) for p in rule.patterns)
    return any(fnmatch.fnmatchcase(target, p) for p in rule.patterns)


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
