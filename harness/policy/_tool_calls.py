"""Reading an ACP tool call: the rule kind that governs it, the paths, command or hosts it names, and its verdict.

A permission request is judged by what its tool call would touch, reduced to targets of one rule kind; a call
of one of the kernel's own host tools was already decided by the role's allowlist.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config._config import HOST_SERVER_NAME
from ._network import host_of
from ._places import Places
from ._rules import Rules
from ._shell import Unparseable, parse_invocation
from ._verdict import Verdict, refuse
from .commands import Refused, analyze

__all__ = ["TOOL_KIND_TO_RULE_KIND", "ExecuteJudge", "approvals_of", "host_tool", "judge_tool_call", "pick",
           "tool_call_paths"]  # fmt: skip

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
#: Other rawInput keys whose string value is taken for a path of a read or write tool call.
_MORE_PATH_KEYS = re.compile(
    r"(?:^|_)(?:paths?|dir|directory|folder|file|filename|location|to|dest|dst|destination|target|source|src|from)$",
    re.IGNORECASE,
)
_HOST_TOOL_TITLE = re.compile(rf"mcp__{re.escape(HOST_SERVER_NAME)}__([a-z_]+)")

#: Judges a command (command, args, cwd, approvals): `Policy._judge_execute`.
ExecuteJudge = Callable[[str | Sequence[str], Sequence[str] | None, str | None, frozenset[tuple[str, str]]], Verdict]


def judge_tool_call(
    tool_call: Mapping[str, Any], rules: Rules, places: Places, judge_execute: ExecuteJudge, masked_search: bool
) -> Verdict:
    """`Policy.judge_tool_call`: paths judged by `places`, a command by `judge_execute`, hosts by `rules`.
    `masked_search`: the agent searches inside the OS sandbox, where what a read deny matches is masked and a
    hard-linked file is hidden: a search there reaches only what it may read, so only the places it names
    are judged (the files it finds, the kernel reads through `fs/*` only as the rules allow, one by one)."""
    kind = tool_call.get("kind")
    if kind == "think":
        return Verdict(True, ("builtin:think",), {"kind": "no_permission_needed"})
    rule_kind = TOOL_KIND_TO_RULE_KIND.get(str(kind))
    if rule_kind is None:
        return refuse("unmatched", why="no rule kind governs this tool kind", tool_kind=kind)
    raw = tool_call.get("rawInput")
    raw = raw if isinstance(raw, Mapping) else {}
    if rule_kind in ("read", "write"):
        paths = tool_call_paths(tool_call)
        if not paths and kind == "search" and not any(_LOCATION_WORDS.search(str(k)) for k in raw):
            paths = ["."]  # Grep/Glob with no path search the session cwd: the worktree
        if not paths:
            return refuse("no_target", why="the request names no path", tool_kind=kind)
        return places.judge(rule_kind, paths, frozenset(), masked=masked_search and kind == "search")
    if rule_kind == "execute":
        command = raw.get("command") or raw.get("cmd")
        if not command:
            return refuse("no_target", why="the request names no command", tool_kind=kind)
        cwd = raw.get("cwd") or raw.get("workdir")
        args = raw.get("args") if isinstance(command, str) else None
        return judge_execute(command, args, cwd, frozenset())
    hosts = [h for h in (host_of(raw.get(k)) for k in ("url", "uri", "host")) if h]
    if not hosts:
        return refuse("no_target", why="the request names no host", tool_kind=kind)
    return rules.judge("network", hosts, frozenset())


def approvals_of(tool_call: Mapping[str, Any], resolve: Callable[[str], str | None]) -> frozenset[tuple[str, str]]:
    """`Policy.approvals`: what a person's allow of this tool call lets fs/* and terminal/* reach (paths by
    `resolve`d place, commands by the text execute rules match)."""
    kind = TOOL_KIND_TO_RULE_KIND.get(str(tool_call.get("kind")))
    raw: Mapping[str, Any] = tool_call["rawInput"] if isinstance(tool_call.get("rawInput"), Mapping) else {}
    approved: set[tuple[str, str]] = set()
    try:
        if kind in ("read", "write"):
            for path in tool_call_paths(tool_call):
                rel = resolve(path)
                if rel is not None:
                    approved.add((kind, rel))
        elif kind == "execute" and raw.get("command"):
            command = raw["command"]
            invocation = parse_invocation(command, raw.get("args") if isinstance(command, str) else None)
            approved.update(("execute", analyze(c.words).match_text) for c in invocation.commands if c.words)
    except (Unparseable, Refused, TypeError, ValueError):
        return frozenset()
    return frozenset(approved)


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
            for path, change in raw["changes"].items():
                paths.append(str(path))
                paths.extend(_nested_values(change, "move_path"))  # a patch may move the file elsewhere
        for key, value in raw.items():  # `to`, `dest_dir`, `new_path`...: judging one more path is safe
            if key not in _PATH_KEYS and _MORE_PATH_KEYS.search(str(key)) and isinstance(value, str):
                paths.append(value)
    return list(dict.fromkeys(paths))


def _nested_values(value: Any, key: str, depth: int = 3) -> list[str]:
    if depth == 0 or not isinstance(value, Mapping):
        return []
    found = [value[key]] if isinstance(value.get(key), str) else []
    for inner in value.values():
        found += _nested_values(inner, key, depth - 1)
    return found


def host_tool(tool_call: Mapping[str, Any], host_tools: frozenset[str]) -> Verdict | None:
    """A request to call one of the kernel's own host tools (Claude titles an MCP tool
    `mcp__<server>__<tool>`, kind `other`): the role's allowlist already decided it."""
    match = _HOST_TOOL_TITLE.fullmatch(str(tool_call.get("title") or ""))
    if match is None or tool_call.get("kind") not in (None, "other") or match[1] not in host_tools:
        return None
    return Verdict(True, ("builtin:host-tool",), {"kind": "host_tool", "tool": match[1]})


def pick(options: Sequence[tuple[str, str]], kinds: tuple[str, ...]) -> str | None:
    """The first option (optionId) of the first of `kinds` offered, or None."""
    for kind in kinds:
        for option_id, option_kind in options:
            if option_kind == kind:
                return option_id
    return None
