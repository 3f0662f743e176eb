"""Judging a command: every simple command of a script, where it may run, the paths it names, its redirections.

A script is walked command by command, tracking every directory each shell may have `cd`'d to by then; each
simple command is judged by the execute rules (its program), and its arguments and redirections as the
reads and writes they are.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace

from ._places import Places
from ._rules import Rules, rule_matches
from ._shell import Command, Unparseable, parse_invocation
from ._verdict import Verdict, refuse
from .commands import PathArg, Refused, analyze, names_path
from .commands._variables import is_special

__all__ = ["SAFE_ENV", "SCRIPT_CHARS", "SHELL", "Scripts", "StepJudge"]

#: What any command may read by name: devices that hold no data.
_DATALESS_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
#: Where a redirection may always write or read: the command's own standard streams.
_STANDARD_STREAMS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/0", "/dev/fd/1",
                               "/dev/fd/2"})  # fmt: skip
# The only variables an agent may set for a command: anything else can change what an allowed
# command runs (LD_PRELOAD, PATH, HOME -> a .gitconfig with core.fsmonitor, BASH_FUNC_git%%, ...).
# CLAUDECODE=1 is the marker claude-code-acp sets on every command it runs.
SAFE_ENV = re.compile(r"^(LANG|LANGUAGE|LC_[A-Z_]+|TERM|NO_COLOR|FORCE_COLOR|CI|COLUMNS|LINES|TZ|CLAUDECODE)$")
#: What bash and the sandbox put in every command's environment besides what the kernel gives it (a test runs
#: `env` in a real sandboxed terminal and checks each name it prints is here or in what the kernel passes).
ALWAYS_EXPORTED = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "HOME", "TMPDIR", "PATH", "LOOP_HARNESS_MODEL_CACHE",
                             "CLAUDE_CODE_TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                             "https_proxy", "all_proxy", "NO_PROXY", "no_proxy"})  # fmt: skip
#: A `terminal/create` command with no args that holds any of these is a shell script, not a program's name.
SCRIPT_CHARS = frozenset(" \t\n;&|<>()'\"")
SHELL = shutil.which("bash") or "/bin/sh"
_MAX_CWDS = 16  # directories a script may `cd` between before it is too tangled to judge

#: Judges one simple command run in any of the directories given (`Scripts.judge_step`, or what stands in for it).
StepJudge = Callable[[Command, list[str], frozenset[tuple[str, str]]], Verdict]


class Scripts:
    """The execute judge of one policy: its rules, its worktree's places, and whether reads are masked.

    `masked_reads`: commands run inside the OS sandbox, where every path a read deny matches is masked: a
    command that reads a directory whole (`grep -r x .`) cannot reach them, so only what it names is judged.
    """

    def __init__(self, rules: Rules, places: Places, *, masked_reads: bool = False) -> None:
        self._rules = rules
        self._places = places
        self._masked_reads = masked_reads
        #: Names in the environment commands start with: setting one in the shell changes what later ones get.
        self.exported = ALWAYS_EXPORTED

    def judge(
        self,
        command: str | Sequence[str],
        args: Sequence[str] | None,
        cwd: str | None,
        approvals: frozenset[tuple[str, str]],
        judge_step: StepJudge,
    ) -> Verdict:
        """`Policy.judge_execute`, each simple command judged by `judge_step` in every directory it may run in."""
        base = "."
        if cwd is not None:
            resolved = self._places.resolve(cwd)
            if resolved is None:
                return refuse("outside_worktree", path=cwd, why="the command's cwd is outside the worktree")
            base = resolved
            for rule in self._rules:  # a command runs where it could `ls`: never in a read-denied directory
                if rule.kind == "read" and rule.decision == "deny" and rule_matches(rule, base, whole=False):
                    return Verdict(False, (rule.id,), {"kind": "denied", "rule_id": rule.id, "target": base})
        try:
            invocation = parse_invocation(command, args)
        except Unparseable as exc:
            return refuse("unparseable", command=_as_text(command, args), why=str(exc))
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
            verdict = judge_step(step, here, approvals)
            if not verdict.allowed:
                return verdict
            rule_ids += verdict.rule_ids
            moved = list(verdict.paths)  # where a `cd` leads (empty for any other command)
            every = list(dict.fromkeys([*every, *moved]))
            if len(every) > _MAX_CWDS:
                return refuse("unparseable", command=_as_text(command, args), why="too many directory changes")
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

    def judge_step(self, step: Command, cwds: list[str], approvals: frozenset[tuple[str, str]]) -> Verdict:
        """One simple command run in any of `cwds`: the program, the paths it names, its redirections.
        For a `cd`, the verdict's `paths` are the directories it may lead to."""
        rule_ids: list[str] = []
        moved: list[str] = []
        if step.words:
            try:
                facts = analyze(step.words)
            except Refused as exc:
                return refuse("unsafe_argument", command=step.text, why=str(exc))
            if facts.match_text:
                verdict = self._rules.judge("execute", [facts.match_text], approvals, also_denied=facts.aliases)
                if not verdict.allowed:
                    return verdict
                rule_ids += verdict.rule_ids
            else:  # only assignments (`LANG=C`, `X=1`): no program runs; the names are judged below
                rule_ids.append("builtin:assignment")
            if facts.refusal:  # a deny rule had its say first (`xargs rm` is denied by `rm *`)
                return refuse("unsafe_argument", command=step.text, why=facts.refusal)
            unsafe = sorted({name for name in facts.environment if not SAFE_ENV.match(name)} | {
                name for name in facts.shell_variables
                if not SAFE_ENV.match(name) and (is_special(name) or name in self.exported)})  # fmt: skip
            if unsafe:  # `PATH=docs`, `LD_PRELOAD=x.so ls`, `TAPE=host:f tar -t`: the program is not what ran
                return refuse("unsafe_env", names=unsafe, command=step.text,
                              why="a variable that can change what a program runs, loads or opens")  # fmt: skip
            places = cwds if facts.directory is None else self._places.places_from(cwds, facts.directory)
            if places is None:
                return refuse("outside_worktree", path=facts.directory, why="git -C names a place outside")
            for place in places if facts.directory is not None else ():  # `git -C DIR`, `env -C DIR`: a cwd there
                verdict = self._judge_argument("read", place, approvals)
                if not verdict.allowed:
                    return replace(verdict, reason={**verdict.reason, "command": step.text})
                rule_ids += verdict.rule_ids
            for place in places:
                nested = self._places.nested_repository(place)
                if nested is not None:
                    why = "a nested repository: its config and hooks are programs git would run"
                    return refuse("nested_repository", path=nested, command=step.text, why=why)
            for arg in facts.paths:
                for place in places:
                    verdict = self._judge_path_argument(arg, os.path.join(place, arg.text), approvals)
                    if not verdict.allowed:
                        return replace(verdict, reason={**verdict.reason, "command": step.text})
                    rule_ids += verdict.rule_ids
            if facts.changes_directory is not None:
                leads = self._places.places_from(cwds, facts.changes_directory, logical=True)
                if leads is None:
                    return refuse("outside_worktree", path=facts.changes_directory, why="cd leaves the worktree")
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
        if not names_path(arg, os.path.lexists(os.path.join(self._places.root, path))):
            return Verdict(True)
        kind = "write" if arg.write else "read"
        if arg.stored and kind == "read" and arg.text != ".":  # a pathspec of git's: every revision's files there
            stored = self._places.judge_stored(os.path.normpath(path))
            if not stored.allowed:
                return stored
        verdict = self._judge_argument(kind, path, approvals, recursive=arg.recursive, follows=arg.follows_links,
                                       masked=self._masked_reads and not arg.stored)  # fmt: skip
        if verdict.allowed and arg.may_write and kind == "read":
            # a program not known to only read it could write it (`--outp=.git/config`)
            rel = self._places.resolve(path)
            if rel is not None and self._places.is_protected(rel):
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
        return self._places.judge(kind, [path], approvals, confine_only=self._rules.interactive, recursive=recursive,
                                  follows=follows, masked=masked)  # fmt: skip


def _operator_after(steps: Sequence[Command], index: int) -> str:
    """The operator that joins steps[index] to what follows it in its own shell ("" if nothing does)."""
    if index + 1 >= len(steps):
        return ""
    following = steps[index + 1]
    scope = steps[index].scope
    return following.after if following.scope[: len(scope)] == scope else ""


def _as_text(command: str | Sequence[str], args: Sequence[str] | None) -> str:
    if isinstance(command, str):
        return " ".join([command, *(args or ())])
    return " ".join(str(w) for w in command)
