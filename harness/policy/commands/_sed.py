"""sed, read as GNU sed's getopt reads it: its scripts (each command checked: `w`, `r`, `e` and
`s///w` read, write or run files the policy cannot judge), its file operands, and whether it edits
them in place."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._facts import PathArg, Refused, candidate

__all__ = ["read_sed", "sed_paths"]


def sed_paths(args: Sequence[str]) -> list[PathArg]:
    """The files sed reads, or writes when it edits them in place."""
    _, files, in_place = read_sed(args)
    return [candidate(f, write=in_place, certain=True) for f in files]


_SED_LONG = ("--expression", "--file", "--in-place", "--line-length", "--null-data", "--zero-terminated",
             "--separate", "--sandbox", "--debug", "--posix", "--regexp-extended", "--quiet", "--silent",
             "--unbuffered", "--follow-symlinks", "--binary", "--help", "--version")  # fmt: skip


def read_sed(args: Sequence[str]) -> tuple[list[str], list[str], bool]:
    """sed's arguments read as GNU sed's getopt reads them: its scripts, its file operands, and whether it
    edits them in place. A script file (`-f`), or an option it does not know, is refused."""
    scripts: list[str] = []
    operands: list[str] = []
    in_place = False
    i = 0
    while i < len(args):
        arg = args[i]
        following = args[i + 1] if i + 1 < len(args) else None
        if arg == "--":
            operands += args[i + 1 :]
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            matches = [o for o in _SED_LONG if o.startswith(name)] if len(name) > 2 else []
            if len(matches) != 1:
                raise Refused(f"sed option {name} is not one the policy can judge")
            option = matches[0]
            if option == "--file":
                raise Refused("sed --file runs a script file the policy cannot judge")
            if option in ("--expression", "--line-length") and not eq:
                if following is None:
                    raise Refused(f"sed {option} without its value")
                value, i = following, i + 1
            if option == "--expression":
                scripts.append(value)
            in_place = in_place or option == "--in-place"
        elif arg.startswith("-") and len(arg) > 1:
            for k, letter in enumerate(arg[1:], start=2):
                if letter == "f":
                    raise Refused("sed -f runs a script file the policy cannot judge")
                if letter == "i":  # -i[SUFFIX]: the rest of the cluster is the suffix
                    in_place = True
                    break
                if letter in "el":  # the rest of the cluster, or the next argument, is the value
                    value = arg[k:]
                    if not value:
                        if following is None:
                            raise Refused(f"sed -{letter} without its value")
                        value, i = following, i + 1
                    if letter == "e":
                        scripts.append(value)
                    break
                if letter not in "nsuzErb":
                    raise Refused(f"sed option -{letter} is not one the policy can judge")
        else:
            operands.append(arg)
        i += 1
    if not scripts:
        if not operands:
            raise Refused("sed without a script")
        scripts, operands = operands[:1], operands[1:]
    for script in scripts:
        _check_sed_script(script)
    return scripts, operands, in_place


def _check_sed_script(script: str) -> None:
    i, n = 0, len(script)
    while i < n:
        ch = script[i]
        if ch in " \t\n;{}!0123456789,$~+":  # separators, blocks, negation and line addresses
            i += 1
        elif ch in "/\\":  # a /regex/ or \cregexc address
            delimiter = script[i + 1] if ch == "\\" and i + 1 < n else "/"
            i = _sed_delimited(script, i + (2 if ch == "\\" else 1), delimiter)
            while i < n and script[i] in "IM":
                i += 1
        elif ch in "sy":
            if i + 1 >= n or script[i + 1] in "\\\n":
                raise Refused("sed: an s or y command without a delimiter")
            delimiter = script[i + 1]
            i = _sed_delimited(script, _sed_delimited(script, i + 2, delimiter), delimiter)
            flags = re.match(r"[gpiImMe0-9w]*", script[i:])
            if flags and ("w" in flags.group() or "e" in flags.group()):
                raise Refused("sed s///w and s///e write a file or run a command the policy cannot judge")
            i += len(flags.group()) if flags else 0
        elif ch in "wWrReF":
            raise Refused(f"sed command {ch!r} reads, writes or runs a file the policy cannot judge")
        elif ch in "aic":  # text: the rest of the line
            end = script.find("\n", i)
            i = n if end < 0 else end
        elif ch in ":btT":  # a label, up to `;` or a newline; GNU sed also ends one at a blank, and reads on
            ends = [e for e in (script.find(";", i), script.find("\n", i)) if e >= 0]
            end = min(ends) if ends else n
            if re.search(r"\s", script[i + 1 : end].lstrip(" \t")):  # `:a w .git/config` writes
                raise Refused("sed: a label with a blank in it (sed reads a command after the blank)")
            i = end
        elif ch in "pPdDnNgGhHxlLqQz=v":
            i += 1
        else:
            raise Refused(f"sed command {ch!r} is not one the policy knows")


def _sed_delimited(script: str, i: int, delimiter: str) -> int:
    """The index just past the unescaped `delimiter` that ends the part starting at `i`."""
    while i < len(script):
        if script[i] == "\\":
            i += 2
            continue
        if script[i] == delimiter:
            return i + 1
        i += 1
    raise Refused("sed: an unterminated regular expression or replacement")
