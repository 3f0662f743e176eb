"""git, read as git's parse-options reads it. Global options are dropped before matching (`git --no-pager
push` is `git push` to a `git push*` deny rule) and `git -C DIR` is the directory the command runs in;
subcommands that create repositories, run programs or serve the repository are refused, as are options
whose value is a command git runs. A command that prints what files hold (`show`, `diff`, `log -p`, a
blob id, a pathspec with magic or a glob) is judged as reading the whole worktree from git's store, unless
its options print only names and counts (`--stat`) or a pathspec after `--` limits it (`_git_output.py`)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

from ._facts import CommandFacts, PathArg, Refused
from ._generic import read_paths
from ._git_output import LOG_NAMES_ONLY, prints
from ._options import ends_with_value_letter, names_option, option_values
from ._programs import short_options

__all__ = ["read_git"]

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
_GIT_CONFIG_READS = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list", "-l", "get", "list"})
_GIT_CONFIG_FLAGS = frozenset({"--show-origin", "--show-scope", "--local", "--null", "-z", "--name-only",
                               "--includes", "--no-includes", "--bool", "--int", "--path"})  # fmt: skip
_GIT_REMOTE_READS = frozenset({"-v", "--verbose", "show", "get-url"})


def read_git(words: Sequence[str]) -> CommandFacts:
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
            if names_option(arg, option):
                raise Refused(f"git {sub} {option} runs a program")
    paths = read_paths("git-" + sub, rest)
    paths += option_values(rest, {"--output-directory": True,
                                   "-o": sub in ("format-patch", "archive", "mailsplit")})  # fmt: skip
    operands = _git_operands(rest)
    if sub == "bundle" and operands[:1] == ["create"] and len(operands) > 1:  # `create -q FILE`: the file
        paths.append(PathArg(operands[1], write=True, certain=True))
    if sub == "mailinfo":  # `git mailinfo MSG PATCH` writes both
        paths += [PathArg(a, write=True, certain=True) for a in operands]
    if sub in ("mv", "rm"):  # git moves or deletes what it names, untracked files in a directory too: as mv, rm
        paths += read_paths(sub, ["--", *operands])  # operands only: `-/../src` is a path here
    # `HEAD:src/secret/key`, `:src/secret/key` (the index), `:0:x`, `HEAD^{/:}:x`: a file's content by a
    # name the policy cannot resolve to one path
    names_content = any(":" in a and not re.search(r"\s", a) for a in operands)
    for arg in rest:
        if ":" in arg[1:] and not arg.startswith("-"):
            paths.append(PathArg(arg.split(":", 1)[1], certain=True, may_write=False))
    printed = prints(sub, rest, icase="--icase-pathspecs" in args[:i])
    if printed is None:
        whole = _git_shows_contents(sub, rest) or _git_pathspec_reaches_anywhere(sub, rest)
    else:  # diff, show, log: by their options (`--stat` prints names, `-- PATH` limits a patch to PATH)
        whole = printed.pathspecs is None or (not printed.pathspecs and _git_pathspec_reaches_anywhere(sub, rest))
    if names_content or whole:
        # git shows what its object store holds for any path (a revision, a blob id, a pathspec's magic or
        # glob): it reads the whole worktree, and a read deny anywhere in it applies
        paths.append(PathArg(".", certain=True, may_write=False, stored=True))
    else:  # a path only filters what git prints (names, messages): a read deny below it does not apply
        paths = [p if p.write else PathArg(p.text, p.write, p.certain, False, p.may_write) for p in paths]
        # what the files at a pathspec held in any revision: read from the store, whole
        paths += [
            PathArg(spec, certain=True, may_write=False, stored=True)
            for spec in (printed.pathspecs if printed else None) or ()
        ]
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
            skip = not arg.startswith("--") and bool(ends_with_value_letter(arg, short_options("git")))
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
        return any(names_option(a, "--format") or (sub == "tag" and re.fullmatch(r"-n[0-9]*", a)) for a in rest)
    if sub in ("commit", "status", "add"):  # -v prints the staged diff; -p shows hunks to choose from
        return any(names_option(a, o) for a in rest for o in ("-v", "--verbose", "-p", "--patch", "--interactive",
                                                               "--dry-run", "-e", "--edit"))  # fmt: skip
    if sub not in ("whatchanged", "reflog", "shortlog", "show-branch"):
        return False
    if sub == "whatchanged":
        return True  # it always prints a diff summary
    options = (
        [a for a in rest[: rest.index("--")] if a.startswith("-")]
        if "--" in rest
        else [a for a in rest if a.startswith("-")]
    )
    return not all(re.fullmatch(r"-n?[0-9]+", a) or a.split("=", 1)[0] in LOG_NAMES_ONLY for a in options)


def _git_pathspec_reaches_anywhere(sub: str, rest: Sequence[str]) -> bool:
    """A pathspec with magic (`:(top)src/secret`, `:/x`) or a glob (`src/secre?/*`) names files git finds,
    not the text the policy sees. Where every operand is a pathspec (`git add`, `rm`, `checkout -- ...`),
    or after `--`, such a pathspec is judged as reaching the whole worktree."""
    pathspecs = rest[rest.index("--") + 1 :] if "--" in rest else []
    if sub in _GIT_PATHSPEC_ONLY:
        pathspecs = [a for a in rest if not a.startswith("-")]
    return any(a.startswith(":") or not _PLAIN.fullmatch(a) for a in pathspecs)


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
