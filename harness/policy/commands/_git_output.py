"""What `git diff`, `git show` and `git log` print, from their options alone: names and counts only
(`--stat`, `--name-only`, `--name-status`, `--shortstat`, `--numstat`), what files hold at the paths a
pathspec after `--` names (`git diff HEAD -- src/a.txt`, `git log -p -- src/a.txt`), or anything.

Each reading holds only with options known to print no more: any other option (`-S` searches every file's
history, `--follow` and `--full-diff` reach beyond the pathspec, `--no-index` compares any two files, `-L`
prints a range of any file) makes the command print anything. `git show` prints a blob whole whatever its
options, and a tag may name a blob: it is read this way only for revisions that can only be commits (`HEAD`,
`X~1`, `X^`, `X^{commit}`), and so is `git diff REV -- PATH`, which compares a blob a tag names with PATH. A
pathspec with magic or a glob, or under `--icase-pathspecs`, names files git
finds, not the text the policy sees: the command may print anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NAMES", "Printed", "prints"]

#: Options that print names and counts instead of what files hold.
_SUMMARY = frozenset({"--stat", "--name-only", "--name-status", "--shortstat", "--numstat"})
_SUMMARY_VALUED = re.compile(r"--stat(-width|-name-width|-graph-width|-count)?=[0-9,]+")
#: Options that print a patch: only the pathspec's files, once a pathspec limits the command.
_PATCH = frozenset({"-p", "-u", "--patch", "--patch-with-stat", "--no-patch", "-s", "--color-words", "--word-diff",
                    "--function-context", "-W", "--unified"})  # fmt: skip
_PATCH_VALUED = re.compile(
    r"-U[0-9]+|--unified=[0-9]+|--inter-hunk-context=[0-9]+|--word-diff=(color|plain|porcelain|none)"
)
#: Options that change neither which files are compared nor how much of them is printed.
_HARMLESS = frozenset({
    "--cached", "--staged", "--merge-base", "-z", "--no-color", "--color", "--relative", "--no-renames", "-M",
    "--find-renames", "-R", "--exit-code", "--quiet", "-w", "--ignore-all-space", "-b", "--ignore-space-change",
    "--ignore-space-at-eol", "--ignore-blank-lines", "--ignore-cr-at-eol", "--minimal", "--patience", "--histogram",
    "--no-ext-diff", "--no-textconv", "--full-index", "--no-prefix", "--indent-heuristic", "--no-indent-heuristic",
    "-a", "--text", "--summary", "--compact-summary", "--abbrev",
})  # fmt: skip
_HARMLESS_VALUED = re.compile(r"(--color|--abbrev|--diff-algorithm|--relative|-M|--find-renames)=?[A-Za-z0-9%]*")
#: `git log` options that print only commit messages, names and the history's shape (any other may add diffs).
LOG_NAMES_ONLY = frozenset({
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
#: A revision that can only be a commit: `HEAD` or `@`, or any name peeled by `~N`, `^N` or `^{commit}`.
_COMMIT = re.compile(r"(HEAD|@|[^\s:]+?(\^\{commit\}|[~^][0-9]*))([~^][0-9]*)*")
_PLAIN = re.compile(r"[^*?\[]*")  # no glob characters


@dataclass(frozen=True)
class Printed:
    """What a command prints: anything (`pathspecs` None), names and counts (`pathspecs` empty), or what the
    files at these pathspecs hold."""

    pathspecs: tuple[str, ...] | None


ANYTHING = Printed(None)
NAMES = Printed(())


def prints(sub: str, rest: Sequence[str], *, icase: bool) -> Printed | None:
    """For `git diff`, `show` and `log` (`rest`: the words after the subcommand), what they print; None for any
    other subcommand. `icase`: `--icase-pathspecs` was given."""
    if sub not in ("diff", "show", "log"):
        return None
    split = list(rest).index("--") if "--" in rest else len(rest)
    before, pathspecs = list(rest[:split]), list(rest[split + 1 :])
    options = [a for a in before if a.startswith("-")]
    revisions = [a for a in before if not a.startswith("-")]  # read for show and diff, which walk no history
    log_like = sub in ("log", "show")
    if sub == "show" and not _commits(revisions):
        return ANYTHING  # a tag or a name may be a blob, which show prints whole
    if any(_is(a, _SUMMARY, _SUMMARY_VALUED) for a in options) and all(_names_only(a, log_like) for a in options):
        return NAMES
    if sub == "log" and all(_names_only(a, log_like) for a in options):
        return NAMES
    if "--" not in rest or not pathspecs or icase:
        return ANYTHING
    if any(not p or p.startswith(":") or not _PLAIN.fullmatch(p) for p in pathspecs):
        return ANYTHING  # git finds the files: a glob or magic
    if not all(_names_only(a, log_like, follows=False) or _is(a, _PATCH, _PATCH_VALUED) for a in options):
        return ANYTHING
    if sub == "diff" and not _commits(revisions):
        return ANYTHING  # `git diff TAG -- x` compares the blob a tag may name with x, printing both
    return Printed(tuple(pathspecs))


def _commits(revisions: Sequence[str]) -> bool:
    """Every revision (or each end of a range `A..B`, `A...B`; an empty end is HEAD) can only be a commit."""
    ends = [end for r in revisions for end in re.split(r"\.\.\.?", r)]
    return all(not end or _COMMIT.fullmatch(end) for end in ends)


def _names_only(option: str, log_like: bool, *, follows: bool = True) -> bool:
    """An option that prints no file's contents (for log and show, their history options too)."""
    if _is(option, _SUMMARY, _SUMMARY_VALUED) or _is(option, _HARMLESS, _HARMLESS_VALUED):
        return True
    if not log_like or (option == "--follow" and not follows):
        return False
    return bool(re.fullmatch(r"-n?[0-9]+", option)) or option.split("=", 1)[0] in LOG_NAMES_ONLY


def _is(option: str, names: frozenset[str], valued: re.Pattern[str]) -> bool:
    return option in names or valued.fullmatch(option) is not None
