"""Split what an execute request would run into simple commands and redirections.

Real agents wrap commands in a shell (Codex: `["/bin/bash", "-lc", script]`;
others send a string). The policy judges every simple command in the script
and every file a redirection touches; anything this module cannot account for
(command substitution, process substitution, here-documents, odd operators)
is `Unparseable`, which the policy refuses.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Command", "Invocation", "Redirect", "Unparseable", "parse_invocation", "parse_script"]

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", "\n", "(", ")"})
_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<", "<>", ">&", "<&"})
# Constructs whose effect cannot be judged from the text: refuse them outright.
_OPAQUE = ("$(", "`", "<(", ">(", "<<")


class Unparseable(ValueError):
    """The command text uses a construct the policy cannot judge."""


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]

    @property
    def text(self) -> str:
        """The command as one string, the form command patterns are matched against."""
        return shlex.join(self.words)


@dataclass(frozen=True)
class Redirect:
    op: str
    target: str

    @property
    def writes(self) -> bool:
        return ">" in self.op


@dataclass(frozen=True)
class Invocation:
    commands: tuple[Command, ...]
    redirects: tuple[Redirect, ...] = ()


def parse_invocation(command: str | Sequence[str], args: Sequence[str] | None = None) -> Invocation:
    """Parse an execute request: a script string, or an argv (command + args)."""
    if isinstance(command, str) and args is None:
        return parse_script(command)
    argv = [command, *(args or ())] if isinstance(command, str) else list(command)
    if not argv or not all(isinstance(w, str) for w in argv) or not argv[0]:
        raise Unparseable(f"not a command: {argv!r}")
    script = _shell_script(argv)
    if script is not None:
        return parse_script(script)
    return Invocation((Command(tuple(argv)),))


def parse_script(script: str) -> Invocation:
    """Split a shell script into its simple commands and redirections."""
    if not isinstance(script, str):
        raise Unparseable(f"not a script: {script!r}")
    for construct in _OPAQUE:
        if construct in script:
            raise Unparseable(f"{construct!r} cannot be judged before it runs")
    expansion = _expansion(script)
    if expansion is not None:
        raise Unparseable(f"{expansion} cannot be judged before the shell expands it")
    lexer = shlex.shlex(script, posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError as exc:  # unbalanced quotes
        raise Unparseable(str(exc)) from None

    commands: list[Command] = []
    redirects: list[Redirect] = []
    words: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in _SEPARATORS:
            _flush(words, commands, redirects)
        elif token in _REDIRECTS:
            if i + 1 >= len(tokens) or _is_operator(tokens[i + 1]):
                raise Unparseable(f"redirection {token!r} has no target")
            target = tokens[i + 1]
            if not (token in (">&", "<&") and (target.isdigit() or target == "-")):
                redirects.append(Redirect(token, target))
            i += 1
        elif _is_operator(token):
            raise Unparseable(f"operator {token!r} is not supported")
        else:
            words.append(token)
        i += 1
    _flush(words, commands, redirects)
    if not commands:
        raise Unparseable("no command to run")
    return Invocation(tuple(commands), tuple(redirects))


def _expansion(script: str) -> str | None:
    """The first construct the shell would expand into text the policy never sees, if any.

    Words are judged as written, so anything the shell rewrites first is refused: parameter
    expansion (`$X`, `${x}`, `$'..'`) outside single quotes; and, unquoted, a leading `~`,
    globs (`*`, `?`, `[`), braces, backslash escapes (including line continuations) and a word-leading
    `#`, which makes the shell ignore what follows it on the line.
    """
    quote = ""
    at_word_start = True
    for ch in script:
        if quote == "'":
            if ch == "'":
                quote = ""
            continue
        if ch == "$":
            return "parameter expansion ($)"
        if quote == '"':
            if ch == '"':
                quote = ""
            elif ch == "\\":
                return "a backslash escape"
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "\\":
            return "a backslash escape"
        elif ch in "*?[{":
            return f"a glob or brace ({ch})"
        elif ch == "~" and at_word_start:
            return "tilde expansion (~)"
        elif ch == "#" and at_word_start:  # the shell drops the rest of the line; our words would not
            return "a comment (#)"
        at_word_start = ch in " \t\n;&|()<>"
    return None


def _flush(words: list[str], commands: list[Command], redirects: list[Redirect]) -> None:
    if not words:
        return
    script = _shell_script(words)
    if script is not None:  # a nested `bash -c '...'`: judge what it runs
        inner = parse_script(script)
        commands.extend(inner.commands)
        redirects.extend(inner.redirects)
    else:
        commands.append(Command(tuple(words)))
    words.clear()


def _shell_script(argv: Sequence[str]) -> str | None:
    """The script of `bash -lc SCRIPT` and friends, or None if argv is not a shell wrapper."""
    if os.path.basename(argv[0]) not in SHELLS:
        return None
    for i, arg in enumerate(argv[1:], start=1):
        if not arg.startswith("-") or arg.startswith("--"):
            return None  # `bash script.sh` runs a file: judged as a command of its own
        if "c" in arg[1:]:
            if i + 1 >= len(argv):
                raise Unparseable(f"{argv[0]} {arg} without a script")
            return argv[i + 1]
    return None


def _is_operator(token: str) -> bool:
    return bool(token) and all(ch in "();<>|&\n" for ch in token)
