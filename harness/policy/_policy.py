"""The workspace permission policy: four rule kinds, deny wins, default refuse. One place decides.

Every request the agent makes (a permission request, an `fs/*` call, a `terminal/create`) is
decided here, as a pure function of the request, the rules, and the moment it arrived (`Turn`:
which session's turn was running, the host tools its role allows, what a person approved in it).
The client only applies what a `Verdict` says: the option to select, the file to open, the argv
to run. A request is reduced to targets of one rule kind: worktree paths for read and write,
simple commands for execute (their arguments and redirections judged as the reads and writes they
are), hosts for network. Each target must be matched by an allow rule and by no deny rule,
whatever the rule order.

Paths are resolved (symlinks, `..`) before matching; a path outside the worktree is never a
worktree path, `/proc` is never readable, and a file with more than one hard link is refused
(its other name may be outside, protected or denied). Protected paths are never writable: every
`.git` at any depth (a nested repository's config is code git runs), the configured globs, and
the run's own files; neither is a directory that holds one (deleting `.` takes `.git`). A deny
rule likewise covers the directories above what it denies. A request the policy cannot make sense
of (wrong types, unparseable commands, odd URLs) is refused.

With an empty rule list (the interactive path) a person answers permission requests; `fs/*` and
`terminal/*` then reach only what a person approved in the current turn, still confined to the
worktree.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import ipaddress
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._paths import real_path
from ..config._config import HOST_SERVER_NAME, RuleConfig
from ._commands import PathArg, Refused, analyze, names_path
from ._shell import Command, Unparseable, parse_invocation

__all__ = [
    "DEFAULT_PROTECTED",
    "TOOL_KIND_TO_RULE_KIND",
    "Address",
    "Policy",
    "Turn",
    "Verdict",
    "glob_matches",
    "host_address",
    "is_local_address",
]

#: Written by no agent, whatever the rules say (relative to the worktree): all of `.git`, which
#: covers its config, refs, packed-refs, hooks and modules, and a linked worktree's gitfile.
#: (`.git` at any depth is protected too: see `Policy.is_protected`.)
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
#: Other rawInput keys whose string value is taken for a path of a read or write tool call.
_MORE_PATH_KEYS = re.compile(
    r"(?:^|_)(?:paths?|dir|directory|folder|file|filename|location|to|dest|dst|destination|target|source|src|from)$",
    re.IGNORECASE,
)
#: What any command may read by name: devices that hold no data.
_DATALESS_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
#: Where a redirection may always write or read: the command's own standard streams.
_STANDARD_STREAMS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/0", "/dev/fd/1",
                               "/dev/fd/2"})  # fmt: skip
# The only variables an agent may set for a command: anything else can change what an allowed
# command runs (LD_PRELOAD, PATH, HOME -> a .gitconfig with core.fsmonitor, BASH_FUNC_git%%, ...).
# CLAUDECODE=1 is the marker claude-code-acp sets on every command it runs.
_SAFE_ENV = re.compile(r"^(LANG|LANGUAGE|LC_[A-Z_]+|TERM|NO_COLOR|FORCE_COLOR|CI|COLUMNS|LINES|TZ|CLAUDECODE)$")
#: A `terminal/create` command with no args that holds any of these is a shell script, not a program's name.
_SCRIPT_CHARS = frozenset(" \t\n;&|<>()'\"")
SHELL = shutil.which("bash") or "/bin/sh"
_HOST_TOOL_TITLE = re.compile(rf"mcp__{re.escape(HOST_SERVER_NAME)}__([a-z_]+)")
_HOST = re.compile(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_INET_ATON = re.compile(r"[0-9][0-9a-fx.]*")  # the characters of inet_aton's octal, hex and decimal parts
#: "This network": Linux reaches its own machine at 0.0.0.0, and no host is at the rest of 0/8.
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_MAX_CWDS = 16  # directories a script may `cd` between before it is too tangled to judge
_MAX_CONTENTS = 100_000  # paths beneath a directory read or written whole, before it is too large to judge


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule_ids: tuple[str, ...] = ()
    reason: Mapping[str, Any] = field(default_factory=dict)
    paths: tuple[str, ...] = ()  # the judged paths, resolved, relative to the worktree
    option_id: str | None = None  # a permission request: the option to select (None: answer `cancelled`)
    ask: bool = False  # a permission request on the interactive path: a person decides
    argv: tuple[str, ...] = ()  # a terminal: what to run
    workdir: str | None = None  # a terminal: where (absolute)


@dataclass(frozen=True)
class Turn:
    """What the policy knows of the moment a request arrived, in wire order."""

    open_session: str | None = None  # the session whose turn was running (None: no turn was)
    sessions: AbstractSet[str] = frozenset()  # every session the kernel opened in this run (not copied)
    host_tools: frozenset[str] = frozenset()  # the kernel's own MCP tools the task's role allows
    approvals: frozenset[tuple[str, str]] = frozenset()  # interactive path: (rule kind, target) a person allowed


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
        masked_reads: bool = False,
    ) -> None:
        self.rules = tuple(rules)
        self.worktree = Path(os.path.realpath(worktree))
        self._protected_globs = (*DEFAULT_PROTECTED, *protected_globs)
        # Absolute files or directories outside the globs' reach: the run's config, role, transcripts.
        self._protected_paths = tuple(os.path.realpath(p) for p in protected_files)
        self._root = str(self.worktree)  # string prefixes: this runs for every path an agent names
        # Commands run inside the OS sandbox, where every path a read deny matches is masked: a command that
        # reads a directory whole (`grep -r x .`) cannot reach them, so only what it names is judged.
        self._masked_reads = masked_reads

    @property
    def interactive(self) -> bool:
        """No rules: permission requests go to the interactive handler, not the policy."""
        return not self.rules

    # --- the requests of a run -----------------------------------------------------------------

    def permission(
        self, session_id: str, tool_call: Mapping[str, Any], options: Sequence[tuple[str, str]], turn: Turn
    ) -> Verdict:
        """A `session/request_permission`: the option to answer with (`options`: (optionId, kind) pairs).

        An allowed request is answered with `allow_once`, never `allow_always` (an agent may keep that
        as its own standing rule past the policy); without an `allow_once` option it is refused."""
        verdict = self._gate(session_id, turn)
        if verdict is None and self.interactive:
            return Verdict(False, (), {"kind": "interactive"}, ask=True)
        verdict = verdict or _host_tool(tool_call, turn.host_tools) or self.judge_tool_call(tool_call)
        if verdict.allowed:
            option = _pick(options, ("allow_once",))
            if option is not None:
                return Verdict(True, verdict.rule_ids, verdict.reason, verdict.paths, option)
            verdict = Verdict(False, (), {"kind": "no_allow_once_option", "allowed_by": list(verdict.rule_ids)})
        return Verdict(
            False, verdict.rule_ids, verdict.reason, verdict.paths, _pick(options, ("reject_once", "reject_always"))
        )

    def read(self, session_id: str, path: str, turn: Turn) -> Verdict:
        return self._gate(session_id, turn) or self.judge_read(path, approvals=turn.approvals)

    def write(self, session_id: str, path: str, turn: Turn) -> Verdict:
        return self._gate(session_id, turn) or self.judge_write(path, approvals=turn.approvals)

    def terminal(
        self,
        session_id: str,
        command: str,
        args: Sequence[str] | None,
        env: Mapping[str, str],
        cwd: str | None,
        turn: Turn,
    ) -> Verdict:
        """A `terminal/create`: whether to run it, and the argv and directory to run.

        No args and a command like "git status && git log" is a script for the shell, as editors run
        it (claude-code-acp 0.16 sends its Bash tool's command this way): it is judged as the script
        it is, command by command, exactly as the permission request that preceded it was."""
        gate = self._gate(session_id, turn)
        if gate is not None:
            return gate
        unsafe = sorted(name for name in env if not _SAFE_ENV.match(name))
        if unsafe:
            return _refuse("unsafe_env", names=unsafe)
        script = not args and isinstance(command, str) and not _SCRIPT_CHARS.isdisjoint(command)
        verdict = self.judge_execute(command, None if script else list(args or []), cwd=cwd, approvals=turn.approvals)
        if not verdict.allowed:
            return verdict
        argv = (SHELL, "-c", command) if script else (command, *(args or ()))
        relative = self.resolve(cwd) if cwd else "."
        return replace(verdict, argv=argv, workdir=os.path.normpath(os.path.join(self._root, relative or ".")))

    def terminal_use(self, session_id: str, owner: str | None, turn: Turn) -> Verdict:
        """`terminal/output`, `wait_for_exit`, `kill`, `release`: in the running turn, of its own terminal
        (`owner` None: no such terminal, which the caller answers once the gate has let the call through)."""
        gate = self._gate(session_id, turn)
        if gate is not None:
            return gate
        if owner is not None and owner != session_id:
            return _refuse("not_its_terminal", session=session_id, owner=owner)
        return Verdict(True, (), {"kind": "allowed"})

    def approvals(self, tool_call: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
        """The interactive path: what a person's allow of this tool call lets fs/* and terminal/* reach."""
        kind = TOOL_KIND_TO_RULE_KIND.get(str(tool_call.get("kind")))
        raw: Mapping[str, Any] = tool_call["rawInput"] if isinstance(tool_call.get("rawInput"), Mapping) else {}
        approved: set[tuple[str, str]] = set()
        try:
            if kind in ("read", "write"):
                for path in tool_call_paths(tool_call):
                    rel = self.resolve(path)
                    if rel is not None:
                        approved.add((kind, rel))
            elif kind == "execute" and raw.get("command"):
                command = raw["command"]
                invocation = parse_invocation(command, raw.get("args") if isinstance(command, str) else None)
                approved.update(("execute", analyze(c.words).match_text) for c in invocation.commands if c.words)
        except (Unparseable, Refused, TypeError, ValueError):
            return frozenset()
        return frozenset(approved)

    def search_path(self, value: str) -> str:
        """`PATH` without the directories an agent could plant a program in: relative entries (they follow
        the command's cwd into the worktree), worktree directories a write rule lets it write into, and any
        directory, inside or out, holding a symlink to a path it may write (`npm link` and `ln -s
        ~/proj/bin/tool ~/.local/bin` make such links outside)."""
        kept = []
        for entry in value.split(os.pathsep):
            if not os.path.isabs(entry):
                continue
            rel = self.resolve(entry)
            if rel is not None and (self.judge_write(os.path.join(entry, "planted")).allowed or any(
                _may_name_a_child(rel, p) for r in self.rules if r.kind == "write" and r.decision == "allow"
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
        inside = [link for link in links if _inside(os.path.realpath(link), self._root)]
        return any(self.judge_write(link).allowed for link in inside)

    # --- judging, request by request -----------------------------------------------------------

    def judge_host(self, host: str) -> Verdict:
        """A connection the sandbox's proxy is asked for: the network rules on the host alone. An address in
        any form the C resolver takes (`0x7f.1`, `2130706433`, `::ffff:127.0.0.1`) is judged as its canonical
        text (`127.0.0.1`). This machine (`localhost`, a loopback or unspecified address) is allowed only by
        a rule naming that very host, never by a pattern (`*`, `127.*`): `localhost` allows the name (what it
        resolves to), `127.0.0.1` that address in any spelling, `::1` and `0.0.0.0` likewise."""
        return _safely(self._judge_host, host)

    def judge_tool_call(self, tool_call: Mapping[str, Any]) -> Verdict:
        """Judge a `session/request_permission` by what its tool call would touch."""
        return _safely(self._judge_tool_call, tool_call)

    def judge_read(self, path: str, *, approvals: frozenset[tuple[str, str]] = frozenset()) -> Verdict:
        return _safely(self._judge_paths, "read", [path], approvals)

    def judge_write(self, path: str, *, approvals: frozenset[tuple[str, str]] = frozenset()) -> Verdict:
        return _safely(self._judge_paths, "write", [path], approvals)

    def judge_execute(
        self,
        command: str | Sequence[str],
        args: Sequence[str] | None = None,
        *,
        cwd: str | None = None,
        approvals: frozenset[tuple[str, str]] = frozenset(),
    ) -> Verdict:
        """Judge a command: every simple command in it, the paths its arguments name, and every file
        it redirects to, each relative to every directory the script may have changed to by then."""
        return _safely(self._judge_execute, command, args, cwd, approvals)

    def _judge_host(self, host: str) -> Verdict:
        address = host_address(host)
        host = str(address) if address is not None else host.lower().rstrip(".")
        verdict = self._judge("network", [host], frozenset())
        if not verdict.allowed or not (host == "localhost" or (address is not None and is_local_address(address))):
            return verdict
        named = [r.id for r in self.rules if r.kind == "network" and r.decision == "allow"
                 and any(p.lower() == host for p in r.patterns)]  # fmt: skip
        if named:
            return Verdict(True, (named[0],), {"kind": "allowed"})
        why = f"{host} is this machine: only a rule naming {host} itself allows it, not a pattern"
        return _refuse("unmatched", rule_kind="network", target=host, why=why)

    def _gate(self, session_id: str, turn: Turn) -> Verdict | None:
        """Only the session whose turn is running may act: nothing late, nothing stray."""
        if turn.open_session is not None and session_id == turn.open_session:
            return None
        why = "outside_turn" if session_id in turn.sessions else "unknown_session"
        return _refuse(why, session=session_id)

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
            return self._judge_paths(rule_kind, paths, frozenset())
        if rule_kind == "execute":
            command = raw.get("command") or raw.get("cmd")
            if not command:
                return _refuse("no_target", why="the request names no command", tool_kind=kind)
            cwd = raw.get("cwd") or raw.get("workdir")
            args = raw.get("args") if isinstance(command, str) else None
            return self._judge_execute(command, args, cwd, frozenset())
        hosts = [h for h in (_host_of(raw.get(k)) for k in ("url", "uri", "host")) if h]
        if not hosts:
            return _refuse("no_target", why="the request names no host", tool_kind=kind)
        return self._judge("network", hosts, frozenset())

    def _judge_execute(
        self,
        command: str | Sequence[str],
        args: Sequence[str] | None,
        cwd: str | None,
        approvals: frozenset[tuple[str, str]],
    ) -> Verdict:
        base = "."
        if cwd is not None:
            resolved = self.resolve(cwd)
            if resolved is None:
                return _refuse("outside_worktree", path=cwd, why="the command's cwd is outside the worktree")
            base = resolved
            for rule in self.rules:  # a command runs where it could `ls`: never in a read-denied directory
                if rule.kind == "read" and rule.decision == "deny" and _rule_matches(rule, base, whole=False):
                    return Verdict(False, (rule.id,), {"kind": "denied", "rule_id": rule.id, "target": base})
        try:
            invocation = parse_invocation(command, args)
        except Unparseable as exc:
            return _refuse("unparseable", command=_as_text(command, args), why=str(exc))
        # Where each command may run, per shell (scope): `chain` if every command joined to it by `&&`
        # succeeded, `every` whatever failed (a `cd` that fails leaves the shell where it was).
        shells: dict[tuple[int, ...], tuple[list[str], list[str]]] = {(0,): ([base], [base])}
        rule_ids: list[str] = []
        steps = invocation.commands
        for index, step in enumerate(steps):
            if step.scope not in shells:  # a subshell or nested shell starts where its parent is now
                parent = step.scope[:-1]
                while parent not in shells and len(parent) > 1:  # `( (cat x) )`: the nearest shell that ran
                    parent = parent[:-1]
                parent = parent if parent in shells else (0,)
                chain, every = shells[parent]
                if step.after != "&&":  # the shell is the parent's next command, whatever came before it
                    shells[parent] = (every, every)
                start = chain if step.after == "&&" else every
                shells[step.scope] = (start, start)
            chain, every = shells[step.scope]
            here = chain if step.after == "&&" else every
            verdict = self._judge_step(step, here, approvals)
            if not verdict.allowed:
                return verdict
            rule_ids += verdict.rule_ids
            moved = list(verdict.paths)  # where a `cd` leads (empty for any other command)
            every = list(dict.fromkeys([*every, *moved]))
            if len(every) > _MAX_CWDS:
                return _refuse("unparseable", command=_as_text(command, args), why="too many directory changes")
            # The next command joined by `&&` runs where this one left the shell, when that is certain: a
            # `cd` that ran in the shell itself, not in a pipeline or in the background, and not after `||`
            # (then the command before it may have succeeded and the `cd` never ran); `popd` may go anywhere
            # the script has been.
            following = _operator_after(steps, index)
            in_shell = step.after not in ("|", "|&", "||") and following not in ("|", "|&", "&")
            if moved and in_shell:
                chain = moved
            elif moved or step.after == "||" or (step.words and os.path.basename(step.words[0]) == "popd"):
                chain = every
            else:
                chain = here
            shells[step.scope] = (chain, every)
        return Verdict(True, tuple(dict.fromkeys(rule_ids)), {"kind": "allowed"})

    def _judge_step(self, step: Command, cwds: list[str], approvals: frozenset[tuple[str, str]]) -> Verdict:
        """One simple command run in any of `cwds`: the program, the paths it names, its redirections.
        For a `cd`, the verdict's `paths` are the directories it may lead to."""
        rule_ids: list[str] = []
        moved: list[str] = []
        if step.words:
            try:
                facts = analyze(step.words)
            except Refused as exc:
                return _refuse("unsafe_argument", command=step.text, why=str(exc))
            if facts.match_text:
                verdict = self._judge("execute", [facts.match_text], approvals, also_denied=facts.aliases)
                if not verdict.allowed:
                    return verdict
                rule_ids += verdict.rule_ids
            else:  # only assignments (`LANG=C`): no program runs; the names are judged below
                rule_ids.append("builtin:assignment")
            unsafe = sorted({name for name in facts.environment if not _SAFE_ENV.match(name)})
            if unsafe:  # `PATH=docs`, `LD_PRELOAD=x.so ls`, `TAPE=host:f tar -t`: the program is not what ran
                return _refuse("unsafe_env", names=unsafe, command=step.text,
                               why="a variable that can change what a program runs, loads or opens")  # fmt: skip
            places = cwds if facts.directory is None else self._places(cwds, facts.directory)
            if places is None:
                return _refuse("outside_worktree", path=facts.directory, why="git -C names a place outside")
            for place in places:
                nested = self._nested_repository(place)
                if nested is not None:
                    why = "a nested repository: its config and hooks are programs git would run"
                    return _refuse("nested_repository", path=nested, command=step.text, why=why)
            for arg in facts.paths:
                for place in places:
                    verdict = self._judge_path_argument(arg, os.path.join(place, arg.text), approvals)
                    if not verdict.allowed:
                        return replace(verdict, reason={**verdict.reason, "command": step.text})
                    rule_ids += verdict.rule_ids
            if facts.changes_directory is not None:
                leads = self._places(cwds, facts.changes_directory, logical=True)
                if leads is None:
                    return _refuse("outside_worktree", path=facts.changes_directory, why="cd leaves the worktree")
                moved = leads
        for redirect in step.redirects:
            kinds = ("read", "write") if redirect.op == "<>" else ("write",) if redirect.writes else ("read",)
            for place in cwds:
                for kind in kinds:  # `<>` opens the file both ways
                    path = os.path.join(place, redirect.target)
                    verdict = self._judge_argument(kind, path, approvals, redirect=True)
                    if not verdict.allowed:
                        return verdict
                    rule_ids += verdict.rule_ids
        return Verdict(True, tuple(rule_ids), {"kind": "allowed"}, tuple(moved))

    def _judge_path_argument(self, arg: PathArg, path: str, approvals: frozenset[tuple[str, str]]) -> Verdict:
        if not names_path(arg, os.path.lexists(os.path.join(self._root, path))):
            return Verdict(True)
        kind = "write" if arg.write else "read"
        verdict = self._judge_argument(kind, path, approvals, recursive=arg.recursive, follows=arg.follows_links,
                                       masked=self._masked_reads and not arg.stored)  # fmt: skip
        if verdict.allowed and arg.may_write and kind == "read":
            # a program not known to only read it could write it (`--outp=.git/config`)
            rel = self.resolve(path)
            if rel is not None and self.is_protected(rel):
                return Verdict(False, ("protected",), {"kind": "protected_path", "path": rel})
        return verdict

    def _judge_argument(
        self,
        kind: str,
        path: str,
        approvals: frozenset[tuple[str, str]],
        *,
        recursive: bool = False,
        redirect: bool = False,
        follows: bool = False,
        masked: bool = False,
    ) -> Verdict:
        """A path a command's argument or redirection names. On the interactive path the person approved
        the command as written, so its paths need only stay confined. A redirection may always reach the
        command's own standard streams; an argument may only read the devices that hold no data."""
        if (redirect and path in _STANDARD_STREAMS) or (kind == "read" and path in _DATALESS_DEVICES):
            return Verdict(True, ("builtin:dev-null",), {"kind": "allowed"})
        return self._judge_paths(kind, [path], approvals, confine_only=self.interactive, recursive=recursive,
                                 follows=follows, masked=masked)  # fmt: skip

    def _places(self, cwds: Sequence[str], directory: str, *, logical: bool = False) -> list[str] | None:
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
                if os.path.isabs(directory) and _inside(text, self._root):
                    text = text[len(self._root.rstrip("/")) + 1 :]
                if text == ".." or text.startswith("../") or os.path.isabs(text) or self.resolve(text) is None:
                    return None
                places.append(text)
        return list(dict.fromkeys(places))

    # --- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The path relative to the worktree after resolving symlinks and `..`; None if outside."""
        return self._resolve(path)[1]

    def _resolve(self, path: str) -> tuple[str, str | None]:
        """Where `path` really is (absolute), and that relative to the worktree (None if outside)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"not a path: {path!r}")
        real = real_path(os.path.join(self._root, path))  # an absolute `path` replaces the root
        if real == self._root:
            return real, "."
        return real, real[len(self._root.rstrip("/")) + 1 :] if _inside(real, self._root) else None

    def judge_place(self, kind: str, relative: str) -> Verdict:
        """`relative` (to the worktree, already resolved: no link is followed) judged by place alone: a protected
        path for a write, then the rules (deny wins, no rule refuses). What the change set's judgement asks."""
        if kind == "write" and self.is_protected(relative):
            return Verdict(False, ("protected",), {"kind": "protected_path", "path": relative})
        return self._judge(kind, [relative], frozenset())

    def is_protected(self, relative: str) -> bool:
        """A protected path, inside one, or a directory that holds one (deleting `.` takes `.git`)."""
        if relative == "." or ".git" in relative.lower().split("/"):  # every .git, nested ones too
            return True
        if any(glob_matches(g, relative) or _holds(relative, g) for g in self._protected_globs):
            return True
        real = os.path.join(self._root, relative)
        return any(real == p or _inside(real, p) or _inside(p, real) for p in self._protected_paths)

    def _nested_repository(self, place: str) -> str | None:
        """The nearest directory from `place` up to (not including) the worktree root that git would
        take for a repository of its own: one holding `.git`, or one that looks like a bare repository."""
        relative = self.resolve(place) or "."
        parts = [] if relative == "." else relative.split("/")
        while parts:
            here = os.path.join(self._root, *parts)
            if os.path.lexists(os.path.join(here, ".git")) or _looks_like_git_dir(here):
                return "/".join(parts)
            parts.pop()
        return None

    def _judge_paths(
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
        relative: list[str] = []
        for path in paths:
            real, rel = self._resolve(path)
            if real == "/proc" or real.startswith("/proc/"):  # the kernel's environment, memory and fds
                return _refuse("proc", path=path, resolved=real)
            if rel is None:
                return _refuse("outside_worktree", path=path, resolved=real)
            if kind == "write" and self.is_protected(rel):
                return Verdict(False, ("protected",), {"kind": "protected_path", "path": rel})
            if _hard_linked(real):
                why = "a file with another name may be outside the worktree, protected or denied"
                return _refuse("hard_link", path=rel, why=why)
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
        verdict = self._judge(kind, relative, approvals, whole=whole and not masked, also_denied=beneath)
        return Verdict(verdict.allowed, verdict.rule_ids, verdict.reason, tuple(relative))  # not replace(): 30 us

    def _contents(self, kind: str, relative: str) -> tuple[Verdict | None, list[str]]:
        """A directory written or read whole is reached with everything beneath it: a protected path there
        refuses a write (deleting `src` takes `src/sub/.git`), and deny rules see each path there (with
        `**/secrets/**` denied, deleting `src` takes `src/secrets/`). Symlinks beneath are not followed:
        deleting or moving one never reaches its target. `.` is already covered: it holds everything."""
        real = os.path.join(self._root, relative)
        if relative == "." or not os.path.isdir(real) or os.path.islink(real):
            return None, []
        denies = [p for r in self.rules if r.kind == kind and r.decision == "deny" for p in r.patterns]
        if kind == "read" and not any(_may_hold(relative, p) for p in denies):
            return None, []
        found: list[str] = []
        for top, dirs, files in os.walk(real):
            for name in (*dirs, *files):
                entry = f"{top}/{name}"[len(self._root.rstrip("/")) + 1 :]
                if kind == "write" and self.is_protected(entry):
                    return Verdict(False, ("protected",), {"kind": "protected_path", "path": entry, "in": relative}), []
                if name in files and _hard_linked(f"{top}/{name}"):  # `cp -r x/. docs` writes through it too
                    why = "a file beneath has another name that may be outside the worktree, protected or denied"
                    return _refuse("hard_link", path=entry, why=why), []
                found.append(entry)
            if len(found) > _MAX_CONTENTS:
                return _refuse("too_many_files", path=relative, why=f"more than {_MAX_CONTENTS} paths to judge"), []
        return None, found

    def _linked_contents(self, relative: str) -> tuple[Verdict | None, list[str]]:
        """A directory read whole by a reader that follows symlinks (`grep -R`, `rg -L`, `zip -r`, `find -L`):
        every path beneath, as it is reached and where it really is. A link that leads outside refuses."""
        real = os.path.join(self._root, relative)
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
                if name in files and _hard_linked(entry):
                    why = "a file beneath has another name that may be outside the worktree, protected or denied"
                    return _refuse("hard_link", path=entry[len(self._root.rstrip("/")) + 1 :], why=why), []
                if not os.path.islink(entry) and top == os.path.realpath(top):
                    found.append(entry[len(self._root.rstrip("/")) + 1 :])
                    continue
                target = self.resolve(entry)
                if target is None:
                    why = "a symlink beneath leads outside the worktree and the reader follows it"
                    return _refuse("outside_worktree", path=entry, resolved=os.path.realpath(entry), why=why), []
                found += [entry[len(self._root.rstrip("/")) + 1 :], target]
            if len(found) > _MAX_CONTENTS:  # a cycle of links ends here too
                return _refuse("too_many_files", path=relative, why=f"more than {_MAX_CONTENTS} paths to judge"), []
        return None, found

    # --- rules ---------------------------------------------------------------------------------

    def _judge(
        self,
        kind: str,
        targets: Sequence[str],
        approvals: frozenset[tuple[str, str]],
        *,
        whole: bool = True,
        also_denied: Sequence[str] = (),
    ) -> Verdict:
        """Every target needs an allow rule and no deny rule (deny wins, order ignored). A `whole` target
        is reached with all it holds, so a deny of anything below it applies too; `also_denied` are other
        spellings of the targets that deny rules see too."""
        if self.interactive:  # only what a person approved in this turn (confinement already checked)
            for target in targets:
                if (kind, target) not in approvals:
                    return _refuse("not_approved", rule_kind=kind, target=target)
            return Verdict(True, ("interactive",), {"kind": "interactive"})
        rules = [r for r in self.rules if r.kind == kind]
        allowed_by: list[str] = []
        for target in (*targets, *also_denied):
            for rule in rules:
                if rule.decision == "deny" and _rule_matches(rule, target, whole=whole):
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
            for path, change in raw["changes"].items():
                paths.append(str(path))
                paths.extend(_nested_values(change, "move_path"))  # a patch may move the file elsewhere
        for key, value in raw.items():  # `to`, `dest_dir`, `new_path`...: judging one more path is safe
            if key not in _PATH_KEYS and _MORE_PATH_KEYS.search(str(key)) and isinstance(value, str):
                paths.append(value)
    return list(dict.fromkeys(paths))


def _operator_after(steps: Sequence[Command], index: int) -> str:
    """The operator that joins steps[index] to what follows it in its own shell ("" if nothing does)."""
    if index + 1 >= len(steps):
        return ""
    following = steps[index + 1]
    scope = steps[index].scope
    return following.after if following.scope[: len(scope)] == scope else ""


def _nested_values(value: Any, key: str, depth: int = 3) -> list[str]:
    if depth == 0 or not isinstance(value, Mapping):
        return []
    found = [value[key]] if isinstance(value.get(key), str) else []
    for inner in value.values():
        found += _nested_values(inner, key, depth - 1)
    return found


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


def _rule_matches(rule: RuleConfig, target: str, *, whole: bool = True) -> bool:
    if rule.kind in ("read", "write"):
        # A deny also covers the directories that hold what it denies: deleting `.` reaches `secrets/`.
        above = whole and rule.decision == "deny"
        return any(glob_matches(p, target) or (above and _holds(target, p)) for p in rule.patterns)
    if rule.kind == "network":
        return any(fnmatch.fnmatchcase(target.lower(), p.lower()) for p in rule.patterns)
    return any(fnmatch.fnmatchcase(target, p) for p in rule.patterns)


def _inside(path: str, directory: str) -> bool:
    """`path` lies strictly below `directory` (both absolute and normalised)."""
    return path.startswith(directory.rstrip("/") + "/")


def _holds(directory: str, pattern: str) -> bool:
    """`directory` is an ancestor of everything `pattern` can match (its literal leading part)."""
    # `src/pkg/*.py` holds `src/pkg` itself; `[` is no glob character here (`app/[id]/x.ts` holds `app/[id]`)
    literal = re.split(r"[*?]", pattern, maxsplit=1)[0]
    return directory == "." or (bool(literal) and literal.startswith(directory + "/"))


def _may_hold(directory: str, pattern: str) -> bool:
    """Whether `pattern` may match something below `directory`, judged by its literal leading segments: False
    only when they name a different place (`docs/**` never matches below `src`)."""
    for want, have in zip(pattern.split("/"), directory.split("/"), strict=False):
        if any(ch in want for ch in "*?["):
            return True
        if want != have:
            return False
    return True


def _may_name_a_child(directory: str, pattern: str) -> bool:
    """Whether `pattern` can match a name directly inside `directory` (`src/git`, `src/*` and `**` can for
    `src`; `docs/*` cannot)."""
    want = pattern.split("/")
    have = [] if directory == "." else directory.split("/")
    for index, segment in enumerate(have):
        if index >= len(want):
            return False
        if "**" in want[index]:
            return True
        if not glob_matches(want[index], segment):
            return False
    rest = want[len(have) :]
    return len(rest) == 1 or any("**" in w for w in rest)


def _hard_linked(real: str) -> bool:
    try:
        st = os.lstat(real)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1


def _looks_like_git_dir(directory: str) -> bool:
    """What git's discovery takes for a bare repository: HEAD beside objects/ and refs/."""
    return all(os.path.lexists(os.path.join(directory, name)) for name in ("HEAD", "objects", "refs"))


def _host_tool(tool_call: Mapping[str, Any], host_tools: frozenset[str]) -> Verdict | None:
    """A request to call one of the kernel's own host tools (Claude titles an MCP tool
    `mcp__<server>__<tool>`, kind `other`): the role's allowlist already decided it."""
    match = _HOST_TOOL_TITLE.fullmatch(str(tool_call.get("title") or ""))
    if match is None or tool_call.get("kind") not in (None, "other") or match[1] not in host_tools:
        return None
    return Verdict(True, ("builtin:host-tool",), {"kind": "host_tool", "tool": match[1]})


def _pick(options: Sequence[tuple[str, str]], kinds: tuple[str, ...]) -> str | None:
    for kind in kinds:
        for option_id, option_kind in options:
            if option_kind == kind:
                return option_id
    return None


def _safely(judge: Callable[..., Verdict], *args: Any) -> Verdict:
    """Anything a request makes the policy trip over is a refusal, never an exception (an `IndexError` from
    an odd argv is the agent's doing; one that escaped would end the run as the kernel's crash)."""
    try:
        return judge(*args)
    except Exception as exc:  # every failure to judge is a refusal
        return _refuse("unparseable", why=f"the request could not be judged: {type(exc).__name__}: {exc}")


def _refuse(kind: str, **detail: Any) -> Verdict:
    return Verdict(False, (), {"kind": kind, **detail})


def host_address(host: str) -> Address | None:
    """The address a host names, in any form the C resolver takes it in (None: a name). Legacy IPv4 forms
    (`0177.0.0.1`, `0x7f.1`, `127.1`, `2130706433`) as inet_aton reads them; an IPv6 address that embeds an
    IPv4 one (`::ffff:127.0.0.1`, `::ffff:7f00:1`, the old `::127.0.0.1`) as that IPv4 address."""
    text = host.lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        address: Address = ipaddress.ip_address(text)
    except ValueError:
        if not _INET_ATON.fullmatch(text):  # inet_aton would also take `127.1 junk`; a name spares the call
            return None
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if int(address) >> 32 == 0 and int(address) > 1:  # IPv4-compatible; `::` and `::1` are IPv6's own
            return ipaddress.IPv4Address(int(address))
    return address


def is_local_address(address: Address) -> bool:
    """An address that leads back to this machine or its link: loopback, unspecified (`0.0.0.0`, `::`), 0/8,
    link-local (169.254/16 with the cloud metadata service, fe80::/10), or any address of one of this
    machine's own interfaces (its eth0, a docker bridge: a service listening on 0.0.0.0 answers there)."""
    if address.is_loopback or address.is_unspecified or address.is_link_local or address in _THIS_NETWORK:
        return True
    return address in _interface_addresses()


_INTERFACES_TTL = 5.0  # seconds an interface listing is reused: addresses change rarely, a lookup costs ~100 us
_interfaces: tuple[float, frozenset[Address]] = (-_INTERFACES_TTL, frozenset())


def _interface_addresses() -> frozenset[Address]:
    global _interfaces
    taken, addresses = _interfaces
    if time.monotonic() - taken < _INTERFACES_TTL:
        return addresses
    import psutil

    found: set[Address] = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.ip_address(entry.address.split("%", 1)[0]))
    _interfaces = (time.monotonic(), frozenset(found))
    return _interfaces[1]


def _host_of(value: Any) -> str | None:
    """The host a URL reaches, read as a WHATWG parser (Node, browsers) would read it, or refused.

    Where WHATWG and Python's urlsplit disagree (`https://evil.example\\@api.github.com/` reaches
    evil.example in Node), the URL is refused: backslashes, whitespace and control characters,
    user info, percent-encoded or non-ASCII hosts."""
    if not isinstance(value, str) or not value:
        return None
    if "\\" in value or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"a URL with a backslash, space or control character: {value!r}")
    scheme = _SCHEME.match(value)
    if scheme and not value[scheme.end() :].startswith("//") and "." not in scheme.group():
        if not value[scheme.end() :].isdigit():  # `https:host` (WHATWG reads it as https://host): refuse
            raise ValueError(f"a URL without // after its scheme: {value!r}")
        scheme = None  # `localhost:8080`
    split = urlsplit(value if scheme and value[scheme.end() :].startswith("//") else f"//{value}")
    if "@" in split.netloc:
        raise ValueError(f"a URL with user info: {value!r}")
    host = split.hostname
    if not host or not _HOST.fullmatch(host):
        raise ValueError(f"a URL whose host cannot be judged: {value!r}")
    return host


def _as_text(command: str | Sequence[str], args: Sequence[str] | None) -> str:
    if isinstance(command, str):
        return " ".join([command, *(args or ())])
    return " ".join(str(w) for w in command)
