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

`Policy` is the one entry point, a facade: the judging lives beside it, one job a module (`_verdict`: what
is answered; `_rules`: globs and rules; `_places`: where a path lands; `_scripts`: commands; `_tool_calls`:
permission requests; `_network`: hosts).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config._config import RuleConfig
from ._network import Address, host_address, is_local_address, judge_host
from ._places import DEFAULT_PROTECTED, Places
from ._rules import Rules, glob_matches
from ._scripts import ALWAYS_EXPORTED, SAFE_ENV, SCRIPT_CHARS, SHELL, Scripts
from ._shell import Command
from ._tool_calls import TOOL_KIND_TO_RULE_KIND, approvals_of, host_tool, judge_tool_call, pick, tool_call_paths
from ._verdict import Turn, Verdict, refuse, safely

# Re-exported: the rest of the harness and the tests import these from here.
__all__ = [
    "DEFAULT_PROTECTED",
    "SHELL",
    "TOOL_KIND_TO_RULE_KIND",
    "Address",
    "Policy",
    "Turn",
    "Verdict",
    "glob_matches",
    "host_address",
    "is_local_address",
    "tool_call_paths",
]


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
        exported: Iterable[str] = (),
    ) -> None:
        self.rules = tuple(rules)
        self.worktree = Path(os.path.realpath(worktree))
        self._root = str(self.worktree)
        self._rules = Rules(self.rules)
        # Absolute files or directories outside the globs' reach: the run's config, role, transcripts.
        protected_paths = tuple(os.path.realpath(p) for p in protected_files)
        self._places = Places(self._rules, self._root, (*DEFAULT_PROTECTED, *protected_globs), protected_paths)
        # Commands run inside the OS sandbox, where every path a read deny matches is masked: a command that
        # reads a directory whole (`grep -r x .`) cannot reach them, so only what it names is judged.
        self._scripts = Scripts(self._rules, self._places, masked_reads=masked_reads)
        self._masked_reads = masked_reads
        self.commands_environment(exported)

    def commands_environment(self, names: Iterable[str]) -> None:
        """The names of the environment commands start with (the kernel's, for its terminals): a shell
        variable of one of these set alone (`X=1`, `printf -v X`) reaches every later command, so it must be
        a harmless one; any other name set alone stays in the shell and needs no rule."""
        self._scripts.exported = ALWAYS_EXPORTED | frozenset(names)

    @property
    def interactive(self) -> bool:
        """No rules: permission requests go to the interactive handler, not the policy."""
        return self._rules.interactive

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
        verdict = verdict or host_tool(tool_call, turn.host_tools) or self.judge_tool_call(tool_call)
        if verdict.allowed:
            option = pick(options, ("allow_once",))
            if option is not None:
                return Verdict(True, verdict.rule_ids, verdict.reason, verdict.paths, option)
            verdict = Verdict(False, (), {"kind": "no_allow_once_option", "allowed_by": list(verdict.rule_ids)})
        return Verdict(
            False, verdict.rule_ids, verdict.reason, verdict.paths, pick(options, ("reject_once", "reject_always"))
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
        unsafe = sorted(name for name in env if not SAFE_ENV.match(name))
        if unsafe:
            return refuse("unsafe_env", names=unsafe)
        script = not args and isinstance(command, str) and not SCRIPT_CHARS.isdisjoint(command)
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
            return refuse("not_its_terminal", session=session_id, owner=owner)
        return Verdict(True, (), {"kind": "allowed"})

    def approvals(self, tool_call: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
        """The interactive path: what a person's allow of this tool call lets fs/* and terminal/* reach."""
        return approvals_of(tool_call, self.resolve)

    def search_path(self, value: str) -> str:
        """`PATH` without the directories an agent could plant a program in: relative entries (they follow
        the command's cwd into the worktree), worktree directories a write rule lets it write into, and any
        directory, inside or out, holding a symlink to a path it may write (`npm link` and `ln -s
        ~/proj/bin/tool ~/.local/bin` make such links outside)."""
        return self._places.search_path(value)

    def _gate(self, session_id: str, turn: Turn) -> Verdict | None:
        """Only the session whose turn is running may act: nothing late, nothing stray."""
        if turn.open_session is not None and session_id == turn.open_session:
            return None
        why = "outside_turn" if session_id in turn.sessions else "unknown_session"
        return refuse(why, session=session_id)

    # --- judging, request by request -----------------------------------------------------------

    def judge_host(self, host: str) -> Verdict:
        """A connection the sandbox's proxy is asked for: the network rules on the host alone. An address in
        any form the C resolver takes (`0x7f.1`, `2130706433`, `::ffff:127.0.0.1`) is judged as its canonical
        text (`127.0.0.1`). This machine (`localhost`, a loopback or unspecified address) is allowed only by
        a rule naming that very host, never by a pattern (`*`, `127.*`): `localhost` allows the name (what it
        resolves to), `127.0.0.1` that address in any spelling, `::1` and `0.0.0.0` likewise."""
        return safely(judge_host, self._rules, host)

    def judge_tool_call(self, tool_call: Mapping[str, Any]) -> Verdict:
        """Judge a `session/request_permission` by what its tool call would touch."""
        return safely(judge_tool_call, tool_call, self._rules, self._places, self._judge_execute, self._masked_reads)

    def judge_read(self, path: str, *, approvals: frozenset[tuple[str, str]] = frozenset()) -> Verdict:
        return safely(self._places.judge, "read", [path], approvals)

    def judge_write(self, path: str, *, approvals: frozenset[tuple[str, str]] = frozenset()) -> Verdict:
        return safely(self._places.judge, "write", [path], approvals)

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
        return safely(self._judge_execute, command, args, cwd, approvals)

    def _judge_execute(
        self,
        command: str | Sequence[str],
        args: Sequence[str] | None,
        cwd: str | None,
        approvals: frozenset[tuple[str, str]],
    ) -> Verdict:
        return self._scripts.judge(command, args, cwd, approvals, self._judge_step)

    def _judge_step(self, step: Command, cwds: list[str], approvals: frozenset[tuple[str, str]]) -> Verdict:
        """One simple command run in any of `cwds` (the walk of a script asks it here, of the policy, so a
        subclass can see where each command was judged to run)."""
        return self._scripts.judge_step(step, cwds, approvals)

    # --- paths ---------------------------------------------------------------------------------

    def resolve(self, path: str) -> str | None:
        """The path relative to the worktree after resolving symlinks and `..`; None if outside."""
        return self._places.resolve(path)

    def judge_place(self, kind: str, relative: str) -> Verdict:
        """`relative` (to the worktree, already resolved: no link is followed) judged by place alone: a protected
        path for a write, then the rules (deny wins, no rule refuses). What the change set's judgement asks."""
        return self._places.judge_place(kind, relative)

    def is_protected(self, relative: str) -> bool:
        """A protected path, inside one, or a directory that holds one (deleting `.` takes `.git`)."""
        return self._places.is_protected(relative)
