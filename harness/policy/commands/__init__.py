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

from .._shell import ASSIGNMENT, SHELLS
from ._compilers import COMPILERS, compiler_paths
from ._facts import CommandFacts, PathArg, Refused, candidate, names_path
from ._generic import read_program
from ._git import read_git
from ._programs import program as record
from ._pytest import read_pytest
from ._variables import DECLARES, exported_by, set_by
from ._wrappers import is_wrapper, unwrap

__all__ = ["CommandFacts", "PathArg", "Refused", "analyze", "names_path"]

#: Builtins that set shell variables or change how later lines run (`_variables.set_by`).
_SETS_VARIABLES = frozenset({"set", "printf", "read", "mapfile", "readarray", "unset", "getopts", "let", "trap",
                             "alias", "hash", "enable", "shopt"})  # fmt: skip
#: Shells a wrapper could start: their script is judged only when the shell is run directly.
_ANY_SHELL = SHELLS | {"zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "busybox"}
_MAX_WRAPPERS = 8  # `nice nice ... rm`: deeper than this is refused


def analyze(words: Sequence[str]) -> CommandFacts:
    """The facts of one simple command (non-empty `words`, after quote removal). Leading `NAME=VALUE`
    words are assignments, as bash reads them: the program is the word after them, and the names they set
    are the command's `environment` (`X=1 rm x` runs `rm x`; `PATH=docs` alone changes what later commands
    run). A wrapper (`nice`, `env`, `timeout`, `xargs`, ...) is judged as the command it runs."""
    count = next((i for i, word in enumerate(words) if not ASSIGNMENT.match(word)), len(words))
    names = tuple(ASSIGNMENT.match(word).group(1) for word in words[:count])  # type: ignore[union-attr]
    if count == len(words):  # only assignments: no program runs, no execute rule is needed
        return CommandFacts("", shell_variables=names)
    facts = _command(words[count:], builtins=True, depth=0)
    if not count:
        return facts
    aliases = (*facts.aliases, shlex.join(words))  # `X=1 *` deny patterns see it
    return dataclasses.replace(facts, aliases=aliases, environment=(*names, *facts.environment))


def _command(words: Sequence[str], *, builtins: bool, depth: int) -> CommandFacts:
    """A command from its program on; `builtins`: run by the shell itself (a builtin is what runs), not by
    a wrapper that execs a program (`nice cd x` runs a program named cd, and moves no shell)."""
    wrapper = is_wrapper(words[0])
    if wrapper:
        return _wrapped(wrapper, words, depth)
    facts = _program(words, builtins=builtins)
    program = words[0]
    if builtins and program in DECLARES:
        facts = dataclasses.replace(facts, environment=(*facts.environment, *exported_by(words[1:])))
    elif builtins and program in _SETS_VARIABLES:
        facts = dataclasses.replace(facts, shell_variables=set_by(program, words[1:]))
    return facts


def _wrapped(wrapper: str, words: Sequence[str], depth: int) -> CommandFacts:
    """What a wrapper runs, judged as if run directly: allow rules match it, deny rules also see the whole
    command (`nice rm x` is `rm x` to an `rm *` deny, and `nice *` sees it too)."""
    if depth >= _MAX_WRAPPERS:
        raise Refused(f"more than {_MAX_WRAPPERS} wrappers around one command")
    inner = unwrap(wrapper, words)
    if inner is None:  # it runs nothing: `nice` alone, `env` alone, `command -v x`
        return CommandFacts(shlex.join(words))
    if os.path.basename(inner.words[0]) in _ANY_SHELL:
        raise Refused(f"a shell started through {wrapper} runs a script the policy judges only when the shell is "
                      "run directly (`bash -c '...'`)")  # fmt: skip
    facts = _command(inner.words, builtins=not inner.external, depth=depth + 1)
    aliases = [*facts.aliases, shlex.join(words)]
    paths = [*facts.paths, *(candidate(f, certain=True) for f in inner.reads)]
    directory = facts.directory
    if inner.directory is not None:  # `env -C DIR`: the command runs in DIR (and `git -C` from there)
        directory = os.path.join(inner.directory, directory) if directory else inner.directory
    refusal = facts.refusal
    if inner.from_input:  # what xargs adds from its input: deny patterns see the command with arguments
        aliases.append(f"{facts.match_text} ...")
        if not record(os.path.basename(inner.words[0])).opens_no_files or is_wrapper(inner.words[0]):
            refusal = refusal or (f"xargs runs {inner.words[0]} with arguments it reads from its input, which the "
                                  "policy cannot see")  # fmt: skip
    return CommandFacts(
        facts.match_text,
        tuple(dict.fromkeys(paths)),
        directory=directory,
        changes_directory=facts.changes_directory,  # only a builtin moves the shell (`builtins` above)
        aliases=tuple(aliases),
        environment=(*inner.environment, *inner.unset, *facts.environment),
        shell_variables=facts.shell_variables,
        refusal=refusal,
    )


def _program(words: Sequence[str], *, builtins: bool) -> CommandFacts:
    facts = _analyze(words, builtins=builtins)
    program = os.path.basename(words[0])
    if program != words[0] and program:
        plain = _analyze([program, *words[1:]], builtins=False).match_text
        return CommandFacts(facts.match_text, facts.paths, facts.directory, aliases=(plain,))  # a path: no builtin
    return facts


def _analyze(words: Sequence[str], *, builtins: bool) -> CommandFacts:
    program = os.path.basename(words[0])
    args = list(words[1:])
    if record(program).opens_no_files:
        return CommandFacts(shlex.join(words))  # their arguments are text (`echo done: /`), never opened
    if program in ("cd", "pushd") and words[0] == program and builtins:  # `/usr/bin/cd` moves no shell
        return _cd(words)
    if program == "popd" and words[0] == program and builtins:  # back to a directory the script was already in
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
