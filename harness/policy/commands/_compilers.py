"""The C compilers (cc, gcc, g++, clang, clang++, c++): their options are words, not getopt letters
(`-MF FILE`, `-Wl,-o,FILE`). What they read and write: `-o`/`-MF` outputs (glued or not), include and
library directories, the sources; with no `-o`, the default outputs in the directory they run in."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._facts import PathArg, Refused, candidate

__all__ = ["COMPILERS", "compiler_paths"]

#: C compilers: their options are words, not getopt letters (`-MF FILE`, `-Wl,-o,FILE`), read by `compiler_paths`.
COMPILERS = frozenset({"cc", "gcc", "g++", "clang", "clang++", "c++"})
#: Compiler options that run or load another program, pass options on to one, read options from a file,
#: or write files named after others: refused whatever a rule says.
_COMPILER_REFUSED = (
    "-wrapper",
    "-fplugin",
    "-B",
    "-specs",
    "--specs",
    "-Wl,",
    "-Wa,",
    "-Wp,",
    "-Xlinker",
    "-Xassembler",
    "-Xpreprocessor",
    "-Xclang",
    "-Xanalyzer",
    "-fdump-",
    "-save-temps",
    "-fprofile",
    "-fcallgraph-info",
    "-fstack-usage",
    "-flto-",
    "-aux-info",
    "--serialize-diagnostics",
    "-ftime-trace",
    "-fcrash-diagnostics-dir",
    "-fmodules-cache-path",
    "-fuse-ld",
    "--ld-path",
    "--gcc-toolchain",
    "--gcc-install-dir",
    "-ccc-",
    "@",
)  # fmt: skip  (clang runs -fuse-ld=PATH)
#: Compiler options whose value is the next word (or glued): written, read, or text.
_COMPILER_WRITES = ("-o", "-MF")
_COMPILER_READS = ("-include", "-imacros", "-isystem", "-idirafter", "-iquote", "-isysroot", "--sysroot", "-I",
                   "-L", "-iprefix", "-iwithprefix", "-iwithprefixbefore")  # fmt: skip
_COMPILER_TEXT = ("-MT", "-MQ", "-x", "-D", "-U", "-l", "-std", "-march", "-mtune", "-e", "-T", "-u", "-z", "-G",
                  "-arch", "-target", "--target")  # fmt: skip


def compiler_paths(program: str, args: Sequence[str]) -> list[PathArg]:
    """What a C compiler reads and writes: `-o`/`-MF` outputs (glued or not), include and library
    directories, the sources; with no `-o` it writes into the directory it runs in (`a.out`, `x.o`)."""
    paths: list[PathArg] = []
    sources: list[str] = []
    output = False
    i = 0
    while i < len(args):
        arg = args[i]
        refused = next((o for o in _COMPILER_REFUSED if arg.startswith(o)), None)
        if refused is not None:
            raise Refused(f"{program} {refused} runs another program, reads options from a file or writes files "
                          "the policy cannot name")  # fmt: skip
        option = next((o for o in (*_COMPILER_WRITES, *_COMPILER_READS, *_COMPILER_TEXT) if arg.startswith(o)), None)
        if option is not None:
            value = arg[len(option) :].removeprefix("=") if arg != option else None
            if value is None:
                if i + 1 >= len(args):
                    raise Refused(f"{program} {option} without its value")
                value, i = args[i + 1], i + 1
            if option in _COMPILER_WRITES:
                paths.append(PathArg(value, write=True, certain=True))
                output = output or option == "-o"
            elif option in _COMPILER_READS:
                paths.append(candidate(value))
        elif not arg.startswith("-") or arg == "-":
            paths.append(candidate(arg))  # a source (or an object to link)
            sources.append(arg)
        i += 1
    only_checks = any(
        a in ("-E", "-M", "-MM", "-fsyntax-only", "--version", "--help", "-dumpversion", "-dumpmachine")
        or a.startswith("-print-")
        for a in args
    )  # fmt: skip  (-v compiles)
    if not output and not only_checks:  # the default outputs, in the directory it runs in
        suffix = ".o" if "-c" in args else ".s" if "-S" in args else None
        names = [os.path.splitext(os.path.basename(s))[0] + suffix for s in sources] if suffix else ["a.out"]
        paths += [PathArg(name, write=True, certain=True) for name in names]
    return paths
