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
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ._shell import ASSIGNMENT

__all__ = ["CommandFacts", "PathArg", "Refused", "analyze"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: Options whose value is written, for any program.
_OUTPUT_OPTIONS = frozenset({"--output", "--output-file", "--outfile", "--out-file", "--log-file", "--logfile"})
#: Programs that open no file their arguments name (the shell opens their redirections).
_NO_FILES = frozenset({"echo", "printf", "true", "false", ":", "pwd", "sleep", "date", "whoami", "id", "uname"})
#: Programs that write (create, change or delete) every operand.
_WRITES_OPERANDS = frozenset({"rm", "rmdir", "unlink", "touch", "mkdir", "mkfifo", "mknod", "tee", "truncate",
                              "shred", "mv", "rename"})  # fmt: skip
#: Programs whose first operand is not a path (a mode or an owner) and that write the rest.
_WRITES_AFTER_FIRST = frozenset({"chmod", "chown", "chgrp"})
#: Programs that write their last operand (the destination).
_WRITES_LAST = frozenset({"cp", "ln", "install", "rsync", "scp", "uniq", "split", "csplit"})
#: Programs that never read what is inside a directory they are given (`ls` lists names): a read deny
#: below a directory does not stop them from naming it.
_NAMES_ONLY = frozenset({"ls", "cat", "head", "tail", "wc", "stat", "file", "cd", "pushd", "dirname", "basename",
                         "realpath", "readlink", "test"})  # fmt: skip
#: Programs that never write the paths their arguments name (outputs they know, like `sort -o`, aside).
_READ_ONLY = _NAMES_ONLY | {"grep", "egrep", "fgrep", "rg", "diff", "cmp", "less", "more", "od", "xxd", "hexdump",
                            "strings", "md5sum", "sha1sum", "sha256sum", "sha512sum", "nl", "tac", "du", "tree",
                            "echo", "printf", "find", "sort"}  # fmt: skip
#: Programs whose `-o FILE` is an output file.
_DASH_O_OUTPUT = frozenset({"sort", "ld", "as", "cython", "shuf"})
#: C compilers: their options are words, not getopt letters (`-MF FILE`, `-Wl,-o,FILE`), read by `_compiler`.
_COMPILERS = frozenset({"cc", "gcc", "g++", "clang", "clang++", "c++"})
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
#: Short options that take a value, for programs read as getopt reads them: (letters whose value names a
#: file read, letters whose value is text, letters whose value is a file written). Keyed by program name
#: (git's subcommands share one set).
_SHORT_VALUES = {
    "git": ("FtO", "CcmnSGLUXMBAIlj", ""),
    "grep": ("f", "emABCdD", ""), "egrep": ("f", "emABCdD", ""), "fgrep": ("f", "emABCdD", ""),
    "sort": ("", "ktS", "oT"),
    "cp": ("", "S", "t"), "mv": ("", "S", "t"), "ln": ("", "S", "t"), "install": ("", "Smog", "t"),
    "cut": ("", "dfbc", ""), "shuf": ("", "ni", "o"), "head": ("", "cn", ""), "tail": ("", "cns", ""),
    "tar": ("X", "bHV", "f"),
    "curl": ("KT", "eHdubFwxyYzCEmPQrtUXA", "oDc"),
}  # fmt: skip
#: Programs whose `-t DIR` / `--target-directory=DIR` is where they write.
_TARGET_DIRECTORY = frozenset({"cp", "mv", "ln", "install"})
#: Options that make a common program run another program: refused whatever a rule says.
_EXEC_OPTIONS = {
    "find": ("-exec", "-execdir", "-ok", "-okdir"),
    "rsync": ("-e", "--rsh", "--rsync-path"),
    "tar": ("--to-command", "-I", "--use-compress-program", "--checkpoint-action", "--info-script",
            "--new-volume-script", "-F", "--rsh-command", "--rmt-command"),
    "sort": ("--compress-program",),
    "split": ("--filter",),
    "zip": ("-TT", "--unzip-command"),
    "install": ("--strip-program",),
}  # fmt: skip
#: curl options that write where the server decides (`-O`, `-J`), move its outputs, or read options from a file.
_CURL_REFUSED = ("-O", "--remote-name", "--remote-name-all", "-J", "--remote-header-name", "--output-dir", "-K",
                 "--config")  # fmt: skip
#: curl options whose value is a file it writes (besides `-o`).
_CURL_WRITES = (
    "--output",
    "--cookie-jar",
    "--dump-header",
    "--trace",
    "--trace-ascii",
    "--stderr",
    "--libcurl",
    "--etag-save",
    "--hsts",
    "--alt-svc",
)  # fmt: skip  (its short ones, -o -D -c, are in _SHORT_VALUES)
#: Programs that write into the directory they run in when given no output: the first file they write.
_DEFAULT_OUTPUT = {"split": "xaa", "csplit": "xx00"}
#: Options (any program) that take the names of the files to open from a file the policy never reads.
_NAMES_FROM_A_FILE = ("--files-from", "--files0-from", "--exclude-from", "--include-from")
#: Programs with `--files0-from` and no other long option it could be short for.
_FILES0_FROM = frozenset({"sort", "wc", "du"})
#: Programs that write the names their input holds (an archive's members, a patch's files), or read their
#: list of files from one: refused, except in the modes that only list or test.
_WRITES_WHAT_IT_READS = {
    "unzip": ("-l", "-t", "-v", "-Z", "-z"),
    "patch": ("--dry-run",),
    "cpio": ("-t", "--list"),
    "7z": (),
    "7za": (),
    "bsdtar": ("-t", "--list"),
}
#: tar options that extract, change where names resolve, read names from a file, or rewrite them.
_TAR_REFUSED = ("-x", "--extract", "--get", "-C", "--directory", "-T", "--files-from", "--transform", "--xform",
                "-P", "--absolute-names", "-K", "--starting-file", "-g", "--listed-incremental")  # fmt: skip
#: find's actions that write: `-delete` removes what it finds; `-fprint FILE` and friends write FILE.
_FIND_WRITES = ("-fprint", "-fprint0", "-fprintf", "-fls")

_GIT_HARMLESS_GLOBALS = frozenset({"--no-pager", "-P", "-p", "--paginate", "--no-replace-objects",
                                   "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs",
                                   "--icase-pathspecs", "--no-optional-locks", "--no-lazy-fetch",
                                   "--no-advice"})  # fmt: skip
#: Subcommands that create repositories (whose config is code git runs), run programs they are
#: given, or serve the repository: refused whatever a rule says.
_GIT_REFUSED = {
    **dict.fromkeys(("init", "clone", "submodule", "worktree"), "creates a repository inside the worktree"),
    **dict.fromkeys(("filter-branch", "difftool", "mergetool", "daemon", "instaweb", "send-email", "hook",
                     "credential", "credential-cache", "credential-store", "web--browse", "upload-pack",
                     "receive-pack", "upload-archive", "shell", "remote-ext", "remote-fd", "imap-send",
                     "cvsimport", "cvsserver", "cvsexportcommit", "svn", "p4", "archimport", "quiltimport"),
                    "runs programs or serves the repository"),
}  # fmt: skip
#: git options whose value is a command git runs, per subcommand ("*": any).
_GIT_EXEC_OPTIONS = {
    "*": ("--upload-pack", "--receive-pack", "--exec", "--ext-diff-cmd"),
    "rebase": ("-x", "--exec"),
    "grep": ("-O", "--open-files-in-pager"),
    "ls-remote": ("-u",),
    "fetch": (),
}
#: git subcommands that print what files hold (any file: a revision or blob id names it).
_GIT_CONTENT = frozenset({"show", "diff", "cat-file", "grep", "archive", "bundle", "fast-export", "format-patch",
                          "stash", "range-diff", "diff-tree", "diff-index", "diff-files", "blame", "annotate",
                          "difftool", "apply", "am", "notes", "rev-list", "verify-pack", "unpack-file", "merge-tree",
                          "request-pull", "checkout-index", "read-tree", "merge-file", "unpack-objects",
                          "show-index", "get-tar-commit-id", "update-index", "restore", "mktree", "commit-tree",
                          "fast-import", "hash-object"})  # fmt: skip
#: git subcommands whose operands are all pathspecs.
_GIT_PATHSPEC_ONLY = frozenset({"add", "rm", "mv", "restore", "clean", "ls-files", "check-ignore", "check-attr",
                                "update-index"})  # fmt: skip
_PLAIN = re.compile(r"[^*?\[]*")  # no glob characters
#: `git log` options that print only commit messages, names and the history's shape (any other may add diffs).
_GIT_LOG_NAMES_ONLY = frozenset({
    "--oneline", "--format", "--pretty", "-n", "--max-count", "--skip", "--since", "--after", "--until", "--before",
    "--author", "--committer", "--grep", "--all-match", "--invert-grep", "-i", "--regexp-ignore-case", "-E", "-F",
    "--merges", "--no-merges", "--min-parents", "--max-parents", "--first-parent", "--all", "--branches", "--tags",
    "--remotes", "--glob", "--exclude", "--graph", "--decorate", "--no-decorate", "--abbrev-commit",
    "--no-abbrev-commit", "--abbrev", "--date", "--reverse", "--topo-order", "--date-order", "--author-date-order",
    "--name-only", "--name-status", "--follow", "--no-walk", "--left-right", "--cherry-pick", "--boundary",
    "--simplify-by-decoration", "--full-history", "--ancestry-path", "--color", "--no-color", "--relative-date",
    "--parents", "--children", "--source", "--use-mailmap", "--no-patch", "-s", "-z", "--count", "-q", "--quiet",
    "--output",
})  # fmt: skip
_GIT_CONFIG_READS = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list", "-l", "get", "list"})
_GIT_CONFIG_FLAGS = frozenset({"--show-origin", "--show-scope", "--local", "--null", "-z", "--name-only",
                               "--includes", "--no-includes", "--bool", "--int", "--path"})  # fmt: skip
_GIT_REMOTE_READS = frozenset({"-v", "--verbose", "show", "get-url"})

_PYTEST_WRITES = frozenset({"--basetemp", "--junitxml", "--junit-xml", "--log-file", "--resultlog", "--result-log",
                            "--report-log", "--html", "--rootdir", "--debug"})  # fmt: skip
_PYTEST_REFUSED = {"--pastebin": "sends output to a pastebin service"}
_PYTEST_VALUE_FLAGS = frozenset("kmcoprWn")  # short options that take a value (the rest is flags)


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
    if program in _NO_FILES:
        return CommandFacts(shlex.join(words))  # their arguments are text (`echo done: /`), never opened
    if program in ("cd", "pushd") and words[0] == program:  # `/usr/bin/cd` is a program: it moves no shell
        return _cd(words)
    if program == "popd" and words[0] == program:  # back to a directory the script was already in
        return CommandFacts(shlex.join(words))
    if program == "git":
        return _git(words)
    if program in ("pytest", "py.test"):
        return _pytest(words, args)
    if program.startswith("python") and args[:2] == ["-m", "pytest"]:
        return _pytest(words, args[2:])
    if program in _COMPILERS:
        return CommandFacts(shlex.join(words), tuple(_compiler(program, args)))
    paths = _generic(program, args)
    if program == "curl":
        refused = next((o for o in _CURL_REFUSED if any(_names_option(a, o) for a in args)), None)
        if refused is not None:
            raise Refused(f"curl {refused} writes where the server decides or reads its options from a file")
        paths += _option_values(args, dict.fromkeys(_CURL_WRITES, True))
    if program in _DEFAULT_OUTPUT and len([a for a in args if not a.startswith("-")]) < 2:
        paths.append(PathArg(_DEFAULT_OUTPUT[program], write=True, certain=True))  # `split FILE` writes ./xaa
    if program in _READ_ONLY:
        listing = program == "ls" and any(_names_option(a, "-R") or _names_option(a, "--recursive") for a in args)
        whole = program not in _NAMES_ONLY or listing  # `ls -R` lists what every directory below holds
        paths = [PathArg(p.text, p.write, p.certain, whole, p.write) for p in paths]
    if _reads_cwd_whole(program, args):  # `grep -r x`, `rg x`, `ls -R`: the directory it runs in, whole
        paths.append(PathArg(".", certain=True, may_write=False))
    if _follows_links(program, args):
        paths = [dataclasses.replace(p, follows_links=True) if not p.write else p for p in paths]
    return CommandFacts(shlex.join(words), tuple(paths))


def _compiler(program: str, args: Sequence[str]) -> list[PathArg]:
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
                paths.append(_candidate(value))
        elif not arg.startswith("-") or arg == "-":
            paths.append(_candidate(arg))  # a source (or an object to link)
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


#: Options that make a recursive reader follow the symlinks it meets beneath (zip follows by default).
_FOLLOWS_LINKS = {
    "grep": ("-R", "--dereference-recursive"), "egrep": ("-R", "--dereference-recursive"),
    "fgrep": ("-R", "--dereference-recursive"), "rg": ("-L", "--follow"), "tar": ("-h", "--dereference"),
    "cp": ("-L", "--dereference"), "rsync": ("-L", "--copy-links", "-k", "--copy-dirlinks"),
    "du": ("-L", "--dereference"), "ls": ("-L", "--dereference"), "find": ("-L", "-follow"),
}  # fmt: skip


def _follows_links(program: str, args: Sequence[str]) -> bool:
    if program == "zip":
        return not any(_names_option(a, "-y") or _names_option(a, "--symlinks") for a in args)
    if program == "find":  # `-L` before the paths, `-follow` among the expressions
        return "-L" in args or "-follow" in args
    return any(_names_option(a, o) for a in args for o in _FOLLOWS_LINKS.get(program, ()))


def _reads_cwd_whole(program: str, args: Sequence[str]) -> bool:
    """A recursive reader given no directory reads the one it runs in (grep -r, rg and ag by default)."""
    operands = [a for a in args if not a.startswith("-")]
    if program in ("rg", "ag"):
        return len(operands) <= 1  # the pattern alone
    if program == "ls":
        return not operands and any(_names_option(a, "-R") or _names_option(a, "--recursive") for a in args)
    if program in ("grep", "egrep", "fgrep"):
        recursive = pattern_given = False
        operands = []
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
    return False


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


def names_path(candidate: PathArg, exists: bool) -> bool:
    """Whether a candidate is judged as a path: known to be one, holding a `/`, or existing."""
    text = candidate.text
    return bool(text) and (candidate.certain or "/" in text or text in (".", "..") or exists)


# --- programs ----------------------------------------------------------------------------------


def _cd(words: Sequence[str]) -> CommandFacts:
    operands = [w for w in words[1:] if w not in ("-P", "-L", "-e", "-@", "--")]
    if len(operands) != 1 or operands[0] == "-" or operands[0].startswith("-") or operands[0].startswith("+"):
        # `cd` alone goes to $HOME, `cd -` to $OLDPWD, `pushd +N` through the stack: places not on the page
        raise Refused(f"{words[0]} to a place the policy cannot name")
    target = operands[0]
    target_arg = PathArg(target, certain=True, recursive=False, may_write=False)
    return CommandFacts(shlex.join(words), (target_arg,), changes_directory=target)


def _git(words: Sequence[str]) -> CommandFacts:
    args = list(words[1:])
    directory: str | None = None
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("--version", "--help", "-h", "-v"):
        arg = args[i]
        if arg == "-C":
            if i + 1 >= len(args):
                raise Refused("git -C without a directory")
            directory = os.path.join(directory, args[i + 1]) if directory else args[i + 1]
            i += 2
            continue
        if arg not in _GIT_HARMLESS_GLOBALS:
            raise Refused(f"git {arg.split('=')[0]} changes git's configuration, repository or programs")
        i += 1
    sub = args[i] if i < len(args) else ""
    rest = args[i + 1 :]
    if sub in _GIT_REFUSED:
        raise Refused(f"git {sub} {_GIT_REFUSED[sub]}")
    if sub == "config" and not _git_config_reads(rest):
        raise Refused("git config writes git's configuration (only --get, --list and friends are judged)")
    if sub == "remote" and rest and rest[0] not in _GIT_REMOTE_READS:
        raise Refused(f"git remote {rest[0]} writes git's configuration")
    if sub == "bisect" and rest[:1] == ["run"]:
        raise Refused("git bisect run runs a program")
    for option in (*_GIT_EXEC_OPTIONS["*"], *_GIT_EXEC_OPTIONS.get(sub, ())):
        for arg in rest:
            if _names_option(arg, option):
                raise Refused(f"git {sub} {option} runs a program")
    paths = _generic("git-" + sub, rest)
    paths += _option_values(rest, {"--output-directory": True,
                                   "-o": sub in ("format-patch", "archive", "mailsplit")})  # fmt: skip
    operands = _git_operands(rest)
    if sub == "bundle" and operands[:1] == ["create"] and len(operands) > 1:  # `create -q FILE`: the file
        paths.append(PathArg(operands[1], write=True, certain=True))
    if sub == "mailinfo":  # `git mailinfo MSG PATCH` writes both
        paths += [PathArg(a, write=True, certain=True) for a in operands]
    if sub in ("mv", "rm"):  # git moves or deletes what it names, untracked files in a directory too: as mv, rm
        paths += _generic(sub, ["--", *operands])  # operands only: `-/../src` is a path here
    # `HEAD:src/secret/key`, `:src/secret/key` (the index), `:0:x`, `HEAD^{/:}:x`: a file's content by a
    # name the policy cannot resolve to one path
    names_content = any(":" in a and not re.search(r"\s", a) for a in operands)
    for arg in rest:
        if ":" in arg[1:] and not arg.startswith("-"):
            paths.append(PathArg(arg.split(":", 1)[1], certain=True, may_write=False))
    if names_content or _git_shows_contents(sub, rest) or _git_pathspec_reaches_anywhere(sub, rest):
        # git shows what its object store holds for any path (a revision, a blob id, a pathspec's magic or
        # glob): it reads the whole worktree, and a read deny anywhere in it applies
        paths.append(PathArg(".", certain=True, may_write=False, stored=True))
    else:  # a path only filters what git prints (names, messages): a read deny below it does not apply
        paths = [p if p.write else PathArg(p.text, p.write, p.certain, False, p.may_write) for p in paths]
    if directory is not None:
        paths.append(PathArg(directory, certain=True))
    return CommandFacts(shlex.join([words[0], *args[i:]]), tuple(dict.fromkeys(paths)), directory=directory)


def _git_operands(rest: Sequence[str]) -> list[str]:
    """git's operands: not options, not the value of a short option that takes one (`-m 'fix: x'`); after
    `--`, every word (`git rm -- -/../src/secret/key`)."""
    operands: list[str] = []
    skip = False
    for index, arg in enumerate(rest):
        if skip:
            skip = False
        elif arg == "--":
            return operands + list(rest[index + 1 :])
        elif arg.startswith("-") and len(arg) > 1:
            skip = not arg.startswith("--") and bool(_ends_with_value_letter(arg, _SHORT_VALUES["git"]))
        else:
            operands.append(arg)
    return operands


def _git_shows_contents(sub: str, rest: Sequence[str]) -> bool:
    """Whether the command prints what files hold. Which files, git decides from revisions, blob ids and
    pathspecs with magic (`:(icase)`) or globs (`src/secre?/key`): so it is judged as reading them all.
    `git log` prints only commit messages and names with the options listed; any other option may add
    diffs (`-p`, `-U1`, `--binary`, `--remerge-diff`, ...)."""
    if sub in _GIT_CONTENT:
        return True
    if sub == "checkout" and ("--" in rest or len(_git_operands(rest)) > 1):
        return True  # `git checkout REV -- PATH` copies a stored file wherever PATH says
    if sub in ("tag", "branch", "for-each-ref"):  # `--format=%(raw)` prints a tagged blob; `tag -n` its text
        return any(_names_option(a, "--format") or (sub == "tag" and re.fullmatch(r"-n[0-9]*", a)) for a in rest)
    if sub in ("commit", "status", "add"):  # -v prints the staged diff; -p shows hunks to choose from
        return any(_names_option(a, o) for a in rest for o in ("-v", "--verbose", "-p", "--patch", "--interactive",
                                                               "--dry-run", "-e", "--edit"))  # fmt: skip
    if sub not in ("log", "whatchanged", "reflog", "shortlog", "show-branch"):
        return False
    if sub == "whatchanged":
        return True  # it always prints a diff summary
    options = (
        [a for a in rest[: rest.index("--")] if a.startswith("-")]
        if "--" in rest
        else [a for a in rest if a.startswith("-")]
    )
    return not all(re.fullmatch(r"-n?[0-9]+", a) or a.split("=", 1)[0] in _GIT_LOG_NAMES_ONLY for a in options)


def _git_pathspec_reaches_anywhere(sub: str, rest: Sequence[str]) -> bool:
    """A pathspec with magic (`:(top)src/secret`, `:/x`) or a glob (`src/secre?/*`) names files git finds,
    not the text the policy sees. Where every operand is a pathspec (`git add`, `rm`, `checkout -- ...`),
    or after `--`, such a pathspec is judged as reaching the whole worktree."""
    pathspecs = rest[rest.index("--") + 1 :] if "--" in rest else []
    if sub in _GIT_PATHSPEC_ONLY:
        pathspecs = [a for a in rest if not a.startswith("-")]
    return any(a.startswith(":") or not _PLAIN.fullmatch(a) for a in pathspecs)


def _names_option(arg: str, option: str) -> bool:
    """`arg` sets `option`: exactly, with `=VALUE`, abbreviated (git's parse-options take any unambiguous
    prefix: `--upload-pa=`), or for a short option anywhere in a cluster (`-fx CMD` is `-f -x CMD`)."""
    if len(option) == 2:
        return arg.startswith("-") and not arg.startswith("--") and option[1] in arg[1:]
    name = arg.split("=", 1)[0]
    return arg == option or (name.startswith("--") and len(name) > 2 and option.startswith(name))


def _git_config_reads(rest: Sequence[str]) -> bool:
    operands = [a for a in rest if not a.startswith("-") and a not in ("get", "list")]
    options = [a for a in rest if a not in operands]
    reads = [a for a in options if a in _GIT_CONFIG_READS]
    others = [a for a in options if a not in _GIT_CONFIG_READS and a not in _GIT_CONFIG_FLAGS]
    if others or len(reads) > 1:
        return False
    if reads and reads[0] in ("--list", "-l", "list"):
        return not operands
    return len(operands) == 1 or (reads[:1] == ["--get-regexp"] and len(operands) <= 2)


def _pytest(words: Sequence[str], args: Sequence[str]) -> CommandFacts:
    paths = list(_generic("pytest", args))
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
                paths.append(_candidate(written, write=True))
    paths += _option_values(args, dict.fromkeys(_PYTEST_WRITES, True))
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


def _generic(program: str, args: Sequence[str]) -> list[PathArg]:
    """Path candidates of any program: operands, option values, `key=value` values, `@file`."""
    if program == "tar":
        _check_tar(args)
        if args and not args[0].startswith("-"):  # old style, `tar cf a.tar src`: a cluster without its dash
            args = [f"-{args[0]}", *args[1:]]  # (before the options that run programs are looked for: `tar tIf`)
    for option in _EXEC_OPTIONS.get(program, ()):
        if any(_names_option(a, option) for a in args):
            raise Refused(f"{program} {option} runs a program the policy cannot judge")
    for option in _NAMES_FROM_A_FILE:  # any program: spellings long enough to be no other option; GNU
        shortest = 3 if program in _FILES0_FROM else 8  # coreutils take any prefix: `sort --f=-` is it
        if any(len(a.split("=", 1)[0]) >= shortest and option.startswith(a.split("=", 1)[0]) for a in args):
            raise Refused(f"{program} {option} opens files named in a file the policy cannot read")
    if program == "find" and "-files0-from" in args:  # `find -files0-from F -delete`: F names what it deletes
        raise Refused("find -files0-from reads its starting points from a file the policy cannot read")
    if program in _WRITES_WHAT_IT_READS and not any(a in _WRITES_WHAT_IT_READS[program] for a in args):
        raise Refused(f"{program} writes the files its input names (only listing or testing is judged)")
    if program == "sed":
        _, files, in_place = _sed(args)
        return [_candidate(f, write=in_place, certain=True) for f in files]
    writes_operands = program in _WRITES_OPERANDS
    writes_operands = writes_operands or (program == "find" and "-delete" in args)
    operands: list[str] = []
    paths: list[PathArg] = []
    options_done = False
    letters = _SHORT_VALUES.get(program.split("-", 1)[0])
    takes_next = ""  # the value-taking letter a cluster ended with: the next argument is its value
    for arg in args:
        if takes_next:
            letter, takes_next = takes_next, ""
            if letters is not None and letter in letters[0]:
                paths.append(_candidate(arg))  # a file it reads; one it writes is found by _option_values
            continue
        if not options_done and arg == "--":
            options_done = True
            continue
        if not options_done and arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.partition("=")
            if eq:
                paths.append(_candidate(value, write=name in _OUTPUT_OPTIONS))
            elif not arg.startswith("--"):
                paths += _glued(program, arg) if len(arg) > 2 else []
                takes_next = _ends_with_value_letter(arg, letters)
            continue
        operands.append(arg)
        if "=" in arg:
            paths.append(_candidate(arg.split("=", 1)[1], write=program == "dd" and arg.startswith("of=")))
        if arg.startswith("@"):
            paths.append(_candidate(arg[1:]))
    for index, operand in enumerate(operands):
        if program in _WRITES_AFTER_FIRST and index == 0:
            continue  # a mode or an owner
        write = writes_operands or (program in _WRITES_AFTER_FIRST)
        write = write or (program in _WRITES_LAST and index == len(operands) - 1 and len(operands) > 1)
        paths.append(_candidate(operand, write=write, certain=write))
        if write and program in ("mv", "rename") and index < len(operands) - 1:
            paths.append(_candidate(operand))  # what is moved is read too: a name that may be read next
    if program == "zip" and operands:  # the archive, created or changed
        paths.append(_candidate(operands[0], write=True, certain=True))
    if program == "ln" and len(operands) == 1:  # `ln TARGET` makes ./basename(TARGET)
        paths.append(_candidate(os.path.basename(operands[0].rstrip("/")) or ".", write=True, certain=True))
    writes = dict.fromkeys(_OUTPUT_OPTIONS, True)
    if program in _DASH_O_OUTPUT:
        writes["-o"] = True
    if program in _TARGET_DIRECTORY:
        writes.update({"-t": True, "--target-directory": True})
    if program == "find":
        writes.update(dict.fromkeys(_FIND_WRITES, True))
    letters = _SHORT_VALUES.get(program)
    if letters is not None:  # options known to take a file they write (`sort -o`, `cp -t`, `tar -cf`)
        writes.update({f"-{letter}": True for letter in letters[2]})
    if program == "tar" and not _tar_creates(args):
        writes.pop("-f", None)  # listing an archive reads it
        paths += [PathArg(p.text, certain=True) for p in _option_values(args, {"-f": True, "--file": True})]
    paths += _option_values(args, writes)
    return list(dict.fromkeys(p for p in paths if p.text))


def _glued(program: str, arg: str) -> list[PathArg]:
    """The value glued into a short-option cluster (`-qFsrc/msg`: `-q -F src/msg`). For programs whose
    options are known, the cluster is read as getopt reads it: flags up to the first letter that takes
    a value, then the value; otherwise the text after the first letter is the candidate."""
    letters = _SHORT_VALUES.get(program.split("-", 1)[0])
    if letters is None:
        # Which letter takes a value is unknown: the text after the first one, and any later suffix that
        # holds a `/` (`-vC/etc` may be `-v -C /etc`), are all candidates.
        found = [_candidate(arg[2:], write=arg[:2] == "-o" and program in _DASH_O_OUTPUT)]
        found += [_candidate(arg[k:]) for k in range(3, len(arg)) if "/" in arg[k:]]
        return found
    paths, texts, writes = letters
    for index, letter in enumerate(arg[1:], start=2):
        if letter in paths or letter in writes:
            return [_candidate(arg[index:], write=letter in writes, certain=letter in writes)] if arg[index:] else []
        if letter in texts:
            return []  # a message, a count, a pattern: no path
    return []


def _ends_with_value_letter(arg: str, letters: tuple[str, str, str] | None) -> str:
    """The letter whose value is the next argument (`-d` of `cut -d /`), if the cluster ends with one."""
    if letters is None:
        return ""
    for index, letter in enumerate(arg[1:], start=2):
        if letter in letters[0] or letter in letters[1] or letter in letters[2]:
            return letter if index == len(arg) else ""
    return ""


def _option_values(args: Sequence[str], options: dict[str, bool]) -> list[PathArg]:
    """Values of `--opt VALUE` / `--opt=VALUE` / `-oVALUE` for the options given (True: written). A long
    option may be abbreviated (git's parse-options and argparse take any unambiguous prefix: `--outp`)."""
    found: list[PathArg] = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        for option, write in options.items():
            if not write:
                continue
            if len(option) > 2 and not option.startswith("--"):  # find's `-fprint FILE`: never abbreviated
                if arg == option and i + 1 < len(args):
                    found.append(_candidate(args[i + 1], write=True, certain=True))
            elif len(option) > 2:
                if len(name) > 2 and name.startswith("--") and option.startswith(name):
                    if eq:
                        found.append(_candidate(value, write=True, certain=True))
                    elif i + 1 < len(args):
                        found.append(_candidate(args[i + 1], write=True, certain=True))
            elif arg.startswith("-") and not arg.startswith("--") and option[1] in arg[1:]:
                # anywhere in a cluster (`sort -uo FILE`, `cp -vt DIR`): the rest of it, or the next argument
                rest = arg[arg.index(option[1], 1) + 1 :]
                if rest or i + 1 < len(args):
                    found.append(_candidate(rest or args[i + 1], write=True, certain=True))
    return found


def _candidate(text: str, *, write: bool = False, certain: bool = False) -> PathArg:
    """A path candidate. A `file:` URL names its path. Any other URL is judged as the local path it also
    spells: a program that takes no URLs opens `a://b/../../.git/config` as `a:/b/../../.git/config`."""
    if _URL.match(text) and text.lower().startswith("file://"):
        return PathArg(text[len("file://") :] or "/", write, certain=True)
    if text.lower().startswith("file:"):
        return PathArg(text[len("file:") :] or "/", write, certain=True)
    return PathArg(text, write, certain or write)


_SED_LONG = ("--expression", "--file", "--in-place", "--line-length", "--null-data", "--zero-terminated",
             "--separate", "--sandbox", "--debug", "--posix", "--regexp-extended", "--quiet", "--silent",
             "--unbuffered", "--follow-symlinks", "--binary", "--help", "--version")  # fmt: skip


def _check_tar(args: Sequence[str]) -> None:
    """tar is judged only creating or listing archives of the paths it is given: extracting writes the
    names the archive holds, and -C, -T, --transform, -P move or rewrite names the policy judged."""
    first = args[0] if args and not args[0].startswith("-") else ""  # old style: `tar xf a.tar`
    for arg in [f"-{first}", *args]:
        for option in _TAR_REFUSED:
            if _names_option(arg, option):
                raise Refused(f"tar {option} writes or reads names the policy cannot judge")
    spelled = [f"-{first}", *args[1:]] if first else list(args)
    archives = _option_values(spelled, {"-f": True, "--file": True})
    # `--force-local` would keep it local, but where it stands it may be a file name or an option's value
    # (`-- --force-local`, `-V --force-local`): a HOST:FILE archive is refused with or without it
    if any(":" in a.text.split("/", 1)[0] for a in archives):
        raise Refused("tar -f HOST:FILE is a remote archive reached through rsh")


def _tar_creates(args: Sequence[str]) -> bool:
    """Whether tar writes its archive: creating, adding to it, or deleting from it."""
    first = args[0] if args and not args[0].startswith("-") else ""
    return any(_names_option(a, o) for a in [f"-{first}", *args] for o in ("-c", "-r", "-u", "-A", "--create",
                                                                             "--append", "--update", "--catenate",
                                                                             "--concatenate", "--delete"))  # fmt: skip


def _sed(args: Sequence[str]) -> tuple[list[str], list[str], bool]:
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
