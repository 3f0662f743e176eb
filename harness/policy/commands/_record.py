"""The record of one program: what it reads, what it writes, which options take paths and which make it
run something the policy cannot see. One record per program (`_programs.PROGRAMS`) is everything the
generic reader (`_generic`) knows of that program; programs read otherwise have modules of their own
(git, sed, the C compilers, pytest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ._facts import PathArg

__all__ = ["Program", "ShortOptions"]


@dataclass(frozen=True)
class ShortOptions:
    """A program's short options that take a value, as getopt reads them."""

    reads: str = ""  # letters whose value names a file it reads
    text: str = ""  # letters whose value is text (a pattern, a count, a message)
    writes: str = ""  # letters whose value names a file it writes


@dataclass(frozen=True)
class Program:
    """What one program does with the arguments it is given. The defaults are a program the policy knows
    nothing of: every argument that names a path is judged as a read."""

    #: Its arguments are text, never opened (`echo done: /`); the shell opens its redirections.
    opens_no_files: bool = False
    #: Which operands it writes (creates, changes or deletes): all, all but the first (a mode, an owner),
    #: or the last (the destination) when there are several.
    writes: Literal["", "operands", "after_first", "last"] = ""
    #: It never writes what its arguments name: "names" never reads inside a directory it is given (`ls`
    #: lists names: a read deny below the directory does not apply); "whole" reads a directory whole.
    read_only: Literal["", "names", "whole"] = ""
    #: Short options taking a value, read as getopt reads them.
    short_options: ShortOptions | None = None
    #: Its `-o FILE` is an output file.
    dash_o_writes: bool = False
    #: Its `-t DIR` / `--target-directory=DIR` is where it writes.
    target_directory: bool = False
    #: Options (any spelling) whose value names a file it writes, besides the ones any program has.
    output_options: tuple[str, ...] = ()
    #: Options that make it run another program: refused whatever a rule says.
    runs_programs: tuple[str, ...] = ()
    #: Options that make a recursive read of it follow the symlinks beneath.
    follows_links: tuple[str, ...] = ()
    #: The file it writes into the directory it runs in when given no output (`split FILE` writes ./xaa).
    default_output: str = ""
    #: It reads what it moves as well as writing it: a name that may be read next (`mv`).
    reads_what_it_moves: bool = False
    #: With this word among its arguments it writes its operands too (`find -delete`).
    writes_operands_with: str = ""
    #: Words that refuse it, exactly as given, each with why.
    refused_words: tuple[tuple[str, str], ...] = ()
    #: It writes the names its input holds (an archive's members, a patch's files): refused except in
    #: these modes, which only list or test. None: not such a program.
    lists_only: tuple[str, ...] | None = None
    #: It has `--files0-from` and no other long option that could be short for it (`sort --f=-` is it).
    files0_from: bool = False
    #: Its `KEY=FILE` operands with these keys name a file it writes (`dd of=FILE`).
    writes_keys: tuple[str, ...] = ()
    #: It reads its arguments its own way (sed: a script, then files): the paths they name.
    own_reading: Callable[[Sequence[str]], list[PathArg]] | None = None
    #: Refuses what cannot be judged and returns the arguments as read further (tar's old-style cluster).
    check: Callable[[Sequence[str]], Sequence[str]] | None = None
    #: Paths its operands name beyond its reads and writes (the archive `zip` creates, `ln TARGET`'s link).
    operand_paths: Callable[[Sequence[str]], list[PathArg]] | None = None
    #: When its write options only read (tar listing an archive): the paths they name, as reads.
    listing: Callable[[Sequence[str]], list[PathArg] | None] | None = None
    #: Refusals and writes judged after the generic reading (curl's own long options).
    after: Callable[[Sequence[str]], list[PathArg]] | None = None
