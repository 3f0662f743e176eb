"""What a rule grants, request by request: tables of requests, the verdict and the reason a user relies on.

Each table is one class of request that mutation testing (issue 9) showed nothing would notice if a change
to the policy or the shell parser turned its refusal into an allow. They run in-process, in milliseconds,
and are the tests `make mutation` runs every mutant against (with the other policy tests).

The worktree: `src/a.txt`, `src/secret/key`, `src/pkg/secrets/k`, `src/.env`, `docs/r.md`, `.git/`,
symlinks `src/keylink` -> `secret/key`, `src/gitlink` -> `../.git`, `src/out` -> the directory above the
worktree, and a sibling directory `wt2/` beside it whose name starts with the worktree's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import Policy
from harness.config._config import HOST_SERVER_NAME as HOST
from harness.config._config import RuleConfig
from harness.policy._policy import Turn
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import (
    CAREFUL,
    OPEN,
    POLICIES,
    TOOLS,
    build_worktree,
    expect,
    judge,
    load_rows,
    policy_of,
)

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="worktree", scope="module")
def worktree_fixture(tmp_path_factory):
    """Shared by the module's tests, which only judge: none of them changes it."""
    return build_worktree(tmp_path_factory.mktemp("tables"))


@pytest.fixture(name="own_worktree")
def own_worktree_fixture(tmp_path):
    """For a test that changes the tree."""
    return build_worktree(tmp_path)


@pytest.fixture(name="careful", scope="module")
def careful_fixture(worktree):
    return policy_of(worktree, CAREFUL)


@pytest.fixture(name="tools", scope="module")
def tools_fixture(worktree):
    return policy_of(worktree, TOOLS)


@pytest.fixture(name="open_policy", scope="module")
def open_policy_fixture(worktree):
    return policy_of(worktree, OPEN)


# --- operators glued to words ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls;(rm -rf src)", "unmatched"),
        ("ls;>.git/config", "protected_path"),
        ("ls&&>.git/config", "protected_path"),
        ("(ls)>.git/config", "protected_path"),  # a subshell's redirection is judged too
        ("echo x > src/out.txt; rm -rf src", "unmatched"),  # the target ends at `;`: rm is judged
        ("echo x > src/out.txt rm -rf src", "allowed"),  # ... but here rm, -rf and src are echo's words
        ("git status > /dev/null > .git/config", "protected_path"),  # every redirection, not the first
        ("git status 2>/dev/null >docs/x", "unmatched"),
        ("ls >> docs/x", "unmatched"),  # each way of opening a file for writing is a write
        ("ls >| docs/x", "unmatched"),
        ("ls &> docs/x", "unmatched"),
        ("ls &>> docs/x", "unmatched"),
        ("ls >& docs/x", "unmatched"),
        ("ls <> docs/x", "unmatched"),
        ("ls 2> docs/x", "unmatched"),
        ("ls > src/x", "allowed"),
        ("ls < docs/r.md", "allowed"),  # `<` only reads
        ("cat < src/secret/key", "denied"),
        ("cat 0< src/secret/key", "denied"),
        ("ls >&2", "allowed"),  # duplicates an fd: no file
        ("ls 2>&1 >&-", "allowed"),
        ("ls <&0", "allowed"),
        ("ls <&x", "unparseable"),
        ("ls >", "unparseable"),
        ("ls > ;", "unparseable"),
        ("ls|>docs/x", "unmatched"),
        ("ls|rm -rf src", "unmatched"),
        ("ls||rm -rf src", "unmatched"),
        ("ls&rm -rf src", "unmatched"),
        ("ls&&rm -rf src", "unmatched"),
        ("ls|&rm -rf src", "unmatched"),
        ("ls\nrm -rf src", "unmatched"),
        ("ls\n\nls\n", "allowed"),
        ("ls &&\nls", "allowed"),
        ("ls;", "allowed"),
        ("ls &", "allowed"),
        ("; ls", "unparseable"),
        ("&& ls", "unparseable"),
        ("ls &&", "unparseable"),
        ("ls |", "unparseable"),
        ("(ls", "unparseable"),
        ("ls)", "unparseable"),
        ("( )", "unparseable"),
        ("(ls &&)", "unparseable"),
        ("(ls) ls", "unparseable"),  # a word after `)`
        ("ls (ls)", "unparseable"),  # `(` after a word: a function definition
        ("", "unparseable"),
        ("ls;;", "unparseable"),
        ("cat <<EOF", "unparseable"),
        ("cat <<<x", "unparseable"),
        ("cat <(ls)", "unparseable"),
        ("ls >(cat)", "unparseable"),
        ("((x=1))", "unparseable"),
    ],
)
def test_operators_end_words_wherever_they_are_glued(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- the quote state machine ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls '$HOME'", "allowed"),  # single quotes keep `$` literal
        ("ls '`id`'", "allowed"),
        ("ls '\\'", "allowed"),  # and a backslash
        ("ls '*' '?' '[a]' '{a,b}' '~'", "allowed"),
        ("ls '\"'", "allowed"),
        ('ls "\'"', "allowed"),
        ("ls 'a\"'", "allowed"),
        ("ls \"a b\"'c d'e", "allowed"),
        ('ls "$HOME"', "unparseable"),  # double quotes expand `$`, backquotes and backslashes
        ('ls "`id`"', "unparseable"),
        ('ls "a\\"b"', "unparseable"),
        ("ls 'a'$HOME", "unparseable"),  # quotes end: the expansion after them is unquoted
        ('ls "a"`id`', "unparseable"),
        ("ls $HOME", "unparseable"),
        ("ls `id`", "unparseable"),
        ("ls \\x", "unparseable"),  # an unquoted backslash
        ("ls a\\;rm", "unparseable"),
        ("ls *", "unparseable"),  # globs
        ("ls src/?", "unparseable"),
        ("ls [ab]", "unparseable"),
        ("ls {a,b}", "unparseable"),
        ("ls a}", "unparseable"),
        ("ls 'unterminated", "unparseable"),
        ('ls "unterminated', "unparseable"),
        ("ls \"a'b", "unparseable"),
        ("ls 'it''s'", "allowed"),
    ],
)
def test_quotes_keep_what_bash_keeps_literal_and_nothing_else(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("cat 'src/secret/key'", "denied"),  # quote removal before judging
        ('cat "src/secret"/key', "denied"),
        ("cat src/'secret'/\"key\"", "denied"),
        ("'rm' -rf src", "unmatched"),
        ("\"git\" 'push' origin", "denied"),
        ("'git' 'log' -1", "allowed"),  # the words are what rules match: `git log -1`
    ],
)
def test_quoted_words_are_judged_after_quote_removal(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- word starts and separators -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls >~/.bashrc", "unparseable"),  # a tilde at a word's start expands
        ("ls >&~", "unparseable"),
        ("ls ~", "unparseable"),
        ("ls a=~/x", "unparseable"),  # ... and after `=` or `:`
        ("ls a:~/x", "unparseable"),
        ("ls a~b", "allowed"),  # elsewhere it is a letter
        ("ls\t#x", "unparseable"),  # a comment after a tab
        ("ls #x", "unparseable"),
        ("#x", "unparseable"),
        ("ls a#b", "allowed"),  # `#` inside a word is a letter
        ("ls a#b;rm -rf src", "unmatched"),
        ("git push\torigin main", "denied"),  # a tab separates words as a space does
        ("git\tpush origin x", "denied"),
        ("git  log  -1", "allowed"),
        ("ls\x0bsrc", "unmatched"),  # a vertical tab does not: `ls\vsrc` is one word
        ("ls\u00a0src", "unmatched"),
    ],
)
def test_words_start_and_end_where_bash_says(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- unwrapping shells ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "outcome"),
    [
        (["bash", "check.sh", "git status"], "unmatched"),  # bash runs the script file check.sh
        (["bash", "-c", "git status"], "allowed"),
        (["/bin/bash", "-c", "git status"], "allowed"),
        (["/usr/bin/sh", "-c", "git status"], "allowed"),
        (["/usr/local/bin/dash", "-c", "git status"], "allowed"),
        (["/opt/bin/bash", "-c", "git status"], "unmatched"),
        (["bash", "-c", "bash -c 'sh -c \"git push origin x\"'"], "denied"),
        (["bash", "+c", "ls"], "unparseable"),
        (["bash", "-x", "-c", "ls"], "allowed"),
        (["bash", "-o", "pipefail", "-o", "errexit", "-c", "ls"], "allowed"),
        (["bash", "-oo", "pipefail", "nounset", "-c", "ls"], "allowed"),
        (["bash", "-o", "posix", "-c", "ls"], "unparseable"),
        (["bash", "-o"], "unparseable"),
        (["bash", "-c"], "unparseable"),
        (["bash", "--login", "-c", "ls"], "allowed"),
        (["bash", "--posix", "-c", "ls"], "unparseable"),
        (["bash", "-"], "unparseable"),
        (["bash", "x"], "unmatched"),
        (["bash", "-c", "ls", "$0"], "allowed"),
        (["bash", "-c", "bash -c " + "'bash -c \"ls\"'"], "allowed"),
    ],
)
def test_shells_are_unwrapped_only_where_bash_runs_the_script(careful, argv, outcome):
    expect(careful.judge_execute(argv), outcome)


def test_shells_nested_too_deep_are_refused(careful):
    verdict = expect(careful.judge_execute(_nest(10)), "unparseable")
    assert "nested" in verdict.reason["why"]
    expect(careful.judge_execute(_nest(7)), "allowed")


def _nest(depth: int) -> list[str]:
    """`bash -c` nested `depth` times around `ls`, each level quoted for the one around it."""
    import shlex

    script = "ls"
    for _ in range(depth):
        script = shlex.join(["bash", "-c", script])
    return ["bash", "-c", script]


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("pushd src && cat secret/key", "denied"),  # pushd moves the shell as cd does
        ("pushd src && popd && cat src/secret/key", "denied"),
        ("pushd docs && popd && cat secret/key", "allowed"),  # popd: back to where the script was
        ("cd src && cat secret/key", "denied"),
        ("cd src; cat secret/key", "denied"),  # the cd may have worked: judged from both places
        ("cd nope; cat src/secret/key", "denied"),
        ("cd src && (cd secret && cat key)", "denied"),
        ("(cd src) && cat secret/key", "allowed"),  # a subshell's cd stays in it
        ("cd src/out", "outside_worktree"),
        ("cd /tmp && ls", "outside_worktree"),
        ("cd ..", "outside_worktree"),
        ("cd", "unsafe_argument"),  # $HOME
        ("cd -", "unsafe_argument"),  # $OLDPWD
        ("pushd +1", "unsafe_argument"),
        ("cd src docs", "unsafe_argument"),
        ("cd -P src && cat secret/key", "denied"),
        ("cd -- src && cat secret/key", "denied"),
    ],
)
def test_where_commands_run_after_a_directory_change(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- raw-input aliases ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_call", "outcome"),
    [
        ({"kind": "execute", "rawInput": {"command": "ls", "workdir": "/etc"}}, "outside_worktree"),
        ({"kind": "execute", "rawInput": {"command": "ls", "cwd": "src/out"}}, "outside_worktree"),
        ({"kind": "execute", "rawInput": {"command": "ls", "workdir": "src"}}, "allowed"),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["push", "origin", "x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["status"]}}, "allowed"),
        ({"kind": "execute", "rawInput": {"command": ["git", "push", "origin", "x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {"cmd": "rm -rf src"}}, "unmatched"),
        ({"kind": "execute", "rawInput": {"cmd": ["bash", "-lc", "git push origin x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {}}, "no_target"),
        ({"kind": "execute"}, "no_target"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "destination": "docs/a.txt"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "target": "docs/a.txt"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"old_path": "docs/r.md", "new_path": "src/r.md"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"old_path": "src/a.txt", "new_path": "docs/a.md"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"from": "src/a.txt", "to": ".git/config"}}, "protected_path"),
        ({"kind": "move", "rawInput": {"src": "src/a.txt", "dst": "docs/a"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "dest_dir": "docs"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "destination": "src/b.txt"}}, "allowed"),
        ({"kind": "edit", "rawInput": {"notebook_path": "docs/n.ipynb"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"file_path": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"path": "src/../docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"paths": ["src/a.txt", "docs/n.md"]}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"output_file": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"filename": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"changes": {"src/a.txt": {}, "docs/n.md": {}}}}, "unmatched"),
        (
            {"kind": "edit", "rawInput": {"changes": {"src/a.txt": {"type": "update", "move_path": "docs/a"}}}},
            "unmatched",
        ),
        (
            {
                "kind": "edit",
                "rawInput": {"changes": {"src/a.txt": {"update": {"unified_diff": "", "move_path": None}}}},
            },
            "allowed",
        ),
        ({"kind": "edit", "content": [{"type": "diff", "path": "docs/n.md", "newText": "x"}]}, "unmatched"),
        (
            {"kind": "edit", "content": [{"type": "text", "text": "docs/n.md"}], "locations": [{"path": "src/a.txt"}]},
            "allowed",
        ),  # text content names nothing
        ({"kind": "edit", "content": [{"type": "text"}], "locations": [{"line": 3}]}, "no_target"),
        ({"kind": "edit", "locations": [{"path": "src/a.txt"}, {"path": "docs/r.md"}]}, "unmatched"),
        ({"kind": "edit", "rawInput": {}}, "no_target"),
        ({"kind": "delete", "locations": [{"path": "src/secret/key"}]}, "denied"),
        ({"kind": "read", "rawInput": {"file_path": "src/secret/key"}}, "denied"),
        ({"kind": "read", "rawInput": {"path": "src/keylink"}}, "denied"),  # a symlink to the secret
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, "allowed"),
        ({"kind": "search", "rawInput": {"pattern": "x", "file": "src/secret/key"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "folder": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "location": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "dir_path": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "directory": "/etc"}}, "outside_worktree"),
        ({"kind": "search", "rawInput": {"pattern": "x"}}, "denied"),  # no place: the worktree, secret and all
        ({"kind": "search", "rawInput": {"pattern": "x", "root_dir": 3}}, "no_target"),  # a place it cannot read
        ({"kind": "search", "rawInput": {"pattern": "x", "path": "docs"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com/repos"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"uri": "https://evil.example/x"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"host": "evil.example"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"url": "https://evil.example\\@api.github.com/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https://x@api.github.com/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https:api.github.com"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "api.github.com:443"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com%2e.evil/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https://API.GITHUB.COM/"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com.evil.example/"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com /"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {}}, "no_target"),
        ({"kind": "think"}, "no_permission_needed"),
        ({"kind": "other", "title": "anything"}, "unmatched"),
        ({"title": "no kind"}, "unmatched"),
    ],
)
def test_every_key_a_tool_call_names_a_place_under_is_judged(careful, tool_call, outcome):
    verdict = careful.judge_tool_call(tool_call)
    if outcome == "no_permission_needed":
        assert verdict.allowed and verdict.reason["kind"] == outcome
    else:
        expect(verdict, outcome)


# --- globs and paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "path", "outcome"),
    [
        (["src/**"], "src/a.txt", "allowed"),
        (["src/**"], "src", "allowed"),
        (["src/**"], "srcfoo/evil.py", "unmatched"),  # `src/**` is src and below, not a prefix
        (["src/**"], "docs/src/a", "unmatched"),
        (["**/*.py"], "a.py", "allowed"),  # `**/` matches no directory too
        (["**/*.py"], "lib/vendor/v.py", "allowed"),
        (["**/*.py"], "lib/vendor/v.pyc", "unmatched"),
        (["**/*.py"], "lib/vendor/v_py", "unmatched"),
        (["docs/*"], "docs/r.md", "allowed"),  # `*` stays in one directory
        (["docs/*"], "docs/a/b.md", "unmatched"),
        (["docs/*.md"], "docs/r.md", "allowed"),
        (["docs/*.md"], "docs/rmd", "unmatched"),
        (["docs/?.md"], "docs/r.md", "allowed"),
        (["docs/?.md"], "docs/ab.md", "unmatched"),
        (["docs/?.md"], "docs//.md", "unmatched"),
        (["*"], "README", "allowed"),
        (["*"], "docs/r.md", "unmatched"),
        (["**"], "docs/r.md", "allowed"),
        (["src/**/key"], "src/secret/key", "allowed"),
        (["src/**/key"], "src/key", "allowed"),
        (["src/**/key"], "src/secret/keys", "unmatched"),
        (["a**b"], "a/x/b", "allowed"),
        (["src/a.txt"], "src/a.txt", "allowed"),
        (["src/a.txt"], "src/a_txt", "unmatched"),  # a `.` in a pattern is a dot
        (["src/a+txt"], "src/aatxt", "unmatched"),
        (["src/(a)"], "src/(a)", "allowed"),
        (["src"], "src/a.txt", "unmatched"),
        (["docs/**", "src/**"], "src/a.txt", "allowed"),
    ],
)
def test_path_globs_grant_exactly_what_they_say(worktree, patterns, path, outcome):
    policy = policy_of(worktree, [{"id": "w", "kind": "write", "paths": patterns, "decision": "allow"}])
    expect(policy.judge_write(path), outcome)


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        ("src/a.txt", "allowed"),
        ("src/secret/key", "denied"),
        ("src/keylink", "denied"),  # a symlink is judged where it leads
        ("src/pkg/../secret/key", "denied"),
        ("src/secret", "denied"),  # the directory itself
        ("src", "denied"),  # holds the secret: reading it whole reaches it
        (".", "denied"),
        ("src/out/outside.txt", "outside_worktree"),
        ("../wt2/x", "outside_worktree"),  # a sibling whose name starts with the worktree's is outside
        ("/proc/self/environ", "proc"),
        ("/proc", "proc"),
        ("", "unparseable"),
        ("a\0b", "unparseable"),
    ],
)
def test_a_read_deny_holds_whatever_the_path_says(careful, path, outcome):
    expect(careful.judge_read(path), outcome)


def test_a_sibling_directory_named_like_the_worktree_is_outside(careful, worktree):
    sibling = f"{worktree}2/x"
    expect(careful.judge_read(sibling), "outside_worktree")
    expect(careful.judge_write(sibling), "outside_worktree")
    expect(careful.judge_execute(f"cat {sibling}"), "outside_worktree")
    expect(careful.judge_read(f"{worktree}/src/a.txt"), "allowed")  # absolute inside is inside


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        (".git", "protected_path"),  # the directory, not only what is in it
        (".git/hooks", "protected_path"),
        (".GIT/config", "protected_path"),  # case-insensitive file systems
        ("src/gitlink/config", "protected_path"),  # a protected file reached through a symlink
        ("src/gitlink", "allowed"),  # the symlink itself is... judged where it leads
        ("src/x/.git", "protected_path"),  # a nested repository's .git at any depth
        ("src/x/.git/hooks/pre-commit", "protected_path"),
        (".gitignore", "allowed"),
        ("src/.gitx", "allowed"),
        ("lib", "protected_path"),  # holds a protected glob's files
        ("lib/vendor", "protected_path"),
        ("lib/vendor/v.py", "protected_path"),
        ("libx/a", "allowed"),
        ("loop.yaml", "protected_path"),  # the run's config
        ("transcripts/t.jsonl", "protected_path"),  # inside a protected directory
        (".", "protected_path"),
        ("docs/../.git/config", "protected_path"),
    ],
)
def test_protected_paths_stay_protected_however_they_are_named(worktree, path, outcome):
    if path == "src/gitlink":
        outcome = "protected_path"  # it resolves to .git
    policy = policy_of(
        worktree,
        [{"id": "all", "kind": "write", "paths": ["**"], "decision": "allow"}],
        protected_globs=["lib/vendor/**"],
        protected_files=[worktree / "loop.yaml", worktree / "transcripts"],
    )
    expect(policy.judge_write(path), outcome)


# --- deleting or moving a directory judges everything beneath it ----------------------------------


@pytest.mark.parametrize(
    ("tool_call", "outcome"),
    [
        ({"kind": "delete", "locations": [{"path": "src"}]}, "denied"),  # src/pkg/secrets/ is beneath
        ({"kind": "delete", "locations": [{"path": "src/pkg"}]}, "denied"),
        ({"kind": "move", "rawInput": {"source": "src/pkg", "destination": "moved"}}, "denied"),
        ({"kind": "move", "rawInput": {"source": "src", "destination": "elsewhere"}}, "denied"),
        ({"kind": "delete", "locations": [{"path": "docs"}]}, "allowed"),
        ({"kind": "delete", "locations": [{"path": "src/a.txt"}]}, "allowed"),
        ({"kind": "delete", "locations": [{"path": "lib"}]}, "allowed"),
    ],
)
def test_a_directory_is_deleted_or_moved_with_everything_beneath_it(open_policy, tool_call, outcome):
    verdict = expect(open_policy.judge_tool_call(tool_call), outcome)
    if outcome == "denied":
        assert verdict.reason["rule_id"] == "no-secrets"
        assert "/secrets/" in verdict.reason["target"] + "/"


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("rmdir src", "denied"),
        ("mv src/pkg docs/pkg", "denied"),
        ("mv docs lib/docs", "allowed"),
        ("truncate -s0 src/pkg/secrets/k", "denied"),
        ("grep -r TODO src", "denied"),  # reads src/.env and src/pkg/secrets/k
        ("grep -r TODO docs", "allowed"),
        ("grep TODO src/a.txt", "allowed"),
        ("ls src", "allowed"),  # lists names: reads nothing beneath
        ("ls -R src", "denied"),
    ],
)
def test_commands_on_a_directory_are_judged_against_what_it_holds(open_policy, command, outcome):
    expect(open_policy.judge_execute(["bash", "-c", command]), outcome)


def test_a_nested_repository_beneath_a_directory_is_never_deleted(own_worktree):
    worktree = own_worktree
    (worktree / "src" / "vendored" / ".git").mkdir(parents=True)
    policy = policy_of(worktree, [{"id": "all", "kind": "write", "paths": ["**"], "decision": "allow"}])
    verdict = expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "src"}]}), "protected_path")
    assert (verdict.rule_ids, dict(verdict.reason)) == (
        ("protected",),
        {"kind": "protected_path", "path": "src/vendored/.git", "in": "src"},
    )
    expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "docs"}]}), "allowed")


def test_a_symlink_beneath_a_deleted_directory_is_not_followed(own_worktree):
    """Deleting `src` removes the link `src/gitlink`, never the `.git` it points to."""
    worktree = own_worktree
    (worktree / "src" / "secret" / "key").unlink()
    policy = policy_of(worktree, [{"id": "all", "kind": "write", "paths": ["**"], "decision": "allow"}])
    expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "src"}]}), "allowed")


# --- exceptions are refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        ["ls"],
        ["cd"],
        ["git"],
        ["bash"],
        ["sed"],
        ["tar"],
        ["python"],
        [""],
        [],
        ["ls", 3],
        ["ls", None],
        [None],
        "",
        "   ",
        "\n",
    ],
    ids=repr,
)
def test_any_argv_gets_a_verdict_never_an_exception(careful, request_):
    verdict = careful.judge_execute(request_)
    assert verdict.allowed is (request_ == ["ls"]), verdict


@pytest.mark.parametrize(
    "tool_call",
    [
        {"kind": "edit", "content": [{"type": "text", "text": "x"}]},
        {"kind": "edit", "content": ["x", None, 3]},
        {"kind": "edit", "locations": ["src/a.txt", None]},
        {"kind": "edit", "locations": [{"path": None}]},
        {"kind": "edit", "rawInput": "src/a.txt"},
        {"kind": "edit", "rawInput": {"path": 3}},
        {"kind": "edit", "rawInput": {"paths": [3, None]}},
        {"kind": "edit", "rawInput": {"changes": ["src/a.txt"]}},
        {"kind": "edit", "rawInput": {"path": "\0"}},
        {"kind": "execute", "rawInput": {"command": 3}},
        {"kind": "execute", "rawInput": {"command": ["ls", {"x": 1}]}},
        {"kind": "execute", "rawInput": {"command": "ls", "cwd": 3}},
        {"kind": "execute", "rawInput": {"command": "ls", "args": "src"}},
        {"kind": "fetch", "rawInput": {"url": 3}},
        {"kind": "fetch", "rawInput": {"url": "http://[::1"}},
        {"kind": ["edit"]},
        {"kind": None},
    ],
    ids=repr,
)
def test_any_tool_call_gets_a_verdict_never_an_exception(careful, tool_call):
    assert not careful.judge_tool_call(tool_call).allowed


def test_text_content_beside_a_path_is_no_obstacle(careful):
    call = {"kind": "edit", "content": [{"type": "text", "text": "x"}], "locations": [{"path": "src/a.txt"}]}
    expect(careful.judge_tool_call(call), "allowed")


def test_a_request_the_policy_trips_over_is_refused_with_the_cause(careful):
    verdict = expect(careful.judge_execute("ls", cwd="\0"), "unparseable")
    assert "ValueError" in verdict.reason["why"]
    verdict = expect(careful.judge_tool_call({"kind": "execute", "rawInput": {"command": "ls", "cwd": 3}}),
                     "unparseable")  # fmt: skip
    assert "could not be judged" in verdict.reason["why"]


# --- the turn, the answers and the interactive path -----------------------------------------------

OPTIONS = [("a1", "allow_once"), ("a2", "allow_always"), ("r1", "reject_once"), ("r2", "reject_always")]


@pytest.mark.parametrize(
    ("session", "turn", "outcome"),
    [
        ("s1", Turn("s1", frozenset({"s1"})), "allowed"),
        ("s1", Turn(None, frozenset({"s1"})), "outside_turn"),
        ("s2", Turn("s1", frozenset({"s1", "s2"})), "outside_turn"),
        ("s3", Turn("s1", frozenset({"s1"})), "unknown_session"),
        ("s1", Turn(None, frozenset()), "unknown_session"),
    ],
)
def test_only_the_running_turns_session_may_act(careful, session, turn, outcome):
    expect(careful.read(session, "src/a.txt", turn), outcome)
    expect(careful.write(session, "src/a.txt", turn), outcome)
    expect(careful.terminal(session, "ls", [], {}, None, turn), outcome)
    for owner in (session, None):  # a gate only: no rule decides it; a released terminal's id is no way past it
        use = careful.terminal_use(session, owner, turn)
        assert (use.allowed, use.reason["kind"]) == ((True, "allowed") if outcome == "allowed" else (False, outcome))
    verdict = careful.permission(session, {"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS, turn)
    expect(verdict, outcome)
    assert verdict.option_id == ("a1" if outcome == "allowed" else "r1")


def test_a_terminal_belongs_to_the_session_that_made_it(careful):
    turn = Turn("s1", frozenset({"s1", "s2"}))
    assert careful.terminal_use("s1", "s2", turn).reason == {"kind": "not_its_terminal", "session": "s1", "owner": "s2"}
    assert careful.terminal_use("s1", "s2", turn).allowed is False
    assert careful.terminal_use("s1", "s1", turn).allowed is True


@pytest.mark.parametrize(
    ("options", "option_id", "outcome"),
    [
        (OPTIONS, "a1", "allowed"),
        ([("a2", "allow_always"), ("r1", "reject_once")], "r1", "no_allow_once_option"),  # never allow_always
        ([("a2", "allow_always"), ("r2", "reject_always")], "r2", "no_allow_once_option"),
        ([("a2", "allow_always")], None, "no_allow_once_option"),  # answered `cancelled`
        ([("r2", "reject_always"), ("a1", "allow_once")], "a1", "allowed"),
    ],
)
def test_an_allow_is_answered_once_and_never_always(careful, options, option_id, outcome):
    turn = Turn("s1", frozenset({"s1"}))
    verdict = expect(careful.permission("s1", {"kind": "read", "locations": [{"path": "src/a.txt"}]}, options, turn),
                     outcome)  # fmt: skip
    assert verdict.option_id == option_id


@pytest.mark.parametrize(
    ("options", "option_id"),
    [(OPTIONS, "r1"), ([("r2", "reject_always"), ("r1", "reject_once")], "r1"), ([("r2", "reject_always")], "r2"),
     ([("a1", "allow_once")], None)],
)  # fmt: skip
def test_a_refusal_is_answered_with_a_reject_option(careful, options, option_id):
    turn = Turn("s1", frozenset({"s1"}))
    verdict = expect(careful.permission("s1", {"kind": "read", "locations": [{"path": "src/secret/key"}]}, options,
                                        turn), "denied")  # fmt: skip
    assert verdict.option_id == option_id


@pytest.mark.parametrize(
    ("title", "kind", "tools", "outcome"),
    [
        (f"mcp__{HOST}__open_proposal", "other", {"open_proposal"}, "host_tool"),
        (f"mcp__{HOST}__open_proposal", None, {"open_proposal"}, "host_tool"),
        (f"mcp__{HOST}__open_proposal", "other", {"comment"}, "unmatched"),  # not the role's tool
        (f"mcp__{HOST}__open_proposal", "execute", {"open_proposal"}, "no_target"),  # a kind of its own
        ("mcp__other__open_proposal", "other", {"open_proposal"}, "unmatched"),
        (f"xmcp__{HOST}__open_proposal", "other", {"open_proposal"}, "unmatched"),
        (f"mcp__{HOST}__open_proposal!", "other", {"open_proposal"}, "unmatched"),
        (f"mcp__{HOST}x__open_proposal", "other", {"open_proposal"}, "unmatched"),
    ],
)
def test_host_tools_are_what_the_role_allows(careful, title, kind, tools, outcome):
    turn = Turn("s1", frozenset({"s1"}), frozenset(tools))
    verdict = careful.permission("s1", {"title": title, "kind": kind}, OPTIONS, turn)
    if outcome == "host_tool":
        assert verdict.allowed and verdict.reason["kind"] == "host_tool" and verdict.option_id == "a1"
    else:
        expect(verdict, outcome)


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({}, "allowed"),
        ({"LANG": "C", "LC_ALL": "C", "TERM": "dumb", "NO_COLOR": "1", "TZ": "UTC", "CLAUDECODE": "1"}, "allowed"),
        ({"LD_PRELOAD": "x"}, "unsafe_env"),
        ({"PATH": "/tmp"}, "unsafe_env"),
        ({"HOME": "/tmp"}, "unsafe_env"),
        ({"BASH_ENV": "x"}, "unsafe_env"),
        ({"LANGX": "x"}, "unsafe_env"),
        ({"XLANG": "x"}, "unsafe_env"),
        ({"lc_all": "C"}, "unsafe_env"),
        ({"LC_": "C"}, "unsafe_env"),
    ],
)
def test_a_terminal_sets_only_harmless_variables(careful, env, outcome):
    verdict = expect(careful.terminal("s1", "ls", ["src"], env, None, Turn("s1", frozenset({"s1"}))), outcome)
    if outcome == "unsafe_env":
        assert verdict.reason["names"] == sorted(env)


@pytest.mark.parametrize(
    ("command", "args", "cwd", "argv", "workdir"),
    [
        ("ls", ["src"], None, ("ls", "src"), "."),
        ("ls", None, "src", ("ls",), "src"),
        ("ls src && git status", None, None, ("SHELL", "-c", "ls src && git status"), "."),
        ("ls src", [], "docs", ("SHELL", "-c", "ls src"), "docs"),
        ("ls", ["src && git push origin x"], None, ("ls", "src && git push origin x"), "."),  # one argument
        ("ls", ["-la"], "src/..", ("ls", "-la"), "."),
        ("ls", ["-la"], "src/gitlink/../docs", ("ls", "-la"), "docs"),  # where the link really leads
    ],
)
def test_a_terminal_runs_exactly_what_was_judged(careful, worktree, command, args, cwd, argv, workdir):
    from harness.policy._policy import SHELL

    verdict = expect(careful.terminal("s1", command, args, {}, cwd, Turn("s1", frozenset({"s1"}))), "allowed")
    assert verdict.argv == tuple(SHELL if w == "SHELL" else w for w in argv)
    assert verdict.workdir == os.path.normpath(os.path.join(str(worktree), workdir))


@pytest.mark.parametrize(
    ("command", "args", "outcome"),
    [
        ("ls src; git push origin x", None, "denied"),  # a string with shell characters is a script
        ("ls\tsrc", None, "unmatched"),  # `ls\tsrc` with no args is a program of that name... judged as a script
        ("git push origin x", [], "denied"),
        ("ls > docs/x", None, "unmatched"),
        ("ls", ["-la"], "allowed"),
    ],
)
def test_a_terminal_command_string_is_judged_as_the_shell_reads_it(careful, command, args, outcome):
    if command == "ls\tsrc":
        outcome = "allowed"  # a tab separates: `ls src`
    expect(careful.terminal("s1", command, args, {}, None, Turn("s1", frozenset({"s1"}))), outcome)


def test_the_interactive_path_reaches_only_what_a_person_approved(worktree):
    policy = Policy([], worktree)
    turn = Turn("s1", frozenset({"s1"}))
    ask = policy.permission("s1", {"kind": "edit", "locations": [{"path": "docs/r.md"}]}, OPTIONS, turn)
    assert ask.ask and not ask.allowed and ask.reason["kind"] == "interactive"
    approved = policy.approvals({"kind": "edit", "locations": [{"path": "docs/r.md"}]})
    assert approved == {("write", "docs/r.md")}
    with_approval = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.write("s1", "docs/r.md", with_approval), "allowed").reason["kind"] == "interactive"
    expect(policy.write("s1", "docs/other.md", with_approval), "not_approved")
    expect(policy.read("s1", "docs/r.md", with_approval), "not_approved")  # a write approval is no read
    expect(policy.write("s1", ".git/config", Turn("s1", frozenset({"s1"}), approvals={("write", ".git/config")})),
           "protected_path")  # fmt: skip
    expect(policy.write("s1", "../outside.txt", with_approval), "outside_worktree")


@pytest.mark.parametrize(
    ("tool_call", "approved"),
    [
        ({"kind": "read", "rawInput": {"file_path": "src/../docs/r.md"}}, {("read", "docs/r.md")}),
        ({"kind": "read", "rawInput": {"file_path": "../outside.txt"}}, set()),
        ({"kind": "execute", "rawInput": {"command": "ls src && git status"}},
         {("execute", "ls src"), ("execute", "git status")}),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["-C", "src", "status"]}},
         {("execute", "git status")}),
        ({"kind": "execute", "rawInput": {"command": ["bash", "-c", "ls $HOME"]}}, set()),
        ({"kind": "execute", "rawInput": {"command": "git -c x=y status"}}, set()),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com"}}, set()),
        ({"kind": "think"}, set()),
    ],
)  # fmt: skip
def test_what_a_persons_allow_lets_the_agent_reach(worktree, tool_call, approved):
    assert Policy([], worktree).approvals(tool_call) == approved


def test_an_interactive_terminal_runs_only_the_approved_command(worktree):
    policy = Policy([], worktree)
    approved = policy.approvals({"kind": "execute", "rawInput": {"command": "ls src"}})
    turn = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.terminal("s1", "ls", ["src"], {}, None, turn), "allowed").argv == ("ls", "src")
    expect(policy.terminal("s1", "ls", ["docs"], {}, None, turn), "not_approved")
    expect(policy.terminal("s1", "ls src > ../x", None, {}, None, turn), "outside_worktree")


def test_the_search_path_loses_every_directory_an_agent_could_plant_a_program_in(careful, worktree):
    entries = ["/usr/bin", "bin", str(worktree / "src" / "bin"), str(worktree / "docs"), "/bin", ""]
    assert careful.search_path(os.pathsep.join(entries)).split(os.pathsep) == ["/usr/bin", str(worktree / "docs"),
                                                                               "/bin"]  # fmt: skip


# --- the recorded table ---------------------------------------------------------------------------

_ROWS = load_rows(Path(__file__).parents[1] / "helpers" / "policy_verdicts.jsonl")


@pytest.fixture(name="policies", scope="module")
def policies_fixture(worktree):
    return {name: policy_of(worktree, rules) for name, rules in POLICIES.items()}


@pytest.mark.parametrize("row", _ROWS, ids=[f"{r['policy']}-{r['how']}-{i}" for i, r in enumerate(_ROWS, 1)])
def test_each_recorded_request_gets_its_verdict(policies, worktree, row):
    """policy_verdicts.jsonl: requests at the edges of what each program's table reads (most found by hunting
    mutants), each with the verdict and, for a refusal, the reason a user reads. A row with `policy_rules` is
    judged by a policy of those rules alone."""
    if "policy_rules" in row:
        policies = {**policies, row["policy"]: policy_of(worktree, row["policy_rules"])}
    verdict = expect(judge(policies, row["policy"], row["how"], row["request"])(), row["outcome"])
    if "why" in row:
        assert verdict.reason["why"] == row["why"]
    if "rules" in row:
        assert list(verdict.rule_ids) == row["rules"]


# --- program tables: what each option makes a write, a read or a refusal --------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("tar -cf docs/x.tar src/a.txt", "unmatched"),  # every way of making or changing an archive writes it
        ("tar -rf docs/x.tar src/a.txt", "unmatched"),
        ("tar -uf docs/x.tar src/a.txt", "unmatched"),
        ("tar -Af docs/x.tar src/y.tar", "unmatched"),
        ("tar --create -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --append -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --update -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --cre -f docs/x.tar src/a.txt", "unmatched"),  # abbreviated
        ("tar rf docs/x.tar src/a.txt", "unmatched"),  # old style: no dash
        ("tar uf docs/x.tar src/a.txt", "unmatched"),
        ("tar cf docs/x.tar src/a.txt", "unmatched"),
        ("tar -tf docs/r.md", "allowed"),  # listing reads the archive
        ("tar tf docs/r.md", "allowed"),
        ("tar -cf src/x.tar src/a.txt", "allowed"),
        ("tar -cf src/x.tar src/secret", "denied"),
        ("tar -cvf src/x.tar src/a.txt", "allowed"),
        ("tar -xf src/x.tar", "unsafe_argument"),
        ("tar xvf src/x.tar", "unsafe_argument"),
        ("tar -cf src/x.tar -C docs r.md", "unsafe_argument"),
    ],
)
def test_tar_writes_the_archive_it_makes_and_only_lists_others(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("deny", "command", "outcome"),
    [
        ("src/*/key", "grep -r x src", "denied"),  # a deny with a wildcard in the middle, found beneath src
        ("src/*/key", "grep -r x docs", "allowed"),
        ("src/*/key", "grep -r x src/pkg", "allowed"),  # nothing beneath src/pkg matches
        ("src/*/key", "cat src/a.txt", "allowed"),
        ("*/secret/key", "grep -r x src", "denied"),
        ("src/secret/key", "grep -r x src", "denied"),
        ("docs/*.md", "grep -r x src", "allowed"),
        ("docs/*.md", "grep -r x docs", "denied"),
        ("docs/*.md", "grep -r x .", "denied"),
    ],
)
def test_a_recursive_read_meets_every_read_deny_beneath_it(worktree, deny, command, outcome):
    rules = [*OPEN[:3], {"id": "deny", "kind": "read", "paths": [deny], "decision": "deny"}]
    expect(policy_of(worktree, rules).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("deny", "path", "outcome"),
    [
        ("src/*/key", "src", "denied"),
        ("src/*/key", "docs", "allowed"),
        ("src/*/key", "src/pkg", "allowed"),
        ("lib/*/v.py", "lib", "denied"),
        ("**/v.py", "lib", "denied"),
        ("lib/vendor/v.py", "lib", "denied"),
    ],
)
def test_deleting_a_directory_meets_every_write_deny_beneath_it(worktree, deny, path, outcome):
    rules = [*OPEN[:3], {"id": "deny", "kind": "write", "paths": [deny], "decision": "deny"}]
    policy = policy_of(worktree, rules)
    expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": path}]}), outcome)
    expect(policy.judge_execute(f"rm -r {path}"), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("cd -P src && cat secret/key", "denied"),
        ("cd -L src && cat secret/key", "denied"),
        ("cd -e src && cat secret/key", "denied"),
        ("cd -@ src && cat secret/key", "denied"),
        ("cd -- src && cat secret/key", "denied"),
        ("cd -x src", "unsafe_argument"),
        ("cd -", "unsafe_argument"),
        ("cd +1", "unsafe_argument"),
        ("cd -1", "unsafe_argument"),
        ("cd docs && ls", "allowed"),
    ],
)
def test_cd_options_never_hide_where_it_goes(careful, command, outcome):
    expect(careful.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("sed -n p -- src/secret/key", "denied"),  # after `--` every word is a file
        ("sed -n -- p src/secret/key", "denied"),
        ("sed -- p src/a.txt docs/r.md src/secret/key", "denied"),
        ("sed -i -- s/a/b/ docs/r.md", "unmatched"),  # in place: a write
        ("sed --in-place s/a/b/ docs/r.md", "unmatched"),
        ("sed --in s/a/b/ docs/r.md", "unmatched"),
        ("sed -s -i s/a/b/ docs/r.md", "unmatched"),
        ("sed -l 5 p src/secret/key", "denied"),  # -l takes a value: p is the script
        ("sed --line-length 5 p src/secret/key", "denied"),
        ("sed --line-length=5 p src/secret/key", "denied"),
        ("sed --l=5 p src/a.txt", "allowed"),
        ("sed --e p src/secret/key", "denied"),
        ("sed --expression=p src/secret/key", "denied"),
        ("sed --expression p src/secret/key", "denied"),
        ("sed -e p -e 'w docs/x' src/a.txt", "unsafe_argument"),
        ("sed --quiet p src/a.txt", "allowed"),
        ("sed --posix p src/a.txt", "allowed"),
        ("sed --s p src/a.txt", "unsafe_argument"),  # ambiguous: --separate, --sandbox, --silent
        ("sed --x p src/a.txt", "unsafe_argument"),
        ("sed -y p src/a.txt", "unsafe_argument"),
        ("sed", "unsafe_argument"),
        ("sed -n", "unsafe_argument"),
        ("sed '\\' src/a.txt", "unsafe_argument"),  # a backslash ending the script
        ("sed 's/a/b' src/a.txt", "unsafe_argument"),
        ("sed 's\\a\\b\\' src/a.txt", "unsafe_argument"),
        ("sed '\\%x%d' src/secret/key", "denied"),  # a custom address delimiter, then the file
        ("sed '\\%x%Id' src/a.txt", "allowed"),
        ("sed '/a\\/b/d' src/a.txt", "allowed"),
        ("sed 's/a\\/b/c/' src/a.txt", "allowed"),
        ("sed 's/a/b/gw docs/x' src/a.txt", "unsafe_argument"),
        ("sed 's/a/b/3e' src/a.txt", "unsafe_argument"),
        ("sed 'y/ab/cd/' src/a.txt", "allowed"),
        ("sed 'y/ab/cd/w' src/a.txt", "unsafe_argument"),  # y takes no flags: w is a write command
        ("sed '1!G;h;$!d' src/a.txt", "allowed"),
        ("sed '$a end' src/a.txt", "allowed"),
        ("sed 'a w docs/x' src/a.txt", "allowed"),  # text to append, not a command
        ("sed -n '/x/{p;q}' src/a.txt", "allowed"),
        ("sed ':a;N;ba' src/a.txt", "allowed"),
        ("sed 'b end;w x' src/a.txt", "unsafe_argument"),
        ("sed 'k' src/a.txt", "unsafe_argument"),
        ("sed '0~2p;1~3d;5,+2p;$=' src/a.txt", "allowed"),
    ],
)
def test_sed_is_read_as_gnu_sed_reads_it(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("pytest --cov-report=html:docs/cov", "unmatched"),  # the directory after the colon is written
        ("pytest --cov-report=xml:/tmp/c.xml", "outside_worktree"),
        ("pytest --cov-report=html:src/cov:x", "allowed"),
        ("pytest --cov-report=term", "allowed"),
        ("pytest --junitxml=docs/j.xml", "unmatched"),
        ("pytest --junit-xml docs/j.xml", "unmatched"),
        ("pytest --log-file=docs/l", "unmatched"),
        ("pytest --html=docs/h", "unmatched"),
        ("pytest --report-log docs/r", "unmatched"),
        ("pytest --debug=docs/d", "unmatched"),
        ("pytest --rootdir=docs", "unmatched"),
        ("pytest --basetemp=src/t", "allowed"),
        ("pytest -o cache_dir=src/c", "allowed"),
        ("pytest -ocache_dir=docs/c", "unmatched"),
        ("pytest --override-ini cache_dir=docs/c", "unmatched"),
        ("pytest --override-ini=addopts=-x", "unsafe_argument"),
        ("pytest -o 'addopts =-x'", "unsafe_argument"),
        ("pytest -p no:cacheprovider", "allowed"),
        ("pytest -p xdist", "unsafe_argument"),
        ("pytest -k 'a or b' -m slow docs", "allowed"),
        ("pytest -kp docs", "allowed"),  # -k takes `p`: no plugin
        ("pytest --pastebin=failed", "unsafe_argument"),
        ("python3 -m pytest -p evil", "unsafe_argument"),
        ("python -m pytest", "allowed"),
    ],
)
def test_pytest_options_that_write_or_load_code(worktree, command, outcome):
    rules = [*TOOLS, {"id": "py3", "kind": "execute", "commands": ["python3 -m pytest *"], "decision": "allow"}]
    expect(policy_of(worktree, rules).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("curl -odocs/x https://e.example", "unmatched"),  # -o glued: an output, for programs without a table too
        ("curl -odocs https://e.example", "unmatched"),
        ("git config --get --list user.name", "unsafe_argument"),  # two actions
        ("git config -l user.name", "unsafe_argument"),  # listing takes no name
        ("git config --list user.name", "unsafe_argument"),
        ("git config list user.name", "unsafe_argument"),
        ("git config -l", "allowed"),
        ("git config get user.name", "allowed"),
        ("git config --get-regexp user x", "allowed"),
        ("git config --get user.name x", "unsafe_argument"),
        ("git commit --verbose", "denied"),  # prints the staged diff: every file, the secret too
        ("git commit --verb", "denied"),
        ("git commit -v", "denied"),
        ("git status --verbose", "denied"),
        ("git commit -m x", "allowed"),
        ("git show-branch --sha1-name", "denied"),  # not known to print only names
        ("git show-branch", "allowed"),
        ("git log --format=a=b", "allowed"),
        ("git log --pretty=format:%H -3", "allowed"),
        ("git log -12", "allowed"),
        ("git log -n12", "allowed"),
        ("git log -U3", "denied"),
    ],
)
def test_more_options_that_write_print_or_act(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


def test_cd_to_an_absolute_place_inside_is_judged_where_it_leads(careful, worktree):
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/src && cat secret/key"]), "denied")
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/docs && cat ../src/a.txt"]), "allowed")
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/../wt2 && ls"]), "outside_worktree")


@pytest.mark.parametrize(
    ("url", "outcome"),
    [
        ("https://api.github.com/a b", "unparseable"),  # a space anywhere
        ("https://api.github.com/\x7f", "unparseable"),
        ("https://api.github.com/\x1f", "unparseable"),
        ("https://api.github.com/a\\b", "unparseable"),  # a backslash anywhere
        ("https://api.github.com/a!b", "allowed"),
        ("https://api.github.com/\x80", "allowed"),
        ("api.github.com:x", "allowed"),
        ("localhost:8080", "unmatched"),
    ],
)
def test_a_url_is_refused_where_parsers_may_disagree(careful, url, outcome):
    expect(careful.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}), outcome)


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({"move_path": ".git/hooks/pre-commit"}, "protected_path"),
        ({"update": {"move_path": ".git/hooks/pre-commit"}}, "protected_path"),
        ({"update": {"nested": {"move_path": ".git/hooks/pre-commit"}}}, "protected_path"),
        ({"update": {"move_path": "src/b.txt"}}, "allowed"),
    ],
)
def test_a_patch_that_moves_a_file_is_judged_where_it_moves_it(careful, change, outcome):
    expect(careful.judge_tool_call({"kind": "edit", "rawInput": {"changes": {"src/a.txt": change}}}), outcome)


def test_the_reasons_a_client_records(careful):
    turn = Turn("s1", frozenset({"s1", "s2"}), frozenset({"open_proposal"}))
    assert careful.read("s2", "src/a.txt", turn).reason == {"kind": "outside_turn", "session": "s2"}
    assert careful.read("s9", "src/a.txt", turn).reason == {"kind": "unknown_session", "session": "s9"}
    host = careful.permission("s1", {"title": f"mcp__{HOST}__open_proposal", "kind": "other"}, OPTIONS, turn)
    assert (host.rule_ids, dict(host.reason)) == (
        ("builtin:host-tool",),
        {"kind": "host_tool", "tool": "open_proposal"},
    )
    think = careful.judge_tool_call({"kind": "think"})
    assert (think.rule_ids, dict(think.reason)) == (("builtin:think",), {"kind": "no_permission_needed"})
    use = careful.terminal_use("s1", "s1", turn)
    assert (use.allowed, use.rule_ids, dict(use.reason)) == (True, (), {"kind": "allowed"})
    null = careful.judge_execute("ls > /dev/null")
    assert null.rule_ids == ("ls", "builtin:dev-null")


@pytest.mark.parametrize(
    ("tool_call", "approved"),
    [
        ({"kind": "fetch", "rawInput": {"command": "rm -rf src", "url": "https://x"}}, set()),
        ({"kind": "execute", "rawInput": "ls"}, set()),
        (
            {"kind": "execute", "rawInput": {"command": ["git", "status"], "args": ["push"]}},
            {("execute", "git status")},
        ),
        ({"kind": "search", "rawInput": {"path": "docs"}}, {("read", "docs")}),
        ({"kind": "delete", "locations": [{"path": "docs/r.md"}]}, {("write", "docs/r.md")}),
    ],
)
def test_what_an_allow_approves_and_nothing_more(worktree, tool_call, approved):
    assert Policy([], worktree).approvals(tool_call) == approved


def test_an_approved_read_is_readable_once_approved(worktree):
    policy = Policy([], worktree)
    approved = policy.approvals({"kind": "read", "locations": [{"path": "docs/r.md"}]})
    turn = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.read("s1", "docs/r.md", turn), "allowed").reason["kind"] == "interactive"
    expect(policy.read("s1", "src/a.txt", turn), "not_approved")


def test_a_directory_too_large_to_judge_whole_is_refused(own_worktree, monkeypatch):
    """The walk beneath a directory is bounded (100,000 paths in use; three here)."""
    from harness.policy import _policy

    monkeypatch.setattr(_policy, "_MAX_CONTENTS", 3)
    for name in ("a", "b"):
        (own_worktree / "docs" / name).write_text("x\n")
    policy = policy_of(own_worktree, OPEN)
    expect(policy.judge_execute("rm -r docs"), "denied")  # rm is denied outright: the walk is not the reason
    expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "docs"}]}), "allowed")  # 3 paths
    (own_worktree / "docs" / "c").write_text("x\n")
    verdict = expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "docs"}]}), "too_many_files")
    assert dict(verdict.reason) == {"kind": "too_many_files", "path": "docs", "why": "more than 3 paths to judge"}


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("ls ../nope", "outside_worktree"),  # a path that does not exist is judged by what it names
        ("ls src/../../nope", "outside_worktree"),
        ("ls nope", "allowed"),  # a word with no `/` that names nothing is no path
        ("cat ..", "outside_worktree"),
    ],
)
def test_a_path_is_judged_whether_or_not_it_exists(careful, command, outcome):
    expect(careful.judge_execute(command), outcome)


def test_a_nested_repository_is_named_in_the_refusal(own_worktree):
    (own_worktree / "src" / "sub" / ".git").mkdir(parents=True)
    (own_worktree / "src" / "sub" / "deeper").mkdir()
    policy = policy_of(own_worktree, CAREFUL)
    verdict = expect(policy.judge_execute("git status", cwd="src/sub/deeper"), "nested_repository")
    why = "a nested repository: its config and hooks are programs git would run"
    assert verdict.reason == {"kind": "nested_repository", "path": "src/sub", "command": "git status", "why": why}


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("grep -r x", "denied"),  # a recursive reader with no directory reads where it runs, .env and all
        ("egrep -r x", "denied"),
        ("fgrep -r x", "denied"),
        ("grep -R x", "outside_worktree"),  # following src/out
        ("grep -rn x", "denied"),
        ("grep -nr x", "denied"),
        ("grep --recursive x", "denied"),
        ("grep --dereference-recursive x", "outside_worktree"),
        ("grep --directories=recurse x", "denied"),
        ("grep -d recurse x", "denied"),
        ("grep -drecurse x", "denied"),
        ("grep -A 2 -r x", "denied"),
        ("grep -A2 -r x", "denied"),
        ("grep -r -e x", "denied"),  # the pattern given by -e: no operand names a place
        ("grep -re x", "denied"),
        ("grep -r --regexp=x", "denied"),
        ("grep -r --file=docs/r.md", "denied"),
        ("grep -rf docs/r.md", "denied"),
        ("grep -r -e x docs", "allowed"),
        ("grep -r x docs", "allowed"),
        ("grep -r -d skip x docs", "allowed"),
        ("grep -e x -e y", "allowed"),  # not recursive: stdin
        ("grep x", "allowed"),
        ("grep -d skip x", "allowed"),
        ("rg x", "denied"),
        ("rg -n x", "denied"),
        ("ag x", "denied"),
        ("rg x docs", "allowed"),
        ("ag x docs", "allowed"),
        ("ls -R", "denied"),
        ("ls -lR", "denied"),
        ("ls --recursive", "denied"),
        ("ls --recur", "denied"),
        ("ls -R docs", "allowed"),
        ("ls -l", "allowed"),
    ],
)
def test_a_recursive_reader_given_no_place_reads_where_it_runs(open_policy, command, outcome):
    expect(open_policy.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("cat file:src/secret/key", "denied"),  # a file: URL names a local path
        ("cat file://src/secret/key", "denied"),
        ("cat FILE:src/secret/key", "denied"),
        ("cat File://src/secret/key", "denied"),
        ("cat file:", "outside_worktree"),  # the root
        ("cat file://", "outside_worktree"),
        ("cat file:docs/r.md", "allowed"),
        ("cat https://e.example/src/secret/key", "allowed"),  # another scheme names no local path
        ("touch file:docs/x", "unmatched"),  # a write stays a write
        ("wc --output=docs/x src/a.txt", "unmatched"),  # options that name an output, for any program
        ("wc --output docs/x src/a.txt", "unmatched"),
        ("wc --outp docs/x src/a.txt", "unmatched"),
        ("wc --o docs/x src/a.txt", "unmatched"),
        ("wc --log-file=docs/x src/a.txt", "unmatched"),
        ("wc --outfile=docs/x", "unmatched"),
        ("wc --output=src/x src/a.txt", "allowed"),
        ("wc --lines=docs/r.md", "allowed"),  # any other option's value is read
        ("wc --lines=src/secret/key", "denied"),
        ("du --files0-from=x", "unsafe_argument"),
        ("du --exclude-from=x docs", "unsafe_argument"),
        ("du --exclude-fr=x docs", "unsafe_argument"),
        ("du --include-from x docs", "unsafe_argument"),
        ("wc --files-from=x", "unsafe_argument"),
        ("find docs -delete", "unmatched"),  # find -delete removes what it finds
        ("find docs -name x", "allowed"),
        ("find docs -fprint src/x", "allowed"),
        ("find docs -fprint docs/x", "unmatched"),  # find's actions that write a file
        ("find docs -fprint .git/hooks/pre-commit", "protected_path"),
        ("find docs -fprint0 docs/x", "unmatched"),
        ("find docs -fprintf docs/x %p", "unmatched"),
        ("find docs -fls docs/x", "unmatched"),
        ("find docs -exec ls ;", "unsafe_argument"),
        ("find docs -execdir ls ;", "unsafe_argument"),
        ("find docs -ok ls ;", "unsafe_argument"),
        ("touch -- docs/x", "unmatched"),
        ("cp -- src/a.txt docs/y", "unmatched"),
        ("cp src/a.txt -- docs/y", "unmatched"),
        ("cp src/a.txt src/b.txt", "allowed"),
        ("cp src/secret/key src/b.txt", "denied"),
        ("cp -t docs src/a.txt", "unmatched"),
        ("cp --target-directory=docs src/a.txt", "unmatched"),
        ("cp --target-directory docs src/a.txt", "unmatched"),
        ("cp --target docs src/a.txt", "unmatched"),
        ("sort -o docs/x src/a.txt", "unmatched"),
        ("sort -uodocs/x src/a.txt", "unmatched"),
        ("sort -u -o docs/x src/a.txt", "unmatched"),
        ("sort -o src/x src/a.txt", "allowed"),
        ("sort -k 2 -t / src/a.txt", "allowed"),
        ("grep -f src/secret/key docs", "denied"),  # a file of patterns is read
        ("grep -e x -f src/secret/key docs", "denied"),
        ("grep -hf src/secret/key docs", "denied"),
        ("grep -e src/secret/key docs", "allowed"),  # a pattern names no file
        ("head -n 1 src/secret/key", "denied"),
        ("head -c5 src/a.txt", "allowed"),
        ("gcc -o docs/a src/a.c", "unmatched"),
        ("gcc -Isrc/secret -c src/a.c", "denied"),  # an include directory is read
        ("gcc -Wall -odocs/a src/a.c", "unmatched"),
        ("chmod 644 docs/r.md", "unmatched"),
        ("chmod 644 src/a.txt", "allowed"),
        ("chmod docs/r.md src/a.txt", "allowed"),  # the first operand is a mode
        ("chown x docs/r.md", "unmatched"),
        ("dd if=src/secret/key of=src/x", "denied"),
        ("dd if=src/a.txt of=docs/x", "unmatched"),
        ("cut -f1 @src/secret/key", "denied"),  # @file reads the file
        ("install -m 644 src/a.txt docs/a", "unmatched"),
        ("ln -s src/a.txt docs/l", "unmatched"),
        ("mv src/a.txt docs/a", "unmatched"),
        ("mv src/secret/key src/k", "denied"),
        ("uniq src/a.txt src/u", "allowed"),
        ("tee docs/x", "unmatched"),
        ("rmdir docs", "unmatched"),
        ("truncate -s 0 docs/r.md", "unmatched"),
    ],
)
def test_what_each_program_reads_and_writes(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "rule_ids", "reason"),
    [
        ("git -C ../x status", (), {"kind": "outside_worktree", "path": "../x", "why": "git -C names a place outside"}),
        ("git -c x=y status", (), {"kind": "unsafe_argument", "command": "git -c x=y status",
                                   "why": "git -c changes git's configuration, repository or programs"}),
        ("cat src/secret/key", ("no-secret-read",), {"kind": "denied", "rule_id": "no-secret-read",
                                                     "target": "src/secret/key", "command": "cat src/secret/key"}),
        ("cd src && cat secret/key", ("no-secret-read",), {"kind": "denied", "rule_id": "no-secret-read",
                                                           "target": "src/secret/key", "command": "cat secret/key"}),
        ("ls > docs/x", (), {"kind": "unmatched", "rule_kind": "write", "target": "docs/x"}),
        ("ls > .git/config", ("protected",), {"kind": "protected_path", "path": ".git/config"}),
        ("rm x", (), {"kind": "unmatched", "rule_kind": "execute", "target": "rm x"}),
        ("git -C src status", ("status", "read-all"), {"kind": "allowed"}),
        ("git status && ls docs > src/x && cat src/a.txt", ("status", "ls", "read-all", "write-src", "cat"),
         {"kind": "allowed"}),
        ("ls docs; cat docs/r.md < src/a.txt", ("ls", "read-all", "cat"), {"kind": "allowed"}),
        ("cd docs && ls", ("moves", "read-all", "ls"), {"kind": "allowed"}),
    ],
)  # fmt: skip
def test_the_rule_ids_and_reason_a_transcript_records(careful, command, rule_ids, reason):
    """Every rule that allowed some part of a script is named, in order; a refusal names what it refused and why."""
    verdict = careful.judge_execute(["bash", "-c", command])
    assert (verdict.rule_ids, dict(verdict.reason)) == (rule_ids, reason)


def test_a_refused_argument_names_the_command_and_where_it_resolved(careful, worktree):
    verdict = expect(careful.judge_execute("cat ../outside.txt"), "outside_worktree")
    assert dict(verdict.reason) == {
        "kind": "outside_worktree",
        "path": "./../outside.txt",
        "command": "cat ../outside.txt",
        "resolved": str(worktree.parent / "outside.txt"),
    }


@pytest.mark.parametrize(
    ("argv", "outcome"),
    [
        (["bash", "-c", "printf '$(id)'"], "unparseable"),  # builtins that evaluate `$(...)` in their arguments
        (["bash", "-c", "printf '%s' '$(id)'"], "unparseable"),
        (["bash", "-c", "test '`id`'"], "unparseable"),
        (["bash", "-c", "/usr/bin/printf '$(id)'"], "unparseable"),
        (["bash", "-c", "echo '$(id)'"], "allowed"),  # echo prints it as it is
        (["bash", "-c", "ls >&123456789"], "allowed"),  # duplicates an fd
        (["bash", "-c", "ls >&1234567890"], "unmatched"),  # a file of that name, at the root
        (["bash", "-c", "ls 2>&1"], "allowed"),
        (["bash", "-c", "ls 1>&-"], "allowed"),
        (["bash", "+x", "-c", "ls"], "allowed"),
        (["bash", "+o", "pipefail", "-c", "ls"], "allowed"),
        (["bash", "-oc", "pipefail", "ls"], "allowed"),  # -o takes the next word, -c the one after
        (["bash", "-co", "pipefail", "ls"], "allowed"),
        (["bash", "-oc", "posix", "ls"], "unparseable"),
        (["bash", "-c", "ls", "-x"], "allowed"),  # words after the script are $0, $1
        (["bash", "-lc"], "unparseable"),
        (["bash", "-", "x"], "unmatched"),  # runs the file x
        (["bash", "-e"], "unparseable"),  # reads stdin
        (["bash", "x", "-c", "ls"], "unmatched"),
        (["sh", "-c", "ls", "sh"], "allowed"),
        (["dash", "-c", "cd src && cat secret/key"], "denied"),
        (["bash", "-c", "sh -c 'cd src' && cat secret/key"], "allowed"),  # a nested shell's cd stays in it
        (["bash", "-c", "sh -c 'cd src && cat secret/key'"], "denied"),
        (["bash", "-c", "bash -c 'ls' > docs/x"], "unmatched"),  # the wrapper's own redirection
        (["bash", "-c", "bash -c 'ls' > src/x"], "allowed"),
    ],
)
def test_shells_builtins_and_descriptors(careful, argv, outcome):
    expect(careful.judge_execute(argv), outcome)


def test_commands_match_case_sensitively_and_hosts_do_not(worktree, careful):
    expect(careful.judge_execute("LS src"), "unmatched")  # another program
    expect(careful.judge_execute("Git status"), "unmatched")
    upper = policy_of(worktree, [{"id": "api", "kind": "network", "hosts": ["API.GitHub.com"], "decision": "allow"}])
    expect(upper.judge_tool_call({"kind": "fetch", "rawInput": {"url": "https://api.github.com/x"}}), "allowed")


def test_a_program_that_might_write_what_it_names_never_names_a_protected_path(open_policy):
    verdict = expect(open_policy.judge_execute("myprog .git/config"), "protected_path")
    assert (verdict.rule_ids, dict(verdict.reason)) == (
        ("protected",),
        {"kind": "protected_path", "path": ".git/config", "command": "myprog .git/config"},
    )
    expect(open_policy.judge_execute("cat .git/config"), "allowed")  # a program known only to read it


def test_a_worktree_directory_on_path_is_dropped_when_a_write_rule_can_name_a_program_in_it(worktree):
    """`write src/git` lets the agent plant the `git` an allowed `git status` runs: `src` leaves PATH. A write
    rule that names nothing directly inside a directory keeps it."""
    planted = policy_of(worktree, [{"id": "git-file", "kind": "write", "paths": ["src/git"], "decision": "allow"}])
    elsewhere = policy_of(worktree, [{"id": "docs", "kind": "write", "paths": ["docs/*"], "decision": "allow"}])
    path = os.pathsep.join([str(worktree / "src"), "/usr/bin"])
    assert planted.search_path(path) == "/usr/bin"
    assert elsewhere.search_path(path) == path


# --- the fourth review: readers that follow links, tar archives, git operands, PATH --------------------

_EVERYTHING = [{"id": "run-all", "kind": "execute", "commands": ["*"], "decision": "allow"},
               {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
               {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"}]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("grep -R x src", "outside_worktree"),  # src/out leads outside, and these follow it
        ("grep --dereference-recursive x src", "outside_worktree"),
        ("grep --deref x src", "outside_worktree"),
        ("egrep -R x src", "outside_worktree"),
        ("fgrep -rR x src", "outside_worktree"),
        ("rg -L x src", "outside_worktree"),
        ("rg --follow x src", "outside_worktree"),
        ("tar -chf docs/t.tar src", "outside_worktree"),
        ("tar --dereference -cf docs/t.tar src", "outside_worktree"),
        ("cp -rL src docs/c", "outside_worktree"),
        ("cp -r --dereference src docs/c", "outside_worktree"),
        ("rsync -aL src docs", "outside_worktree"),
        ("rsync -ak src docs", "outside_worktree"),
        ("rsync -a --copy-links src docs", "outside_worktree"),
        ("rsync -a --copy-dirlinks src docs", "outside_worktree"),
        ("du -L src", "outside_worktree"),
        ("du --dereference src", "outside_worktree"),
        ("ls -RL src", "outside_worktree"),
        ("find -L src", "outside_worktree"),
        ("find src -follow", "outside_worktree"),
        ("zip -r docs/z.zip src", "outside_worktree"),  # zip follows links unless -y
        ("zip -ry docs/z.zip src", "allowed"),
        ("zip -r --symlinks docs/z.zip src", "allowed"),
        ("grep -r x src", "allowed"),  # not following: a link beneath is not read through
        ("rg x src", "allowed"),
        ("tar -cf docs/t.tar src", "allowed"),
        ("cp -r src docs/c", "allowed"),
        ("rsync -a src docs", "allowed"),
        ("du src", "allowed"),
        ("ls -R src", "allowed"),
        ("find src", "allowed"),
        ("grep -R x docs", "allowed"),  # no link beneath
        ("grep -R x src/a.txt", "allowed"),
    ],
)
def test_a_reader_that_follows_links_is_judged_where_they_lead(worktree, command, outcome):
    policy = policy_of(worktree, _EVERYTHING)
    expect(policy.judge_execute(["bash", "-c", command]), outcome)


def test_a_followed_link_is_judged_by_the_deny_rules_of_where_it_leads(tmp_path):
    root = tmp_path / "wt"
    for directory in ("a", "s", ".git"):
        (root / directory).mkdir(parents=True)
    (root / "s" / "key").write_text("k\n")
    (root / "b").mkdir()
    os.symlink("../s/key", root / "a" / "k")  # a file in the denied place
    os.symlink("../s", root / "b" / "d")  # the denied place itself
    os.symlink("..", root / "b" / "loop")  # a cycle: walked once
    deny = [*_EVERYTHING, {"id": "no-s", "kind": "read", "paths": ["s/**"], "decision": "deny"}]
    policy = policy_of(root, deny)
    for command, outcome in [("grep -R x a", "denied"), ("grep -r x a", "allowed"), ("grep -R x b", "denied"),
                             ("rg -L x b", "denied"), ("rg x b", "allowed")]:  # fmt: skip
        verdict = expect(policy.judge_execute(["bash", "-c", command]), outcome)
        if outcome == "denied":
            assert verdict.rule_ids == ("no-s",), command


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("tar -cf h:x src/a.txt", "unsafe_argument"),  # HOST:FILE: a remote archive through rsh
        ("tar -c -f h:x src/a.txt", "unsafe_argument"),
        ("tar cf h:x src/a.txt", "unsafe_argument"),
        ("tar -tf h:x", "unsafe_argument"),
        ("tar --create --file h:x src/a.txt", "unsafe_argument"),
        ("tar -cf src/h:x src/a.txt", "allowed"),  # a colon after a slash is a local name
        ("tar -cf src/h:x --force-local src/a.txt", "allowed"),
        ("tar --delete -f docs/x.tar m", "unmatched"),  # deleting members rewrites the archive
        ("tar --delete -f src/x.tar m", "allowed"),
        ("tar --catenate -f docs/x.tar src/y.tar", "unmatched"),
        ("tar --concatenate -f docs/x.tar src/y.tar", "unmatched"),
        ("tar -tf src/secret/key", "denied"),  # listing reads the archive: a read deny applies
        ("tar -t -f src/secret/key", "denied"),
        ("tar tf src/secret/key", "denied"),
        ("tar -tf src/a.txt", "allowed"),
    ],
)
def test_tar_reads_the_archive_it_lists_and_never_reaches_a_remote_one(tools, command, outcome):
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("git commit -m 'fix: a/b'", "allowed"),  # a message is not a revision
        ("git commit -m fix:a", "allowed"),
        ("git commit -qam fix:a", "allowed"),
        ("git commit -F src/a.txt", "allowed"),
        ("git log HEAD:src/secret/key", "denied"),
        ("git log -n 1 x:y", "denied"),  # any REV:PATH names contents the policy cannot place
        ("git tag v1 :src/a.txt", "denied"),  # the index form, even of an allowed file (with a read deny)
        ("git tag v1 @", "allowed"),
        ("git tag -n", "denied"),
        ("git tag -l", "allowed"),
        ("git for-each-ref", "allowed"),
        ("git for-each-ref '--form=%(raw)'", "denied"),
        ("git branch --format=x", "denied"),
        ("git branch -v", "allowed"),
        ("git bundle create -q src/b HEAD", "denied"),  # a bundle holds every file (a read deny applies)
        ("git bundle create --quiet docs/b HEAD", "unmatched"),  # and it is written: the file, not `--quiet`
        ("git mailsplit -osrc/m src/a.txt", "allowed"),
        ("git mailsplit -odocs src/a.txt", "unmatched"),
        ("git mailinfo src/m src/p", "allowed"),
        ("git mailinfo src/m docs/p", "unmatched"),
    ],
)
def test_git_operands_that_name_contents_or_files_it_writes(tools, command, outcome):
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("pattern", "directory", "kept"),
    [
        ("src/git", "src", False),
        ("src/*", "src", False),
        ("src/g?t", "src", False),
        ("s*/x", "src", False),
        ("**", "src", False),
        ("src/**", "src/pkg", False),
        ("*/pkg/*", "src/pkg", False),
        ("docs/*", "src", True),
        ("src", "src", True),  # the directory itself, nothing in it
        ("src/pkg/x", "src", True),  # two levels down: no program directly in src
        ("src/**/x", "src", False),  # `**` may be nothing: src/x
        ("lib/*/x", "src/pkg", True),
    ],
)
def test_path_keeps_a_worktree_directory_only_when_no_write_rule_names_something_in_it(
    worktree, pattern, directory, kept
):
    policy = policy_of(worktree, [{"id": "w", "kind": "write", "paths": [pattern], "decision": "allow"}])
    entry = str(worktree / directory)
    assert (policy.search_path(f"{entry}:/usr/bin") == f"{entry}:/usr/bin") is kept


@pytest.mark.parametrize(
    ("command", "masked", "unmasked"),
    [
        ("grep -r x .", "allowed", "denied"),  # inside the sandbox the denied files are masked: it finds none
        ("grep -r x src", "allowed", "denied"),
        ("rg x", "allowed", "denied"),
        ("ls -R src", "allowed", "denied"),
        ("grep -r x src/secret", "denied", "denied"),  # what it names is still judged
        ("cat src/secret/key", "denied", "denied"),
        ("cat src/keylink", "denied", "denied"),
        ("git grep x", "denied", "denied"),  # git reads its object store, which no mask hides
        ("git log -p", "denied", "denied"),
        ("git show HEAD:src/secret/key", "denied", "denied"),
        ("grep -R x src", "outside_worktree", "outside_worktree"),  # a link out is not masked
    ],
)
def test_a_search_of_the_tree_is_allowed_where_the_sandbox_masks_what_a_read_deny_matches(
    worktree, command, masked, unmasked
):
    rules = [*TOOLS, {"id": "rg", "kind": "execute", "commands": ["rg *", "rg"], "decision": "allow"}]
    sandboxed = Policy([RuleConfig.model_validate(r) for r in rules], worktree, masked_reads=True)
    expect(sandboxed.judge_execute(["bash", "-c", command]), masked)
    expect(policy_of(worktree, rules).judge_execute(["bash", "-c", command]), unmasked)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("git update-index --add --cacheinfo 100644,0123abcd,src/k", "denied"),  # puts any blob at any path
        ("git checkout -- src/k", "denied"),  # ... which this then writes out
        ("git checkout HEAD~1 -- old/path", "denied"),  # a file from another revision, at its old path
        ("git restore src/k", "denied"),
        ("echo '100644 blob 0123abcd\tsrc/k' | git mktree", "denied"),
        ("git hash-object -w src/a.txt", "denied"),
        ("git checkout main", "allowed"),  # switching branches names no path
        ("git checkout -b feature", "allowed"),
        ("git add src/a.txt", "allowed"),
    ],
)
def test_git_commands_that_copy_stored_files_into_the_worktree_read_it_all(tools, command, outcome):
    """With a read deny in place, a stored copy of a denied file must not reach a path the deny misses."""
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


def test_a_deny_under_a_bracketed_directory_covers_that_directory(tmp_path):
    """`[` is an ordinary character in the policy's globs (Next.js routes: `app/[id]/`): a deny of
    `app/[id]/middleware.ts` covers moving or copying a file into `app/[id]`, as it does without brackets."""
    root = tmp_path / "wt"
    for directory in ("app/[id]", "app/id", "lib", ".git"):
        (root / directory).mkdir(parents=True)
    (root / "lib" / "middleware.ts").write_text("x\n")
    rules = [*_EVERYTHING, {"id": "no-mw", "kind": "write", "paths": ["app/[id]/middleware.ts", "app/id/middleware.ts"],
                            "decision": "deny"}]  # fmt: skip
    policy = policy_of(root, rules)
    for target in ("'app/[id]'", "app/id"):
        for program in ("cp", "mv"):
            expect(policy.judge_execute(["bash", "-c", f"{program} lib/middleware.ts {target}"]), "denied")
    expect(policy.judge_execute(["bash", "-c", "cp lib/middleware.ts 'app/[id]/page.ts'"]), "allowed")


# --- the sandbox's proxy: a host name, judged by the network rules alone ---------------------------

PROXY_RULES = [
    {"id": "api", "kind": "network", "hosts": ["api.github.com"], "decision": "allow"},
    {"id": "examples", "kind": "network", "hosts": ["*.example.org"], "decision": "allow"},
    {"id": "no-evil", "kind": "network", "hosts": ["evil.example.org"], "decision": "deny"},
]


@pytest.mark.parametrize(
    ("host", "outcome", "rules"),
    [
        ("api.github.com", "allowed", ("api",)),
        ("API.GitHub.COM", "allowed", ("api",)),  # host names are case-blind
        ("api.github.com.", "allowed", ("api",)),  # the root label's dot names the same host
        (".api.github.com", "unmatched", ()),  # a leading dot is no spelling of it
        ("api.github.com.evil.example", "unmatched", ()),
        ("docs.example.org", "allowed", ("examples",)),
        ("evil.example.org", "denied", ("no-evil",)),  # deny wins over the allow that matches too
        ("EVIL.example.org.", "denied", ("no-evil",)),
        ("example.org", "unmatched", ()),
        ("", "unmatched", ()),
    ],
)
def test_the_sandbox_proxy_judges_a_host_by_the_network_rules(worktree, host, outcome, rules):
    verdict = expect(policy_of(worktree, PROXY_RULES).judge_host(host), outcome)
    assert verdict.rule_ids == rules
    named = host.lower().removesuffix(".")  # what the rules were matched against, as the refusal says
    if outcome == "unmatched":
        assert verdict.reason == {"kind": "unmatched", "rule_kind": "network", "target": named}
    elif outcome == "denied":
        assert verdict.reason == {"kind": "denied", "rule_id": rules[0], "target": named}


def test_with_no_rules_the_proxy_lets_no_host_through(worktree):
    """The interactive path approves what a person allowed in a turn; a connection is in no turn."""
    verdict = expect(policy_of(worktree, []).judge_host("api.github.com"), "not_approved")
    assert verdict.reason == {"kind": "not_approved", "rule_kind": "network", "target": "api.github.com"}


@pytest.mark.parametrize(
    ("script", "path"),
    [("cd src/keylink/../../..", "src/keylink/../../.."), ("cd src && cd keylink/../../..", "keylink/../../..")],
)
def test_a_cd_bash_reads_as_leaving_the_worktree_names_its_path(careful, script, path):
    """bash drops `link/..` as text (src/keylink/../../.. is above the worktree), the kernel's reading follows
    the link (it stays inside): the refusal names the path as written."""
    verdict = expect(careful.judge_execute(script), "outside_worktree")
    assert verdict.reason == {"kind": "outside_worktree", "path": path, "why": "cd leaves the worktree"}
