"""The generic option reader: how an argument sets an option (exactly, abbreviated, inside a short
cluster), the values of options known to name files, and the value glued into a short cluster."""

from __future__ import annotations

from collections.abc import Sequence

from ._facts import PathArg, candidate
from ._record import ShortOptions

__all__ = ["ends_with_value_letter", "glued", "names_option", "option_values"]


def names_option(arg: str, option: str) -> bool:
    """`arg` sets `option`: exactly, with `=VALUE`, abbreviated (git's parse-options take any unambiguous
    prefix: `--upload-pa=`), or for a short option anywhere in a cluster (`-fx CMD` is `-f -x CMD`)."""
    if len(option) == 2:
        return arg.startswith("-") and not arg.startswith("--") and option[1] in arg[1:]
    name = arg.split("=", 1)[0]
    return arg == option or (name.startswith("--") and len(name) > 2 and option.startswith(name))


def glued(arg: str, letters: ShortOptions | None, *, dash_o_writes: bool) -> list[PathArg]:
    """The value glued into a short-option cluster (`-qFsrc/msg`: `-q -F src/msg`). For programs whose
    options are known, the cluster is read as getopt reads it: flags up to the first letter that takes
    a value, then the value; otherwise the text after the first letter is the candidate."""
    if letters is None:
        # Which letter takes a value is unknown: the text after the first one, and any later suffix that
        # holds a `/` (`-vC/etc` may be `-v -C /etc`), are all candidates.
        found = [candidate(arg[2:], write=arg[:2] == "-o" and dash_o_writes)]
        found += [candidate(arg[k:]) for k in range(3, len(arg)) if "/" in arg[k:]]
        return found
    for index, letter in enumerate(arg[1:], start=2):
        if letter in letters.reads or letter in letters.writes:
            value = arg[index:]
            return [candidate(value, write=letter in letters.writes, certain=letter in letters.writes)] if value else []
        if letter in letters.text:
            return []  # a message, a count, a pattern: no path
    return []


def ends_with_value_letter(arg: str, letters: ShortOptions | None) -> str:
    """The letter whose value is the next argument (`-d` of `cut -d /`), if the cluster ends with one."""
    if letters is None:
        return ""
    for index, letter in enumerate(arg[1:], start=2):
        if letter in letters.reads or letter in letters.text or letter in letters.writes:
            return letter if index == len(arg) else ""
    return ""


def option_values(args: Sequence[str], options: dict[str, bool]) -> list[PathArg]:
    """Values of `--opt VALUE` / `--opt=VALUE` / `-oVALUE` for the options given (True: written). A long
    option may be abbreviated (git's parse-options and argparse take any unambiguous prefix: `--outp`)."""
    found: list[PathArg] = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        for option, write in options.items():
            if not write:
                continue
            if len(option) > 2 and not option.startswith("--"):  # find's `-fprint FILE`: never abbreviated
                if arg == option and i + 1 < len(args):
                    found.append(candidate(args[i + 1], write=True, certain=True))
            elif len(option) > 2:
                if len(name) > 2 and name.startswith("--") and option.startswith(name):
                    if eq:
                        found.append(candidate(value, write=True, certain=True))
                    elif i + 1 < len(args):
                        found.append(candidate(args[i + 1], write=True, certain=True))
            elif arg.startswith("-") and not arg.startswith("--") and option[1] in arg[1:]:
                # anywhere in a cluster (`sort -uo FILE`, `cp -vt DIR`): the rest of it, or the next argument
                rest = arg[arg.index(option[1], 1) + 1 :]
                if rest or i + 1 < len(args):
                    found.append(candidate(rest or args[i + 1], write=True, certain=True))
    return found
