"""What a simple command's arguments name: the paths it reads and writes, where it runs, and what
execute patterns are matched against.

An execute rule allows a program; the files it reaches are named by its arguments. This module
reads them, so the policy can judge each one as the read or write it is:

* every operand, every `--option=VALUE` or `key=VALUE` value, every `-xVALUE` glued value and every
  `@file` is a path *candidate*: it is judged when it names a path (it holds a `/`, is `.` or
  `..`, or exists), as a read unless the program is known to write it;
* programs known to write their operands (`rm`, `touch`, `tee`, `cp`'s target, `sed -i`, ...) and
  options known to name outputs (`--output`, `--log-file`, pytest's `--basetemp`, git's
  `--output`) are judged as writes, whether or not the path exists;
* options that make a program run another program or load code the policy never sees
  (`git -c`, `git --upload-pack`, `git rebase --exec`, `pytest -p`, ...) are refused;
* `git` global options are dropped before matching (`git --no-pager push` is `git push` to a
  `git push*` deny rule), and `git -C DIR` is judged as the directory the command runs in.

URLs other than `file:` name no local path and are left to the network's own bounds.

Where each part lives: a program's record (what it reads, writes and runs) in `_programs.py`, read by
the generic reader `_generic.py` through the option reader `_options.py`; programs read their own way
in `_git.py`, `_sed.py`, `_compilers.py`, `_pytest.py` and `_tar.py`; recursive readers in
`_recursion.py`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence

from .._shell import ASSIGNMENT
from ._compilers import COMPILERS, compiler_paths
from ._facts import CommandFacts, PathArg, Refused, names_path
from ._generic import read_program
from ._git import read_git
from ._programs import program as record
from ._pytest import read_pytest

__all__ = ["CommandFacts", "PathArg", "Refused", "analyze", "names_path"]

#: Builtins whose `NAME=VALUE` arguments set variables for every later command.
_DECLARES = frozenset({"export", "declare", "typeset", "readonly", "local"})


def analyze(words: Sequence[str]) -> CommandFacts:
    """The facts of one simple command (non-empty `words`, after quote removal). Leading `NAME=VALUE`
    words are assignments, as bash reads them: the program is the word after them, and the names they set
    are the command's `environment` (`X=1 rm x` runs `rm x`; `PATH=docs` changes what later commands run)."""
    count = next((i for i, word in enumerate(words) if not ASSIGNMENT.match(word)), len(words))
    names = tuple(ASSIGNMENT.match(word).group(1) for word in words[:count])  # type: ignore[union-attr]
    if count == len(words):  # only assignments: no program runs, no execute rule is needed
        return CommandFacts("", environment=names)
    facts = _program(words[count:])
    if os.path.basename(words[count]) in _DECLARES and words[count] == os.path.basename(words[count]):
        names += tuple(m.group(1) for m in map(ASSIGNMENT.match, words[count + 1 :]) if m)
    if not count and not names:
        return facts
    aliases = (*facts.aliases, shlex.join(words)) if count else facts.aliases  # `X=1 *` deny patterns see it
    return dataclasses.replace(facts, aliases=aliases, environment=names)


def _program(words: Sequence[str]) -> CommandFacts:
    facts = _analyze(words)
    program = os.path.basename(words[0])
    if program != words[0] and program:
        plain = _analyze([program, *words[1:]]).match_text
        return CommandFacts(facts.match_text, facts.paths, facts.directory, facts.changes_directory, (plain,))
    return facts


def _analyze(words: Sequence[str]) -> CommandFacts:
    program = os.path.basename(words[0])
    args = list(words[1:])
    if record(program).opens_no_files:
        return CommandFacts(shlex.join(words))  # their arguments are text (`echo done: /`), never opened
    if program in ("cd", "pushd") and words[0] == program:  # `/usr/bin/cd` is a program: it moves no shell
        return _cd(words)
    if program == "popd" and words[0] == program:  # back to a directory the script was already in
        return CommandFacts(shlex.join(words))
    if program == "git":
        return read_git(words)
    if program in ("pytest", "py.test"):
        return read_pytest(words, args)
    if program.startswith("python") and args[:2] == ["-m", "pytest"]:
        return read_pytest(words, args[2:])
    if program in COMPILERS:
        return CommandFacts(shlex.join(words), tuple(compiler_paths(program, args)))
    return read_program(program, words, args)


def _cd(words: Sequence[str]) -> CommandFacts:
    operands = [w for w in words[1:] if w not in ("-P", "-L", "-e", "-@", "--")]
    if len(operands) != 1 or operands[0] == "-" or operands[0].startswith("-") or operands[0].startswith("+"):
        # `cd` alone goes to $HOME, `cd -` to $OLDPWD, `pushd +N` through the stack: places not on the page
        raise Refused(f"{words[0]} to a place the policy cannot name")
    target = operands[0]
    target_arg = PathArg(target, certain=True, recursive=False, may_write=False)
    return CommandFacts(shlex.join(words), (target_arg,), changes_directory=target)
