"""The facts a command's reading yields: the paths it names (as reads or writes), where it runs, and
the refusal raised when an argument makes it run or load something the policy cannot judge."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CommandFacts", "PathArg", "Refused", "candidate", "names_path"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class Refused(ValueError):
    """An argument makes the program run or load something the policy cannot judge."""


@dataclass(frozen=True)
class PathArg:
    text: str
    write: bool = False
    certain: bool = False  # judged even when it neither exists nor holds a `/`
    recursive: bool = True  # a directory named here may be read whole (a read deny below it applies)
    may_write: bool = True  # the program might write it after all: a protected path is refused even as a read
    follows_links: bool = False  # read whole following symlinks beneath (`grep -R`, `rg -L`, `zip -r`)
    stored: bool = False  # read from git's object store: no mask of the OS sandbox hides what it holds


@dataclass(frozen=True)
class CommandFacts:
    match_text: str  # what execute patterns are matched against
    paths: tuple[PathArg, ...] = ()
    directory: str | None = None  # where the program runs, relative to the command's cwd (`git -C`)
    changes_directory: str | None = None  # `cd DIR` / `pushd DIR`: later commands may run in DIR
    aliases: tuple[str, ...] = ()  # other spellings deny patterns also see (`/bin/rm x` is `rm x` to `rm *`)
    environment: tuple[str, ...] = ()  # variables the command sets for what it runs (`X=1 cmd`, `export X=1`)
    shell_variables: tuple[str, ...] = ()  # variables it sets in the shell alone (`X=1`, `printf -v X`, `unset X`)
    refusal: str = ""  # why it cannot run whatever the rules allow, once deny rules have seen it (`xargs rm`)


def candidate(text: str, *, write: bool = False, certain: bool = False) -> PathArg:
    """A path candidate. A `file:` URL names its path. Any other URL is judged as the local path it also
    spells: a program that takes no URLs opens `a://b/../../.git/config` as `a:/b/../../.git/config`."""
    if _URL.match(text) and text.lower().startswith("file://"):
        return PathArg(text[len("file://") :] or "/", write, certain=True)
    if text.lower().startswith("file:"):
        return PathArg(text[len("file:") :] or "/", write, certain=True)
    return PathArg(text, write, certain or write)


def names_path(path: PathArg, exists: bool) -> bool:
    """Whether a candidate is judged as a path: known to be one, holding a `/`, or existing."""
    text = path.text
    return bool(text) and (path.certain or "/" in text or text in (".", "..") or exists)
