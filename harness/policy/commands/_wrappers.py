"""Programs that run the command their operands spell (`nice rm x`, `env X=1 rm x`, `timeout 5 rm x`): each
wrapper's own options are read as the wrapper reads them (getopt with `+`: options stop at the first operand;
long options may be abbreviated), and what it runs is judged as if run directly, so deny rules see it.

A wrapper whose command cannot be known before it runs (`xargs` takes the arguments from its input, `exec`
with no command changes the shell's own descriptors, `eval` and `env -S` parse a string of their own) is
refused, as is a shell started through one (`nice bash -c '...'`): the policy judges a shell's script only
when the shell is run directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._facts import Refused

__all__ = ["Unwrapped", "is_wrapper", "unwrap"]


@dataclass(frozen=True)
class _Grammar:
    """How a wrapper reads its options: short letters taking a value, long options (True: takes a value;
    None: an optional value, given only after `=`), and how many operands come before the command."""

    short_values: str = ""
    short_flags: str = ""
    long: tuple[tuple[str, bool | None], ...] = ()
    leading_operands: int = 0  # `timeout DURATION CMD`
    numeric_option: bool = False  # `nice -10 CMD` is `nice -n 10 CMD`
    external: bool = True  # it execs a program: a shell builtin named after it is not what runs


_GRAMMARS: dict[str, _Grammar] = {
    "nice": _Grammar(short_values="n", long=(("--adjustment", True),), numeric_option=True),
    "nohup": _Grammar(),
    "timeout": _Grammar(short_values="ks", short_flags="v", leading_operands=1,
                        long=(("--kill-after", True), ("--signal", True), ("--preserve-status", False),
                              ("--foreground", False), ("--verbose", False))),
    "stdbuf": _Grammar(short_values="ioe", long=(("--input", True), ("--output", True), ("--error", True))),
    "setsid": _Grammar(short_flags="cfw", long=(("--ctty", False), ("--fork", False), ("--wait", False))),
    "env": _Grammar(short_values="uCS", short_flags="i0v",
                    long=(("--ignore-environment", False), ("--null", False), ("--unset", True), ("--chdir", True),
                          ("--split-string", True), ("--debug", False), ("--block-signal", None),
                          ("--default-signal", None), ("--ignore-signal", None), ("--list-signal-handling", False))),
    "xargs": _Grammar(short_values="adEILnPs", short_flags="0prtx",
                      long=(("--null", False), ("--arg-file", True), ("--delimiter", True), ("--eof", None),
                            ("--replace", None), ("--max-lines", None), ("--max-args", True),
                            ("--interactive", False), ("--no-run-if-empty", False), ("--max-chars", True),
                            ("--verbose", False), ("--exit", False), ("--max-procs", True),
                            ("--process-slot-var", True), ("--show-limits", False), ("--open-tty", False))),
    "exec": _Grammar(short_values="a", short_flags="cl"),
    "command": _Grammar(short_flags="pvV", external=False),
    "builtin": _Grammar(external=False),
}  # fmt: skip
#: bash's builtins among them: only their bare names are these.
_BUILTIN_ONLY = frozenset({"exec", "command", "builtin"})
#: xargs's short options whose value is optional and only ever glued (`-e[EOF]`, `-i[R]`, `-l[N]`).
_XARGS_GLUED = "eil"


@dataclass(frozen=True)
class Unwrapped:
    """What a wrapper runs: its command's words, where it runs it (`env -C`),
    the variables it sets for it, and whether that command takes more arguments from its input (`xargs`)."""

    words: tuple[str, ...]
    directory: str | None = None
    environment: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()
    from_input: bool = False
    reads: tuple[str, ...] = ()  # files it reads itself (`xargs -a FILE`)
    external: bool = True


def unwrap(program: str, words: Sequence[str]) -> Unwrapped | None:
    """The command `words` (a wrapper's, `program` its base name) runs; None when it runs none (`nice` alone
    prints the niceness, `command -v x` describes x). Raises Refused when it cannot be known."""
    if program == "eval":
        raise Refused("eval runs a string the shell parses again when it runs: the policy cannot judge it")
    grammar = _GRAMMARS[program]
    options, index = _read_options(program, grammar, words)
    rest = list(words[index:])
    if program == "command" and any(o in ("-v", "-V") for o, _ in options):
        return None  # it describes the command, runs nothing
    environment: list[str] = []
    if program == "env":
        for option, _ in options:
            if option in ("-S", "--split-string"):
                raise Refused(
                    "env -S splits a string with escapes and variables of its own: the policy cannot judge it"
                )
            if option in ("-i", "--ignore-environment"):
                raise Refused("env -i drops the environment the kernel gives commands (its git settings among it)")
        while rest and "=" in rest[0]:  # as GNU env reads them: `=x` too (it then runs what follows)
            environment.append(rest.pop(0).split("=", 1)[0])
    rest = rest[grammar.leading_operands :] if len(rest) > grammar.leading_operands else []
    if not rest:
        if program == "exec":
            raise Refused("exec with no command changes the shell's own descriptors for every later command")
        if program == "xargs":
            rest = ["echo"]  # xargs's default command
        else:
            return None  # `env` prints the environment, `nice` the niceness
    directory = next((v for o, v in options if o in ("-C", "--chdir")), None)
    unset = tuple(v for o, v in options if o in ("-u", "--unset"))
    reads = tuple(v for o, v in options if o in ("-a", "--arg-file"))
    return Unwrapped(tuple(rest), directory, tuple(environment), unset,
                     from_input=program == "xargs", reads=reads, external=grammar.external)  # fmt: skip


def is_wrapper(word: str) -> str:
    """The wrapper `word` names ("" if none): bare, or from a system directory for the external ones."""
    name = word.rsplit("/", 1)[-1]
    if name not in _GRAMMARS and name != "eval":
        return ""
    if word != name and (name in _BUILTIN_ONLY or name == "eval" or word.rsplit("/", 1)[0] not in _SYSTEM_BIN):
        return ""  # `/usr/bin/command` is a script of its own; `src/nice` is whatever the agent wrote there
    return name


_SYSTEM_BIN = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})


def _read_options(program: str, grammar: _Grammar, words: Sequence[str]) -> tuple[list[tuple[str, str]], int]:
    """The options before the first operand, as getopt_long with `+` reads them; the operand's index."""
    options: list[tuple[str, str]] = []
    i = 1
    while i < len(words):
        arg = words[i]
        if arg == "--":
            return options, i + 1
        if program == "env" and arg == "-":  # `env -` is `env -i`
            raise Refused("env - drops the environment the kernel gives commands (its git settings among it)")
        if not arg.startswith("-") or arg == "-":
            return options, i
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            option, takes = _long_option(program, grammar, name)
            if takes is True and not eq:
                if i + 1 >= len(words):
                    raise Refused(f"{program} {option} without its value")
                value = words[i + 1]
                i += 1
            elif takes is False and eq:
                raise Refused(f"{program} {option} takes no value")
            options.append((option, value))
            i += 1
            continue
        if grammar.numeric_option and arg[1:].isdigit():  # `nice -10`
            options.append(("-n", arg[1:]))
            i += 1
            continue
        i = _short_cluster(program, grammar, words, i, options)
    return options, i


def _long_option(program: str, grammar: _Grammar, name: str) -> tuple[str, bool | None]:
    exact = [(o, t) for o, t in grammar.long if o == name]
    matches = exact or [(o, t) for o, t in grammar.long if len(name) > 2 and o.startswith(name)]
    if len(matches) != 1:
        why = "is ambiguous" if matches else "is not one the policy knows"
        raise Refused(f"{program} option {name} {why}")
    return matches[0]


def _short_cluster(program: str, grammar: _Grammar, words: Sequence[str], i: int,
                   options: list[tuple[str, str]]) -> int:  # fmt: skip
    """One cluster of short options (`-vk 5`, `-n10`): flags, then a letter whose value is the rest of the
    cluster or the next argument. The index after what it took."""
    arg = words[i]
    for index, letter in enumerate(arg[1:], start=2):
        if program == "xargs" and letter in _XARGS_GLUED:
            options.append((f"-{letter}", arg[index:]))
            return i + 1
        if letter in grammar.short_values:
            if arg[index:]:
                options.append((f"-{letter}", arg[index:]))
                return i + 1
            if i + 1 >= len(words):
                raise Refused(f"{program} -{letter} without its value")
            options.append((f"-{letter}", words[i + 1]))
            return i + 2
        if letter not in grammar.short_flags:
            raise Refused(f"{program} option -{letter} is not one the policy knows")
        options.append((f"-{letter}", ""))
    return i + 1
