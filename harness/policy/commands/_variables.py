"""The shell's own state a builtin changes. Variables it sets, unsets or exports: `X=1` alone, `printf -v X`,
`read X`, `mapfile X`, `unset X`, `getopts S X`, `let X=1` set them in the shell; `export X`, `declare X` (any
of its kind) may put them in the environment of every later command; `set -a` and `set -k` would put every
later one there.

A variable set in the shell alone reaches no program: only bash's own (`PATH`, `IFS`, `CDPATH`, `BASH_ENV`,
...) and those already in the environment change what later commands run (`printf -v PATH docs` makes
`git` the one in docs/). `is_special` names bash's own; the policy knows which are in the environment.

And builtins that change what a later command line means are refused: `trap ACTION` and `mapfile -C` run a
string later, `alias NAME=...` (under `shopt -s expand_aliases`) renames a command, `hash -p` and `enable`
change which program or builtin a name runs (`enable -n cd` makes `cd` move no shell), `shopt -s`/`-u`
changes how later lines are read (`cdable_vars` makes `cd NAME` go where $NAME says).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from .._shell import ASSIGNMENT
from ._facts import Refused

__all__ = ["DECLARES", "exported_by", "is_special", "set_by"]

#: Builtins whose names (bare or `NAME=VALUE`) may go into the environment of every later command.
DECLARES = frozenset({"export", "declare", "typeset", "readonly", "local"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: bash's own variables: setting one changes how the shell finds, expands or runs what comes next.
_SPECIAL = re.compile(
    r"(BASH.*|COMP_.*|READLINE_.*|HIST.*|LC_.*|MAIL.*|PS[0-4]|PATH|IFS|CDPATH|HOME|ENV|SHELLOPTS|GLOBIGNORE|"
    r"EXECIGNORE|FIGNORE|POSIXLY_CORRECT|PWD|OLDPWD|SHLVL|SHELL|TMPDIR|PROMPT_COMMAND|PROMPT_DIRTRIM|FUNCNEST|"
    r"INPUTRC|HOSTFILE|TIMEFORMAT|TMOUT|IGNOREEOF|LANG|LANGUAGE|TERM|OPTIND|OPTERR|OPTARG|DIRSTACK|FCEDIT|"
    r"EMACS|INSIDE_EMACS|COPROC|GROUPS|auto_resume|histchars|_)"
)
#: Builtins whose arguments (when the test holds) change what later command lines run or mean.
_CHANGES_LATER_LINES = {
    "trap": lambda args: len(_after_options(args, "")) > 1 and _after_options(args, "")[0] not in ("-", ""),
    "alias": lambda args: any("=" in a for a in args),
    "hash": lambda args: any(a.startswith("-") and "p" in a for a in args),
    "enable": lambda args: list(args) not in ([], ["-p"], ["-a"]),  # listing only
    "shopt": lambda args: any(a.startswith("-") and ("s" in a or "u" in a) for a in args),
}
#: `set` flags that export later assignments (`-a`) or take `NAME=VALUE` anywhere in a command (`-k`).
_SET_EXPORTS = {"a": "allexport", "k": "keyword"}


def is_special(name: str) -> bool:
    """One of bash's own variables (or the environment's `_`)."""
    return _SPECIAL.fullmatch(name) is not None


def exported_by(args: Sequence[str]) -> tuple[str, ...]:
    """The names `export`/`declare`/... (one of `DECLARES`) may put in the environment: every name it is given
    (`declare X` then `declare -x X` needs both)."""
    return tuple(m.group(0) for m in map(_NAME.match, args) if m)  # an option (`-x`, `+x`) is no name


def set_by(program: str, args: Sequence[str]) -> tuple[str, ...]:
    """The shell variables a builtin sets or unsets (its words after the name); Refused for `set -a`/`-k`."""
    if program == "set":
        _check_set(args)
        return ()
    if program in _CHANGES_LATER_LINES and _CHANGES_LATER_LINES[program](args):
        raise Refused(f"{shlex.join([program, *args])} changes what a later command runs or how the shell reads it")
    if program == "printf":
        return _option_value(args, "v")
    if program == "read":
        return _option_value(args, "a") + _names(_after_options(args, "adinNptu"))
    if program in ("mapfile", "readarray"):  # with no name it sets MAPFILE, which is no one's
        if any(a.startswith("-") and "C" in a for a in args):
            raise Refused(f"{program} -C runs a callback string the policy cannot judge")
        return _names(_after_options(args, "dnOsuCc")[-1:])
    if program == "unset":  # `unset -f NAME` removes a function (no script can define one)
        return () if "-f" in args else _names([a for a in args if not a.startswith("-")])
    if program == "getopts":
        return _names(_after_options(args, "")[1:2])  # `getopts -- ab NAME` too
    if program == "let":
        return tuple(m.group(1) for m in map(ASSIGNMENT.match, args) if m)
    return ()


def _check_set(args: Sequence[str]) -> None:
    for index, arg in enumerate(args):
        if arg in ("--", "-"):
            return  # the positional parameters follow
        if arg.startswith("-") and not arg.startswith("--"):
            letters = arg[1:]
            for letter, name in _SET_EXPORTS.items():
                if letter in letters:
                    raise Refused(f"set -{letter} ({name}) puts later variables in every command's environment")
            if "o" in letters and index + 1 < len(args) and args[index + 1] in _SET_EXPORTS.values():
                raise Refused(f"set -o {args[index + 1]} puts later variables in every command's environment")


def _option_value(args: Sequence[str], letter: str) -> tuple[str, ...]:
    """The value of `-LETTER NAME` or `-LETTERNAME` (clustered: `-rv X`), wherever it comes."""
    found: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and letter in arg[1:]:
            value = arg[arg.index(letter, 1) + 1 :] or (args[index + 1] if index + 1 < len(args) else "")
            found.append(value)
    return _names(found)


def _after_options(args: Sequence[str], takes_value: str) -> list[str]:
    """The operands after getopt-style options, some letters taking a value."""
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "-":
        if args[index] == "--":
            return list(args[index + 1 :])
        arg = args[index]
        glued = next((arg[i + 1 :] for i, ch in enumerate(arg[1:], 1) if ch in takes_value), None)
        index += 2 if glued == "" else 1
    return list(args[index:])


def _names(words: Sequence[str]) -> tuple[str, ...]:
    """The variable names among words (`a[1]` sets `a`); anything else is taken whole, so it is refused."""
    return tuple((_NAME.match(w).group(0) if _NAME.match(w) else w) for w in words)  # type: ignore[union-attr]
