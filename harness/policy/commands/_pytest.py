"""pytest, read as argparse reads it: its outputs (`--basetemp`, `--junitxml`, `-o cache_dir=...`), and
what makes it load code or send output the policy never sees (`-p PLUGIN`, `-o addopts=`, `--pastebin`)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ._facts import CommandFacts, PathArg, Refused, candidate
from ._generic import read_paths
from ._options import option_values

__all__ = ["read_pytest"]

_PYTEST_WRITES = frozenset({"--basetemp", "--junitxml", "--junit-xml", "--log-file", "--resultlog", "--result-log",
                            "--report-log", "--html", "--rootdir", "--debug"})  # fmt: skip
_PYTEST_REFUSED = {"--pastebin": "sends output to a pastebin service"}
_PYTEST_VALUE_FLAGS = frozenset("kmcoprWn")  # short options that take a value (the rest is flags)


def read_pytest(words: Sequence[str], args: Sequence[str]) -> CommandFacts:
    paths = list(read_paths("pytest", args))
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if name in _PYTEST_REFUSED:
            raise Refused(f"pytest {name} {_PYTEST_REFUSED[name]}")
        following = args[i + 1] if i + 1 < len(args) else ""
        flag, value = _short_option(arg, following) if not arg.startswith("--") else ("", "")
        if arg.startswith("--override-ini"):
            flag, value = "o", arg.partition("=")[2] or following
        if flag == "p" and not value.startswith("no:"):
            raise Refused(f"pytest -p {value} loads a plugin module the policy cannot judge")
        if flag == "o":
            key, _, written = value.partition("=")
            if key.strip() == "addopts":
                raise Refused("pytest -o addopts=... adds options the policy cannot judge")
            if written:
                paths.append(candidate(written, write=True))
    paths += option_values(args, dict.fromkeys(_PYTEST_WRITES, True))
    for arg in args:
        if arg.startswith("--cov-report=") and ":" in arg:
            paths.append(PathArg(arg.split(":", 1)[1], write=True, certain=True))
    return CommandFacts(shlex.join(words), tuple(dict.fromkeys(paths)))


def _short_option(arg: str, following: str) -> tuple[str, str]:
    """argparse's reading of a short option cluster: the first letter that takes a value, and its value
    (the rest of the cluster, or the next argument). `-vo cache_dir=x` is `-v -o cache_dir=x`."""
    if not arg.startswith("-") or len(arg) < 2:
        return "", ""
    for index, letter in enumerate(arg[1:], start=2):
        if letter in _PYTEST_VALUE_FLAGS:
            return letter, arg[index:] or following
    return "", ""
