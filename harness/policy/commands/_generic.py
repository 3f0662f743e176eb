"""The generic reader: any program's arguments, read through its record (`_programs.PROGRAMS`).

Every operand, every `--option=VALUE` or `key=VALUE` value, every `-xVALUE` glued value and every
`@file` is a path candidate, judged as a read unless the record says the program writes it; options
any program may have that name outputs (`--output`, `--log-file`) are writes; options that run another
program or take file names from a file the policy never reads are refused."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from ._facts import CommandFacts, PathArg, Refused, candidate
from ._options import ends_with_value_letter, glued, names_option, option_values
from ._programs import program as record
from ._programs import short_options
from ._recursion import follows_links, lists_recursively, reads_cwd_whole

__all__ = ["read_paths", "read_program"]

#: Options whose value is written, for any program.
OUTPUT_OPTIONS = frozenset({"--output", "--output-file", "--outfile", "--out-file", "--log-file", "--logfile"})
#: Options (any program) that take the names of the files to open from a file the policy never reads.
_NAMES_FROM_A_FILE = ("--files-from", "--files0-from", "--exclude-from", "--include-from")


def read_program(program: str, words: Sequence[str], args: Sequence[str]) -> CommandFacts:
    """The facts of a program read through its record: what its arguments name, and what it reads whole."""
    known = record(program)
    paths = read_paths(program, args)
    if known.after is not None:
        paths += known.after(args)
    if known.default_output and len([a for a in args if not a.startswith("-")]) < 2:
        paths.append(PathArg(known.default_output, write=True, certain=True))  # `split FILE` writes ./xaa
    if known.read_only:
        whole = known.read_only == "whole" or lists_recursively(program, args)
        paths = [PathArg(p.text, p.write, p.certain, whole, p.write) for p in paths]
    if reads_cwd_whole(program, args):  # `grep -r x`, `rg x`, `ls -R`: the directory it runs in, whole
        paths.append(PathArg(".", certain=True, may_write=False))
    if follows_links(program, args):
        paths = [dataclasses.replace(p, follows_links=True) if not p.write else p for p in paths]
    return CommandFacts(shlex.join(words), tuple(paths))


def read_paths(program: str, args: Sequence[str]) -> list[PathArg]:
    """Path candidates of any program: operands, option values, `key=value` values, `@file`."""
    known = record(program)
    if known.check is not None:
        args = known.check(args)
    for option in known.runs_programs:
        if any(names_option(a, option) for a in args):
            raise Refused(f"{program} {option} runs a program the policy cannot judge")
    for option in _NAMES_FROM_A_FILE:  # any program: spellings long enough to be no other option; GNU
        shortest = 3 if known.files0_from else 8  # coreutils take any prefix: `sort --f=-` is it
        if any(len(a.split("=", 1)[0]) >= shortest and option.startswith(a.split("=", 1)[0]) for a in args):
            raise Refused(f"{program} {option} opens files named in a file the policy cannot read")
    for word, why in known.refused_words:  # `find -files0-from F -delete`: F names what it deletes
        if word in args:
            raise Refused(f"{program} {word} {why}")
    if known.lists_only is not None and not any(a in known.lists_only for a in args):
        raise Refused(f"{program} writes the files its input names (only listing or testing is judged)")
    if known.own_reading is not None:
        return known.own_reading(args)
    writes_operands = known.writes == "operands"
    writes_operands = writes_operands or bool(known.writes_operands_with and known.writes_operands_with in args)
    operands: list[str] = []
    paths: list[PathArg] = []
    options_done = False
    letters = short_options(program)
    takes_next = ""  # the value-taking letter a cluster ended with: the next argument is its value
    for arg in args:
        if takes_next:
            letter, takes_next = takes_next, ""
            if letters is not None and letter in letters.reads:
                paths.append(candidate(arg))  # a file it reads; one it writes is found by option_values
            continue
        if not options_done and arg == "--":
            options_done = True
            continue
        if not options_done and arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.partition("=")
            if eq:
                paths.append(candidate(value, write=name in OUTPUT_OPTIONS))
            elif not arg.startswith("--"):
                paths += glued(arg, letters, dash_o_writes=known.dash_o_writes) if len(arg) > 2 else []
                takes_next = ends_with_value_letter(arg, letters)
            continue
        operands.append(arg)
        if "=" in arg:
            paths.append(candidate(arg.split("=", 1)[1], write=arg.startswith(known.writes_keys)))
        if arg.startswith("@"):
            paths.append(candidate(arg[1:]))
    for index, operand in enumerate(operands):
        if known.writes == "after_first" and index == 0:
            continue  # a mode or an owner
        write = writes_operands or known.writes == "after_first"
        write = write or (known.writes == "last" and index == len(operands) - 1 and len(operands) > 1)
        paths.append(candidate(operand, write=write, certain=write))
        if write and known.reads_what_it_moves and index < len(operands) - 1:
            paths.append(candidate(operand))  # what is moved is read too: a name that may be read next
    if known.operand_paths is not None:
        paths += known.operand_paths(operands)
    writes = dict.fromkeys(OUTPUT_OPTIONS, True)
    if known.dash_o_writes:
        writes["-o"] = True
    if known.target_directory:
        writes.update({"-t": True, "--target-directory": True})
    writes.update(dict.fromkeys(known.output_options, True))
    if known.short_options is not None:  # options known to take a file they write (`sort -o`, `cp -t`, `tar -cf`)
        writes.update({f"-{letter}": True for letter in known.short_options.writes})
    listed = known.listing(args) if known.listing is not None else None
    if listed is not None and known.short_options is not None:  # listing an archive reads it
        for letter in known.short_options.writes:
            writes.pop(f"-{letter}", None)
        paths += listed
    paths += option_values(args, writes)
    return list(dict.fromkeys(p for p in paths if p.text))
