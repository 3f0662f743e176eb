"""One record per program the generic reader knows (see `_record.Program`). A program not listed here
is read as one the policy knows nothing of; git, sed, the C compilers and pytest have modules of their
own. To teach the policy a program: add its record here (and a verdict row in
tests/helpers/policy_verdicts.jsonl for each reading it changes)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._facts import PathArg, Refused, candidate
from ._options import names_option, option_values
from ._record import Program, ShortOptions
from ._sed import sed_paths
from ._tar import check_tar, tar_listing

__all__ = ["PROGRAMS", "program", "short_options"]

#: curl options that write where the server decides (`-O`, `-J`), move its outputs, or read options from a file.
_CURL_REFUSED = ("-O", "--remote-name", "--remote-name-all", "-J", "--remote-header-name", "--output-dir", "-K",
                 "--config")  # fmt: skip
#: curl options whose value is a file it writes (besides its short ones, `-o -D -c`).
_CURL_WRITES = ("--output", "--cookie-jar", "--dump-header", "--trace", "--trace-ascii", "--stderr", "--libcurl",
                "--etag-save", "--hsts", "--alt-svc")  # fmt: skip


#: curl's long options named above: curl takes an exact name first, and an abbreviation only when no other
#: option starts with it (`--output` is --output, never --output-dir; `--out` is refused by curl as ambiguous).
_CURL_EXACT = frozenset(o for o in (*_CURL_REFUSED, *_CURL_WRITES) if o.startswith("--"))


def _curl_sets(arg: str, option: str) -> bool:
    name = arg.split("=", 1)[0]
    if name in _CURL_EXACT and arg.startswith("--"):
        return name == option
    return names_option(arg, option)


def _curl(args: Sequence[str]) -> list[PathArg]:
    refused = next((o for o in _CURL_REFUSED if any(_curl_sets(a, o) for a in args)), None)
    if refused is not None:
        raise Refused(f"curl {refused} writes where the server decides or reads its options from a file")
    return option_values(args, dict.fromkeys(_CURL_WRITES, True))


def _zip_archive(operands: Sequence[str]) -> list[PathArg]:
    return [candidate(operands[0], write=True, certain=True)] if operands else []  # created or changed


def _ln_link(operands: Sequence[str]) -> list[PathArg]:
    if len(operands) == 1:  # `ln TARGET` makes ./basename(TARGET)
        return [candidate(os.path.basename(operands[0].rstrip("/")) or ".", write=True, certain=True)]
    return []


_NO_FILES = Program(opens_no_files=True)
_NAMES = Program(read_only="names")
_WHOLE = Program(read_only="whole")
_DELETES = Program(writes="operands")
_COPIES = ShortOptions(text="S", writes="t")
_GREP_OPTIONS = ShortOptions(reads="f", text="emABCdD")
_GREP = Program(read_only="whole", short_options=_GREP_OPTIONS, follows_links=("-R", "--dereference-recursive"))
_LISTS = ("-t", "--list")

PROGRAMS: dict[str, Program] = {
    # read by _git; its subcommands share these letters
    "git": Program(short_options=ShortOptions(reads="FtO", text="CcmnSGLUXMBAIlj")),
    **dict.fromkeys(("echo", "printf", "true", "false", ":", "pwd", "sleep", "date", "whoami", "id", "uname"),
                    _NO_FILES),
    **dict.fromkeys(("rm", "rmdir", "unlink", "touch", "mkdir", "mkfifo", "mknod", "tee", "truncate", "shred"),
                    _DELETES),
    "mv": Program(writes="operands", short_options=_COPIES, target_directory=True, reads_what_it_moves=True),
    "rename": Program(writes="operands", reads_what_it_moves=True),
    **dict.fromkeys(("chmod", "chown", "chgrp"), Program(writes="after_first")),  # a mode or an owner first
    "cp": Program(writes="last", short_options=_COPIES, target_directory=True, follows_links=("-L", "--dereference")),
    "ln": Program(writes="last", short_options=_COPIES, target_directory=True, operand_paths=_ln_link),
    "install": Program(writes="last", short_options=ShortOptions(text="Smog", writes="t"), target_directory=True,
                       runs_programs=("--strip-program",)),
    "rsync": Program(writes="last", runs_programs=("-e", "--rsh", "--rsync-path"),
                     follows_links=("-L", "--copy-links", "-k", "--copy-dirlinks")),
    **dict.fromkeys(("scp", "uniq"), Program(writes="last")),
    "split": Program(writes="last", runs_programs=("--filter",), default_output="xaa"),
    "csplit": Program(writes="last", default_output="xx00"),
    "ls": Program(read_only="names", follows_links=("-L", "--dereference")),
    **dict.fromkeys(("cat", "stat", "file", "cd", "pushd", "dirname", "basename", "realpath", "readlink", "test"),
                    _NAMES),
    "wc": Program(read_only="names", files0_from=True),
    "head": Program(read_only="names", short_options=ShortOptions(text="cn")),
    "tail": Program(read_only="names", short_options=ShortOptions(text="cns")),
    **dict.fromkeys(("grep", "egrep", "fgrep"), _GREP),
    "rg": Program(read_only="whole", follows_links=("-L", "--follow")),
    **dict.fromkeys(("diff", "cmp", "less", "more", "od", "xxd", "hexdump", "strings", "md5sum", "sha1sum",
                     "sha256sum", "sha512sum", "nl", "tac", "tree"), _WHOLE),
    "du": Program(read_only="whole", files0_from=True, follows_links=("-L", "--dereference")),
    "find": Program(read_only="whole", runs_programs=("-exec", "-execdir", "-ok", "-okdir"),
                    output_options=("-fprint", "-fprint0", "-fprintf", "-fls"), writes_operands_with="-delete",
                    refused_words=(("-files0-from", "reads its starting points from a file the policy cannot read"),)),
    "sort": Program(read_only="whole", short_options=ShortOptions(text="ktS", writes="oT"), dash_o_writes=True,
                    runs_programs=("--compress-program",), files0_from=True),
    "shuf": Program(short_options=ShortOptions(text="ni", writes="o"), dash_o_writes=True),
    **dict.fromkeys(("ld", "as", "cython"), Program(dash_o_writes=True)),
    "cut": Program(short_options=ShortOptions(text="dfbc")),
    "tar": Program(short_options=ShortOptions(reads="X", text="bHV", writes="f"), check=check_tar,
                   listing=tar_listing, follows_links=("-h", "--dereference"),
                   runs_programs=("--to-command", "-I", "--use-compress-program", "--checkpoint-action",
                                  "--info-script", "--new-volume-script", "-F", "--rsh-command", "--rmt-command")),
    "zip": Program(runs_programs=("-TT", "--unzip-command"), operand_paths=_zip_archive),
    "curl": Program(short_options=ShortOptions(reads="KT", text="eHdubFwxyYzCEmPQrtUXA", writes="oDc"), after=_curl),
    "sed": Program(own_reading=sed_paths),
    "dd": Program(writes_keys=("of=",)),
    "unzip": Program(lists_only=("-l", "-t", "-v", "-Z", "-z")),
    "patch": Program(lists_only=("--dry-run",)),
    "cpio": Program(lists_only=_LISTS),
    "bsdtar": Program(lists_only=_LISTS),
    **dict.fromkeys(("7z", "7za"), Program(lists_only=())),
}  # fmt: skip

_UNKNOWN = Program()


def program(name: str) -> Program:
    """The record of a program by its name (a program not listed is one the policy knows nothing of)."""
    return PROGRAMS.get(name, _UNKNOWN)


def short_options(name: str) -> ShortOptions | None:
    """Short options taking a value, for reading clusters (a `git-SUB` reading shares git's set)."""
    return program(name.split("-", 1)[0]).short_options
