"""Recursive readers: when a program reads the directory it runs in whole although no argument names
it (`grep -r x`, `rg x`, `ls -R`), and when a recursive read follows the symlinks it meets beneath."""

from __future__ import annotations

from collections.abc import Sequence

from ._options import names_option
from ._programs import program as record

__all__ = ["follows_links", "lists_recursively", "reads_cwd_whole"]

#: GNU grep's long options (3.x), for reading abbreviations as getopt_long does; those taking a value.
_GREP_LONG_VALUES = frozenset({"--regexp", "--file", "--max-count", "--label", "--after-context",
                               "--before-context", "--context", "--directories", "--devices", "--exclude",
                               "--exclude-from", "--exclude-dir", "--include", "--group-separator",
                               "--binary-files"})  # fmt: skip
_GREP_LONG = _GREP_LONG_VALUES | {
    "--extended-regexp", "--fixed-strings", "--basic-regexp", "--perl-regexp", "--ignore-case", "--no-ignore-case",
    "--word-regexp", "--line-regexp", "--null-data", "--no-messages", "--invert-match", "--version", "--help",
    "--byte-offset", "--line-number", "--no-line-number", "--line-buffered", "--with-filename", "--no-filename",
    "--only-matching", "--quiet", "--silent", "--text", "--recursive", "--dereference-recursive",
    "--files-without-match", "--files-with-matches", "--count", "--initial-tab", "--null", "--no-group-separator",
    "--color", "--colour", "--binary",
}  # fmt: skip


def follows_links(program: str, args: Sequence[str]) -> bool:
    """Whether a recursive read follows symlinks beneath (zip follows by default)."""
    if program == "zip":
        return not any(names_option(a, "-y") or names_option(a, "--symlinks") for a in args)
    if program == "find":  # `-L` before the paths, `-follow` among the expressions
        return "-L" in args or "-follow" in args
    return any(names_option(a, o) for a in args for o in record(program).follows_links)


def lists_recursively(program: str, args: Sequence[str]) -> bool:
    """`ls -R` lists what every directory below holds."""
    return program == "ls" and any(names_option(a, "-R") or names_option(a, "--recursive") for a in args)


def reads_cwd_whole(program: str, args: Sequence[str]) -> bool:
    """A recursive reader given no directory reads the one it runs in (grep -r, rg and ag by default)."""
    operands = [a for a in args if not a.startswith("-")]
    if program in ("rg", "ag"):
        return len(operands) <= 1  # the pattern alone
    if program == "ls":
        return not operands and lists_recursively(program, args)
    if program in ("grep", "egrep", "fgrep"):
        return _grep_reads_cwd_whole(args)
    return False


def _grep_reads_cwd_whole(args: Sequence[str]) -> bool:
    recursive = pattern_given = False
    operands: list[str] = []
    values = iter(args)
    for arg in values:
        if arg == "--":
            operands += list(values)
        elif arg.startswith("--"):  # getopt_long: any unambiguous prefix (`--recur`, `--dir rec`)
            name, eq, value = arg.partition("=")
            known = [o for o in _GREP_LONG if o.startswith(name)]
            option = name if name in _GREP_LONG else known[0] if len(known) == 1 else ""
            recursive |= any(o in ("--recursive", "--dereference-recursive") for o in known)  # ambiguous too
            if option in _GREP_LONG_VALUES and not eq:
                value = next(values, "")
            pattern_given |= option in ("--regexp", "--file")
            recursive |= option == "--directories" and bool(value) and "recurse".startswith(value)
        elif arg.startswith("-") and len(arg) > 1:
            for index, letter in enumerate(arg[1:], start=2):  # getopt: flags, then one that takes a value
                recursive |= letter in "rR"
                if letter in "efmABCdD":
                    value = arg[index:] or next(values, "")
                    pattern_given |= letter in "ef"
                    recursive |= letter == "d" and bool(value) and "recurse".startswith(value)
                    break
        else:
            operands.append(arg)
    return recursive and len(operands) <= (0 if pattern_given else 1)
