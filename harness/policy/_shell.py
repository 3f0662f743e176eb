"""Read an execute request the way bash reads it: its simple commands, their words and redirections.

Real agents wrap commands in a shell (Codex: `["/bin/bash", "-lc", script]`; others send a
string). The policy judges every simple command in the script and every file a redirection
touches, so the words it judges must be the words bash will run. This module reads the subset of
bash whose meaning is fixed before it runs:

* words of plain characters, single-quoted and double-quoted text. Only a space or a tab separates
  words; a carriage return, vertical tab or form feed is part of a word, as it is for bash;
* the operators `;` `&` `&&` `||` `|` `|&` and newline, subshells `( ... )` at command position;
* redirections `<` `>` `>>` `>|` `<>` `&>` `&>>` `<&` `>&`, with an optional fd number (`2>`).

Anything else is `Unparseable`, which the policy refuses: expansions (`$`, backquotes), globs,
braces, backslash escapes, tilde prefixes, comments, here-documents, process substitution,
arithmetic, reserved words (`if`, `for`, `!`, ...), function definitions, NUL and surrogates.

`bash`/`sh`/`dash` invocations are unwrapped by parsing their options as bash does (clustered
flags, `-o NAME`, `-`, `--`): the script of `-c` is read recursively; a script file operand is
a command of its own; reading commands from stdin, or any option not known to be harmless, is
refused.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "ASSIGNMENT",
    "SHELLS",
    "Command",
    "Invocation",
    "Redirect",
    "Unparseable",
    "parse_invocation",
    "parse_script",
]

#: Shells whose `-c` scripts are unwrapped and judged command by command (bash syntax).
SHELLS = frozenset({"sh", "bash", "dash"})
#: A word bash reads as an assignment when it comes before the program (`NAME=`, `NAME+=`, `NAME[i]=`).
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
_BLANKS = " \t"  # the only characters bash splits words on (a newline is an operator)
_OPERATOR_CHARS = "|&;()<>"
# Longest first. The refused ones are recognised so that they can be named in the refusal.
_OPERATORS = (
    ";;&", "&>>", "<<<", "<<-",
    ";;", ";&", "&&", "||", "|&", "&>", "<<", "<>", "<&", ">&", ">>", ">|", "<(", ">(", "((",
    ";", "&", "|", "(", ")", "<", ">", "\n",
)  # fmt: skip
_SEPARATORS = frozenset({";", "&", "\n"})
_CONNECTORS = frozenset({"&&", "||", "|", "|&"})  # need a command after them
_REDIRECTS = frozenset({"<", ">", ">>", ">|", "<>", "&>", "&>>", "<&", ">&"})
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "<>", "&>", "&>>", ">&"})
_REFUSED_OPERATORS = {
    ";;": "a case clause (;;)",
    ";;&": "a case clause (;;&)",
    ";&": "a case clause (;&)",
    "<<": "a here-document (<<)",
    "<<-": "a here-document (<<-)",
    "<<<": "a here-string (<<<)",
    "<(": "process substitution (<()",
    ">(": "process substitution (>()",
    "((": "arithmetic evaluation ((()",
}
#: Words that mean something else at command position: compound commands, negation, timing.
_RESERVED = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for",
                       "select", "function", "time", "coproc", "!", "[[", "]]", "{", "}"})  # fmt: skip
#: Bash builtins that evaluate `$(...)` hidden in array subscripts or arithmetic of their arguments
#: (`printf -v 'a[$(id)]'`, `test -v`, `unset`, `let`, ...): a `$` or backquote in their words is refused.
_EVALUATING_BUILTINS = frozenset({"printf", "test", "read", "declare", "typeset", "local", "export", "readonly",
                                  "unset", "let", "mapfile", "readarray", "kill", "wait", "shift", "return", "exit",
                                  "ulimit", "getopts", "[", "eval", "source", ".", "trap", "alias", "hash",
                                  "enable", "builtin", "command", "fc", "exec", "compgen", "complete"})  # fmt: skip
# Shell options that change nothing about what a script runs: `-c`, `-l`, `-e`, `-u`, `-x`, `-v`,
# `-f` (no globbing), `-C` (no clobbering), and `-o NAME` / `+o NAME` for these names.
_SHELL_FLAGS = frozenset("celuxvfC")
_SHELL_O_NAMES = frozenset({"pipefail", "errexit", "nounset", "xtrace", "verbose", "noglob", "noclobber"})
_SHELL_LONG = frozenset({"--login", "--noprofile", "--norc", "--noediting"})
_MAX_DEPTH = 8  # nested `bash -c "bash -c '...'"`
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() takes `٢` and `²`, bash does not
_FD_TARGET = re.compile(r"[0-9]{1,9}")  # `>&2` duplicates an fd; `>&٢` or a huge number is a file name
#: Where a shell named by a path really is a system shell; any other `dir/bash` is a program of its own.
_SYSTEM_BIN = frozenset({"/bin", "/usr/bin", "/usr/local/bin"})


class Unparseable(ValueError):
    """The command text uses a construct the policy cannot judge."""


@dataclass(frozen=True)
class Redirect:
    op: str
    target: str
    fd: int | None = None  # the fd number written before the operator (`2>`), if any

    @property
    def writes(self) -> bool:
        return self.op in _WRITE_REDIRECTS


@dataclass(frozen=True)
class Command:
    """A simple command: its words (after quote removal) and its redirections, in script order.

    A command with no words is a bare redirection (`> file` truncates the file). `after` is the operator
    that joins it to the command before it in the same shell (`&&`: it runs only if that one succeeded);
    `scope` names the shell it runs in: the script's own is `(0,)`, each subshell `( ... )` and each
    nested `bash -c` adds a level, so a `cd` in one never moves the commands of another."""

    words: tuple[str, ...]
    redirects: tuple[Redirect, ...] = ()
    after: str = ""
    scope: tuple[int, ...] = (0,)

    @property
    def text(self) -> str:
        """The command as one string (each word shell-quoted), the form command patterns are matched against."""
        return shlex.join(self.words)


@dataclass(frozen=True)
class Invocation:
    commands: tuple[Command, ...]

    @property
    def redirects(self) -> tuple[Redirect, ...]:
        return tuple(r for c in self.commands for r in c.redirects)


def parse_invocation(command: str | Sequence[str], args: Sequence[str] | None = None) -> Invocation:
    """Parse an execute request: a script string, or an argv (command + args)."""
    if isinstance(command, str) and args is None:
        return parse_script(command)
    if args is not None and not isinstance(args, (list, tuple)):
        raise Unparseable(f"args is not a list: {args!r}")  # a string would be spread into letters
    argv = [command, *(args or ())] if isinstance(command, str) else list(command)
    if not argv or not all(isinstance(w, str) for w in argv) or not argv[0]:
        raise Unparseable(f"not a command: {argv!r}")
    for word in argv:
        _check_characters(word)
    commands: list[Command] = []
    _add_command(argv, (), commands, _Place(0, "", (0,), itertools.count(1)))
    return Invocation(tuple(commands))


def parse_script(script: str) -> Invocation:
    """Split a shell script into its simple commands, each with its redirections."""
    return Invocation(tuple(_parse(script, _Place(0, "", (0,), itertools.count(1)))))


@dataclass(frozen=True)
class _Place:
    """Where a script being parsed sits: how deep in nested shells, the operator before it, its scope."""

    depth: int
    after: str
    scope: tuple[int, ...]
    ids: Iterator[int]


def _parse(script: str, place: _Place) -> list[Command]:
    if not isinstance(script, str):
        raise Unparseable(f"not a script: {script!r}")
    if place.depth > _MAX_DEPTH:
        raise Unparseable(f"shells nested more than {_MAX_DEPTH} deep")
    _check_characters(script)
    return _Parser(_tokens(script), place).commands()


# --- the lexer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    value: str
    op: bool = False  # an operator, not a word
    fd: bool = False  # an unquoted all-digit word glued to a following `<` or `>`


def _check_characters(text: str) -> None:
    if "\0" in text:
        raise Unparseable("a NUL character cannot be passed to a program")
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise Unparseable("a lone surrogate is not a character a program can receive")


def _tokens(script: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(script)
    while i < n:
        ch = script[i]
        if ch in _BLANKS:
            i += 1
        elif ch in _OPERATOR_CHARS or ch == "\n":
            op = next(o for o in _OPERATORS if script.startswith(o, i))
            if op in _REFUSED_OPERATORS:
                raise Unparseable(f"{_REFUSED_OPERATORS[op]} cannot be judged before it runs")
            tokens.append(_Token(op, op=True))
            i += len(op)
        elif ch == "#":
            raise Unparseable("a comment (#): bash ignores the rest of the line")
        else:
            word, quoted, i = _word(script, i)
            glued = not quoted and i < n and script[i] in "<>"
            if glued and word.isascii() and word.isdigit() and len(word) > 1:
                # bash takes `12>` as fd 12 (up to INT_MAX, then a word), dash as the word `12` and `>`
                raise Unparseable(f"an fd number of more than one digit ({word}>) reads differently in sh and bash")
            tokens.append(_Token(word, fd=glued and word in _DIGITS))
    return tokens


def _word(script: str, start: int) -> tuple[str, bool, int]:
    """Read one word from `start`: its value after quote removal, whether any part was quoted, and
    where it ends. Refuses every character bash would expand or treat specially inside a word."""
    parts: list[str] = []
    quoted = False
    i, n = start, len(script)
    while i < n:
        ch = script[i]
        if ch in _BLANKS or ch in _OPERATOR_CHARS or ch == "\n":
            break
        if ch == "'":
            end = script.find("'", i + 1)
            if end < 0:
                raise Unparseable("an unterminated single quote")
            parts.append(script[i + 1 : end])
            quoted, i = True, end + 1
            continue
        if ch == '"':
            end = i + 1
            while end < n and script[end] != '"':
                _refuse_in_double_quotes(script[end])
                end += 1
            if end >= n:
                raise Unparseable("an unterminated double quote")
            parts.append(script[i + 1 : end])
            quoted, i = True, end + 1
            continue
        _refuse_unquoted(ch, at_start=i == start, after=script[i - 1] if i > start else "")
        parts.append(ch)
        i += 1
    return "".join(parts), quoted, i


def _refuse_in_double_quotes(ch: str) -> None:
    if ch == "$":
        raise Unparseable("parameter expansion ($) cannot be judged before the shell expands it")
    if ch == "`":
        raise Unparseable("command substitution (`) cannot be judged before it runs")
    if ch == "\\":
        raise Unparseable("a backslash escape cannot be judged before the shell reads it")


def _refuse_unquoted(ch: str, *, at_start: bool, after: str) -> None:
    _refuse_in_double_quotes(ch)
    if ch in "*?[":
        raise Unparseable(f"a glob ({ch}) cannot be judged before the shell expands it")
    if ch in "{}":
        raise Unparseable(f"a brace ({ch}) cannot be judged before the shell expands it")
    # Bash expands `~` at a word's start, and after `=` or `:` in words that look like assignments
    # (`of=~/x`, `PATH=a:~/b`), even when they are arguments.
    if ch == "~" and (at_start or after in "=:"):
        raise Unparseable("tilde expansion (~) cannot be judged before the shell expands it")


# --- the parser --------------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[_Token], place: _Place) -> None:
        self.tokens = tokens
        self.place = place
        self.out: list[Command] = []
        self.scopes = [place.scope]  # the innermost last
        self.joined = place.after  # the operator before the next command, in its own scope

    def commands(self) -> list[Command]:
        words: list[str] = []
        redirects: list[Redirect] = []
        depth = 0
        after_close = False  # after `)`: only redirections and operators may follow
        need_command = False  # after `&&`, `||`, `|` (or at a subshell's start): a command must follow
        fd: int | None = None  # an fd number glued to the next redirection (`2>`)
        tokens = self.tokens
        i = 0
        while i < len(tokens):
            token = tokens[i]
            value = token.value
            if not token.op:
                if token.fd:
                    fd = int(value)
                elif after_close:
                    raise Unparseable(f"a word after ')': {value!r}")
                else:
                    words.append(value)
                    need_command = False
            elif value in _SEPARATORS or value in _CONNECTORS:
                if not (words or redirects or after_close):
                    if value != "\n":  # blank lines, and a newline after `&&`, are fine
                        raise Unparseable(f"{value!r} with no command before it")
                    i += 1
                    continue
                self._flush(words, redirects)
                after_close = False
                need_command = value in _CONNECTORS
                self.joined = value
            elif value == "(":
                if words or redirects or after_close:
                    raise Unparseable("'(' after a word: a function definition or a syntax error")
                depth += 1
                need_command = True
                self.scopes.append((*self.scopes[-1], next(self.place.ids)))  # keeps the operator before it
            elif value == ")":
                if depth == 0:
                    raise Unparseable("')' without a matching '('")
                if need_command:
                    raise Unparseable("')' where a command must come")
                self._flush(words, redirects)
                depth -= 1
                after_close = True
                self.scopes.pop()
                self.joined = ""
            else:  # a redirection: the next token is its target
                if i + 1 >= len(tokens) or tokens[i + 1].op:
                    raise Unparseable(f"redirection {value!r} has no target")
                target = tokens[i + 1].value
                if value in ("<&", ">&") and (_FD_TARGET.fullmatch(target) or target == "-"):
                    pass  # duplicates or closes a file descriptor: touches no file
                elif value == "<&":
                    raise Unparseable(f"'<&{target}' duplicates no file descriptor")
                else:
                    redirects.append(Redirect(value, target, fd))
                fd = None
                need_command = False
                i += 1
            i += 1
        if depth:
            raise Unparseable("'(' without a matching ')'")
        if need_command:
            raise Unparseable("the script ends where a command must follow")
        self._flush(words, redirects)
        if not self.out:
            raise Unparseable("no command to run")
        return self.out

    def _flush(self, words: list[str], redirects: list[Redirect]) -> None:
        if words or redirects:
            place = _Place(self.place.depth, self.joined, self.scopes[-1], self.place.ids)
            _add_command(words, tuple(redirects), self.out, place)
            self.joined = ""
        words.clear()
        redirects.clear()


def _add_command(words: Sequence[str], redirects: tuple[Redirect, ...], out: list[Command], place: _Place) -> None:
    if words and words[0] in _RESERVED:
        raise Unparseable(f"the reserved word {words[0]!r} cannot be judged as a command")
    if words and os.path.basename(words[0]) in _EVALUATING_BUILTINS and any("$" in w or "`" in w for w in words[1:]):
        raise Unparseable(f"{words[0]} evaluates '$(...)' in its arguments")
    assigned = next((i for i, word in enumerate(words) if not ASSIGNMENT.match(word)), len(words))
    script = shell_script(words[assigned:]) if words[assigned:] else None
    if script is None:
        out.append(Command(tuple(words), redirects, place.after, place.scope))
        return
    if redirects or assigned:  # the wrapper's own redirections and variables (`X=1 bash -c ...`), judged here
        out.append(Command(tuple(words[:assigned]), redirects, place.after, place.scope))
    # a nested `bash -c '...'`: judge what it runs, in a shell of its own
    inner = _Place(place.depth + 1, place.after, (*place.scope, next(place.ids)), place.ids)
    out.extend(_parse(script, inner))


def shell_script(argv: Sequence[str]) -> str | None:
    """The script of `bash -lc SCRIPT` and friends; None when argv runs a script file (then it is
    judged as a command of its own) or is not a shell. Options are parsed as bash parses them;
    anything else that makes the shell read commands (stdin, `-s`, `-i`) is refused."""
    shell = os.path.basename(argv[0])
    if shell not in SHELLS or (argv[0] != shell and os.path.dirname(argv[0]) not in _SYSTEM_BIN):
        return None  # `src/sh -c ls` runs the file src/sh, whatever it says it is
    reads_c = False
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-", "--"):  # the end of the options
            i += 1
            break
        if arg.startswith("--"):
            if arg not in _SHELL_LONG:
                raise Unparseable(f"{shell} option {arg!r} is not one the policy can judge")
            i += 1
            continue
        if len(arg) < 2 or arg[0] not in "-+":
            break  # the first operand
        takes_name = 0
        for flag in arg[1:]:
            if flag == "o":
                takes_name += 1
            elif flag not in _SHELL_FLAGS or (flag == "c" and arg[0] == "+"):
                raise Unparseable(f"{shell} option {arg[0]}{flag} is not one the policy can judge")
            reads_c = reads_c or flag == "c"
        for _ in range(takes_name):  # `-o NAME`: each o in a cluster takes the next argument
            i += 1
            if i >= len(argv) or argv[i] not in _SHELL_O_NAMES:
                name = argv[i] if i < len(argv) else None
                raise Unparseable(f"{shell} {arg[0]}o {name!r} is not an option the policy can judge")
        i += 1
    operands = argv[i:]
    if reads_c:
        if not operands:
            raise Unparseable(f"{shell} -c without a script")
        return operands[0]  # the rest become $0, $1, ...: never expanded, since `$` is refused
    if not operands:
        raise Unparseable(f"{shell} with no script reads its commands from stdin")
    return None
