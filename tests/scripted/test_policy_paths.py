"""Paths: what globs match, what read and write rules grant, how a path resolves, protected paths and nested
repositories, directories read, deleted or moved whole, symlinks followed, hard links, and odd names.

The tables judge against the shared worktree (policy_corpus.build_worktree): `src/a.txt`, `src/secret/key`,
`src/pkg/secrets/k`, `src/.env`, `docs/r.md`, `.git/`, symlinks `src/keylink` -> `secret/key`, `src/gitlink` ->
`../.git`, `src/out` -> the directory above the worktree, and a sibling directory `wt2/` beside it whose name
starts with the worktree's. A case that needs what that worktree lacks builds a tree of its own (make_tree).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from harness import ConfigError, Policy
from harness.config._config import RuleConfig
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import (
    CAREFUL,
    EVERYTHING,
    OPEN,
    READ_ALL,
    TOOLS,
    WRITE_ALL,
    bash,
    build_worktree,
    expect,
    make_tree,
    policy_of,
    refused,
)

pytestmark = LOOP_SCRIPTED

RUN_ALL = {"id": "run-all", "kind": "execute", "commands": ["*"], "decision": "allow"}


def deny_read(rule_id: str, pattern: str) -> dict:
    return {"id": rule_id, "kind": "read", "paths": [pattern], "decision": "deny"}


# This module's own: the shared worktree built directly in tmp_path (conftest.py's sits below a long directory name).
@pytest.fixture(name="own_worktree")
def own_worktree_fixture(tmp_path):
    """For a test that changes the tree."""
    return build_worktree(tmp_path)


# --- globs ----------------------------------------------------------------------------------------


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
    "pattern",
    ["./secrets/**", "/abs/keys/**", "env/", "../outside/**", "."],
    ids=["dot-slash", "abs", "slash", "dotdot", "dot"],
)
def test_globs_that_could_never_match_are_config_errors(pattern, tmp_path):
    from harness import parse_config

    data = {"workspace": str(tmp_path), "agent": {"command": ["x"]},
            "policy": {"rules": [{"id": "r", "kind": "write", "paths": [pattern], "decision": "deny"}]}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"policy\.rules\.0"):
        parse_config(data, base_dir=tmp_path)


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


@pytest.mark.parametrize(
    ("rules", "request_"),
    [
        ([WRITE_ALL, READ_ALL, RUN_ALL, {"id": "no-k", "kind": "write", "paths": ["src/*/k"], "decision": "deny"}],
         ("write", "src/*")),
        ([WRITE_ALL, READ_ALL, RUN_ALL, {"id": "no-k", "kind": "write", "paths": ["src/*/k"], "decision": "deny"}],
         ("bash", "mkdir 'src/*'")),
        (OPEN, ("write", "**")),  # OPEN denies writing **/secrets/**
        (OPEN, ("bash", "touch '**'")),
    ],
)  # fmt: skip
def test_a_name_made_of_glob_characters_is_held_by_no_deny_that_merely_spells_it(tmp_path, rules, request_):
    """A deny covers the directories its literal leading part names; a file called `src/*` or `**` is not one
    of them, and nothing beneath it is denied: writing it is allowed."""
    policy = policy_of(make_tree(tmp_path / "wt", dirs=["src"]), rules)
    how, what = request_
    expect(policy.judge_write(what) if how == "write" else bash(policy, what), "allowed")


# --- where a path leads: read denies, resolution, the worktree's edge -----------------------------


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


def test_a_read_or_write_names_the_place_it_judged(tmp_path):
    """The kernel reaches the file the verdict names (`paths`), never the request's spelling a second time: a
    link or `..` is the place it resolved to, for a read and a write alike."""
    root = make_tree(tmp_path / "wt", dirs=["docs"], files=["src/a.txt"], links={"src/link": "a.txt"})
    policy = policy_of(root, [READ_ALL, WRITE_ALL])
    for spelling in ("src/link", "docs/../src/a.txt", str(root / "src" / "a.txt")):
        assert expect(policy.judge_read(spelling), "allowed").paths == ("src/a.txt",), spelling
        assert expect(policy.judge_write(spelling), "allowed").paths == ("src/a.txt",), spelling


def test_the_refusal_of_proc_and_of_a_hard_link_names_the_place(careful, tmp_path):
    """/proc is the kernel's own environment and memory: the refusal names the path and where it led."""
    verdict = expect(careful.judge_read("/proc/self/environ"), "proc")
    assert verdict.reason == {"kind": "proc", "path": "/proc/self/environ", "resolved": f"/proc/{os.getpid()}/environ"}
    root = make_tree(tmp_path / "wt", files=["src/a.txt"])
    os.link(root / "src" / "a.txt", root / "src" / "b.txt")
    verdict = expect(policy_of(root, [READ_ALL]).judge_read("src/b.txt"), "hard_link")
    why = "a file with another name may be outside the worktree, protected or denied"
    assert verdict.reason == {"kind": "hard_link", "path": "src/b.txt", "why": why}
    why = "the request could not be judged: ValueError: not a path: 'a\\x00b'"  # a NUL ends a C string
    assert expect(careful.judge_read("a\0b"), "unparseable").reason == {"kind": "unparseable", "why": why}


def test_a_sibling_directory_named_like_the_worktree_is_outside(careful, worktree):
    sibling = f"{worktree}2/x"
    expect(careful.judge_read(sibling), "outside_worktree")
    expect(careful.judge_write(sibling), "outside_worktree")
    expect(careful.judge_execute(f"cat {sibling}"), "outside_worktree")
    expect(careful.judge_read(f"{worktree}/src/a.txt"), "allowed")  # absolute inside is inside


@pytest.mark.parametrize(
    ("request_", "outcome"),
    [
        (("read", "../wt/secret.txt"), "outside_worktree"),  # a sibling named like the worktree, less its X
        (("bash", "cat ../wt/secret.txt"), "outside_worktree"),
        (("read", "src/a.txt"), "allowed"),
    ],
)
def test_a_worktree_whose_name_ends_in_x_reaches_nothing_beside_it(tmp_path, request_, outcome):
    """`wtX` is the worktree and `wt/` beside it is outside, whatever letters the names end in."""
    base = tmp_path.resolve()
    (base / "wt").mkdir()
    (base / "wt" / "secret.txt").write_text("s\n")
    policy = policy_of(make_tree(base / "wtX", files=["src/a.txt"]), [READ_ALL, RUN_ALL])
    how, what = request_
    expect(policy.judge_read(what) if how == "read" else bash(policy, what), outcome)


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


def test_a_refused_argument_names_the_command_and_where_it_resolved(careful, worktree):
    verdict = expect(careful.judge_execute("cat ../outside.txt"), "outside_worktree")
    assert dict(verdict.reason) == {
        "kind": "outside_worktree",
        "path": "./../outside.txt",
        "command": "cat ../outside.txt",
        "resolved": str(worktree.parent / "outside.txt"),
    }


def test_the_worktree_at_the_filesystem_root_resolves_paths_whole(tmp_path):
    assert Policy([RuleConfig.model_validate(EVERYTHING[0])], Path("/")).resolve("/etc/passwd") == "etc/passwd"


# --- protected paths and nested repositories ------------------------------------------------------


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


@pytest.mark.parametrize(
    ("request_", "outcome"),
    [
        (("write", "runX/t.jsonl"), "protected_path"),
        (("bash", "echo x > runX/t.jsonl"), "protected_path"),
        (("write", "run/t.jsonl"), "allowed"),  # `run` is not `runX`
    ],
)
def test_a_protected_run_directory_whose_name_ends_in_x_stays_protected(tmp_path, request_, outcome):
    """The run's own files (its transcripts) are never written, whatever letters their directory ends in."""
    root = make_tree(tmp_path.resolve() / "wt", dirs=["runX", "run"])
    policy = policy_of(root, [WRITE_ALL, READ_ALL, RUN_ALL], protected_files=[root / "runX"])
    how, what = request_
    expect(policy.judge_write(what) if how == "write" else bash(policy, what), outcome)


@pytest.mark.parametrize(
    "request_",
    [
        {"kind": "edit", "locations": [{"path": "src/sub/.git/config"}]},
        {"kind": "edit", "locations": [{"path": "src/sub/.git"}]},  # a gitfile pointing anywhere
        {"kind": "edit", "rawInput": {"changes": {"src/sub/.git/hooks/post-checkout": {}}}},
        {"kind": "move", "rawInput": {"source": "src/a.txt", "destination": "src/x/.GIT/config"}},
        {"kind": "execute", "rawInput": {"command": "cat src/a.txt > src/sub/.git/config"}},
        {"kind": "edit", "rawInput": {"changes": {"src/a.txt": {"update": {"move_path": ".git/hooks/pre-commit"}}}}},
        {"kind": "move", "locations": [{"path": "src/a.txt"}], "rawInput": {"to": ".git/config"}},
    ],
)
def test_no_git_directory_is_writable_at_any_depth(policy, request_):
    refused(policy.judge_tool_call(request_), "protected_path")


def test_a_nested_repository_is_named_in_the_refusal(own_worktree):
    (own_worktree / "src" / "sub" / ".git").mkdir(parents=True)
    (own_worktree / "src" / "sub" / "deeper").mkdir()
    policy = policy_of(own_worktree, CAREFUL)
    verdict = expect(policy.judge_execute("git status", cwd="src/sub/deeper"), "nested_repository")
    why = "a nested repository: its config and hooks are programs git would run"
    assert verdict.reason == {"kind": "nested_repository", "path": "src/sub", "command": "git status", "why": why}


# --- deleting, moving or reading a directory judges everything beneath it -------------------------


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
    ("request_", "outcome"),
    [
        (("write", "XX.XX"), "protected_path"),  # it holds sub/.git
        (("bash", "mv XX.XX docs/y"), "protected_path"),
        (("read", "XX.XX"), "denied"),  # it holds secrets/k
        (("bash", "grep -r k XX.XX"), "denied"),
    ],
)
def test_a_directory_named_xx_dot_xx_is_judged_with_everything_beneath_it(tmp_path, request_, outcome):
    """`XX.XX` is a name like any other (mutmut marks its changes with XX): deleting, moving or searching it
    reaches the nested repository and the secrets inside."""
    root = make_tree(tmp_path / "wt", dirs=["docs"], files=["XX.XX/sub/.git/config", "XX.XX/secrets/k"])
    policy = policy_of(root, OPEN)
    how, what = request_
    calls = {"write": policy.judge_write, "read": policy.judge_read, "bash": lambda s: bash(policy, s)}
    expect(calls[how](what), outcome)


@pytest.mark.parametrize(
    ("pattern", "directory"),
    [
        ("my dir/*/secret", "my dir/x"),  # a blank inside a name
        ("fooXX/XXbar*/key", "fooXX/XXbarY"),
        ("s*?[/*/key", "sa["),  # `[` is no glob character in the policy's globs
    ],
)
def test_a_read_deny_beneath_a_directory_with_an_odd_name_is_met(tmp_path, pattern, directory):
    """A directory read whole is walked when a read deny's glob may match beneath it, however odd its name."""
    root = make_tree(tmp_path / "wt", files=["my dir/x/secret/k", "fooXX/XXbarY/key", "sa[/x/key"])
    policy = policy_of(root, [READ_ALL, RUN_ALL, deny_read("d", pattern)])
    assert expect(policy.judge_read(directory), "denied").rule_ids == ("d",)
    assert expect(bash(policy, f"grep -r s {shlex.quote(directory)}"), "denied").rule_ids == ("d",)
    expect(bash(policy, f"ls {shlex.quote(directory)}"), "allowed")  # names it, reads nothing beneath


def test_a_directory_too_large_to_judge_whole_is_refused(own_worktree, monkeypatch):
    """The walk beneath a directory is bounded (100,000 paths in use; three here)."""
    from harness.policy import _places

    monkeypatch.setattr(_places, "_MAX_CONTENTS", 3)
    for name in ("a", "b"):
        (own_worktree / "docs" / name).write_text("x\n")
    policy = policy_of(own_worktree, OPEN)
    expect(policy.judge_execute("rm -r docs"), "denied")  # rm is denied outright: the walk is not the reason
    expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "docs"}]}), "allowed")  # 3 paths
    (own_worktree / "docs" / "c").write_text("x\n")
    verdict = expect(policy.judge_tool_call({"kind": "delete", "locations": [{"path": "docs"}]}), "too_many_files")
    assert dict(verdict.reason) == {"kind": "too_many_files", "path": "docs", "why": "more than 3 paths to judge"}


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(CAREFUL, id="careful"),  # its read deny is src/secret/**
        pytest.param([READ_ALL, deny_read("elsewhere", "Xyz/**")], id="deny-elsewhere"),
    ],
)
def test_a_large_directory_no_read_deny_reaches_into_is_read_without_walking_it(tmp_path, monkeypatch, rules):
    """Reading a directory whole walks it only where a read deny may match beneath: a deny elsewhere never
    makes a large directory (node_modules) too large to read."""
    from harness.policy import _places

    monkeypatch.setattr(_places, "_MAX_CONTENTS", 3)
    root = make_tree(tmp_path / "wt", files=["big/a", "big/b", "big/c", "big/d"])
    expect(policy_of(root, rules).judge_read("big"), "allowed")
    beneath = policy_of(root, [READ_ALL, deny_read("beneath", "big/nothing")])
    expect(beneath.judge_read("big"), "too_many_files")  # a deny that may hold beneath: walked, and too large


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


# --- readers that follow links --------------------------------------------------------------------

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


LINK_RULES = [READ_ALL, RUN_ALL, deny_read("no-key", "**/k/key.pem"), deny_read("no-denied", "**/denied.txt"),
              deny_read("no-lnk", "?/lnk"), deny_read("no-vendor", "lib*/vendor/**")]  # fmt: skip


@pytest.fixture(name="linked")
def linked_fixture(tmp_path):
    """No link here leads outside but `m/o`, so each request meets only the links it names."""
    base = tmp_path.resolve()
    (base / "outdir").mkdir()
    (base / "outdir" / "o.txt").write_text("o\n")
    root = make_tree(
        base / "wt",
        dirs=["m", "e", "f/sub", "g"],
        files=["docs/r.md", "k/key.pem", "f/denied.txt", "lib/vendor/v.py"],
        links={
            "docs/l": "../m",  # a linked directory ...
            "m/o": str(base / "outdir"),  # ... that holds the one link out
            "e/l2": "../k",  # a linked directory that holds k/key.pem
            "f/sub/ln": "../../docs/r.md",  # a link walked after f/denied.txt
            "g/lnk": "../docs/r.md",  # a link whose own name is denied
        },
    )
    return root


@pytest.mark.parametrize(
    ("command", "outcome", "rule_id"),
    [
        ("grep -R x docs", "outside_worktree", None),  # docs/l -> m, and m/o beneath it leads outside
        ("grep -R x e", "denied", "no-key"),  # e/l2 -> k: its files are judged where they are, k/key.pem
        ("rg -L x e", "denied", "no-key"),
        ("grep -r x e", "allowed", None),  # a reader that does not follow the link never reaches k
        ("grep -R x f", "denied", "no-denied"),  # f/denied.txt counts, though a link comes after it
        ("grep -R x g", "denied", "no-lnk"),  # the link's own name is judged: g/lnk
        ("grep -R x lib", "denied", "no-vendor"),  # each path beneath keeps its name: lib/vendor/v.py
    ],
)
def test_a_reader_that_follows_links_meets_everything_beneath_by_name_and_by_where_it_leads(
    linked, command, outcome, rule_id
):
    """`grep -R` walks into linked directories: every path it reaches is judged, under the name it is
    reached by and where it really is, and a link out anywhere on the way refuses."""
    verdict = expect(bash(policy_of(linked, LINK_RULES), command), outcome)
    if rule_id is not None:
        assert verdict.rule_ids == (rule_id,), verdict


def test_a_link_out_beneath_a_followed_directory_is_named_in_the_refusal(linked):
    """The refusal says which link leads out and where to: the person reading the transcript needs both."""
    verdict = expect(bash(policy_of(linked, LINK_RULES), "grep -R x docs"), "outside_worktree")
    assert verdict.reason["path"] == str(linked / "docs" / "l" / "o")
    assert verdict.reason["resolved"] == str(linked.parent / "outdir")
    assert verdict.reason["command"] == "grep -R x docs"


def test_a_followed_directory_too_large_to_judge_is_refused(tmp_path, monkeypatch):
    """The walk of a reader that follows links is bounded like any other (100,000 paths in use; three here)."""
    from harness.policy import _places

    monkeypatch.setattr(_places, "_MAX_CONTENTS", 3)
    root = make_tree(tmp_path / "wt", files=["many/a", "many/b", "many/c"])
    policy = policy_of(root, [READ_ALL, RUN_ALL])
    expect(bash(policy, "grep -R x many"), "allowed")  # three paths: at the bound, not over it
    (root / "many" / "d").write_text("x\n")
    verdict = expect(bash(policy, "grep -R x many"), "too_many_files")
    assert dict(verdict.reason) == {"kind": "too_many_files", "path": "many", "why": "more than 3 paths to judge",
                                    "command": "grep -R x many"}  # fmt: skip


# --- hard links -----------------------------------------------------------------------------------

HARD_LINK_WHY = "a file beneath has another name that may be outside the worktree, protected or denied"

HARD_LINK_RULES = [READ_ALL, deny_read("no-secret", "src/secret/**"), RUN_ALL,
                   {"id": "write-docs", "kind": "write", "paths": ["docs/**"], "decision": "allow"}]  # fmt: skip
_NOT_WALKED = ("left open: a directory read whole that no read deny may reach into is not walked, so a "
               "hard link in it is never seen (docs/h reads src/secret/key)")  # fmt: skip


@pytest.mark.parametrize(
    ("command", "path"),
    [
        ("cat docs/h", "docs/h"),  # named: refused as any file with a second name
        ("grep -R x docs", "docs/h"),  # a reader that follows links walks every directory it reads
        ("grep -R x out", "out/o"),  # a second name of a file outside the worktree
        pytest.param("grep -r x docs", "docs/h", marks=pytest.mark.xfail(strict=True, reason=_NOT_WALKED)),
        pytest.param("tar -cf docs/t.tar docs", "docs/h", marks=pytest.mark.xfail(strict=True, reason=_NOT_WALKED)),
    ],
)  # fmt: skip
def test_a_hard_link_inside_a_directory_read_whole_is_refused(tmp_path, command, path):
    """A second name of a read-denied or outside file reads that file: met anywhere beneath a directory read
    whole, it refuses as it does when named."""
    base = tmp_path.resolve()
    (base / "outside.txt").write_text("o\n")
    root = make_tree(base / "wt", dirs=["docs", "out"], files=["src/secret/key"])
    os.link(root / "src" / "secret" / "key", root / "docs" / "h")
    os.link(base / "outside.txt", root / "out" / "o")
    verdict = expect(bash(policy_of(root, HARD_LINK_RULES), command), "hard_link")
    assert verdict.reason["path"] == path
    if command != "cat docs/h":  # met beneath a directory: the refusal says why a name it never saw matters
        assert verdict.reason["why"] == HARD_LINK_WHY


@pytest.mark.parametrize("command", ["grep -r x docs", "tar -cf src/t.tar docs", "du -a docs"])
def test_a_hard_link_met_walking_a_directory_a_deny_may_reach_into_is_refused(tmp_path, command):
    """A read deny that may match beneath `docs` (`**/*.pem`, though nothing matches there) makes the
    policy walk it: the second name of a read-denied file met on the way refuses."""
    root = make_tree(tmp_path.resolve() / "wt", dirs=["docs"], files=["src/secret/key", "docs/r.md"])
    os.link(root / "src" / "secret" / "key", root / "docs" / "h")
    rules = [*HARD_LINK_RULES, deny_read("no-keys", "**/*.pem"),
             {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"}]  # fmt: skip
    verdict = expect(bash(policy_of(root, rules), command), "hard_link")
    assert (verdict.reason["path"], verdict.reason["why"]) == ("docs/h", HARD_LINK_WHY)
    os.unlink(root / "docs" / "h")  # the same request with no second name is allowed
    expect(bash(policy_of(root, rules), command), "allowed")


@pytest.mark.parametrize("command", ["chmod -R 0 docs", "cp -r src/new/. docs", "touch -r docs/r.md docs"])
def test_a_directory_written_whole_with_a_hard_link_inside_is_refused(tmp_path, command):
    """`chmod -R` and `cp -r` write through a second name: docs/h is src/secret/key, which no rule lets the
    agent write, so writing docs whole would write it."""
    root = make_tree(tmp_path.resolve() / "wt", dirs=["docs", "src/new"], files=["src/secret/key", "docs/r.md"])
    os.link(root / "src" / "secret" / "key", root / "docs" / "h")
    rules = [*HARD_LINK_RULES, {"id": "no-secret-write", "kind": "write", "paths": ["src/secret/**"],
                                "decision": "deny"}]  # fmt: skip
    verdict = expect(bash(policy_of(root, rules), command), "hard_link")
    assert (verdict.reason["path"], verdict.reason["why"]) == ("docs/h", HARD_LINK_WHY)


@pytest.mark.parametrize(
    ("kind", "relative", "outcome"),
    [
        ("write", ".", "protected_path"),  # deleting the root takes .git with it
        ("write", ".git/config", "protected_path"),
        ("write", "src/.git/HEAD", "protected_path"),  # every .git, a nested one too
        ("write", "src/a.txt", "allowed"),
        ("write", "src/new/file.py", "allowed"),  # a path that does not exist yet is judged by place alone
        ("write", "src/secret/key", "denied"),
        ("write", "docs/x", "unmatched"),
        ("read", ".git/config", "allowed"),  # protection is of writes: `read **` reads .git
        ("read", "src/secret/key", "denied"),
        ("read", ".", "denied"),  # the whole tree holds what the read deny matches
    ],
)
def test_the_change_sets_judgement_of_a_place(careful, kind, relative, outcome):
    """What the kernel asks of each path a task changed at its boundary (`Policy.judge_place`): protection,
    then the rules, deny winning and no rule refusing; no link is followed, the path being already resolved."""
    verdict = expect(careful.judge_place(kind, relative), outcome)
    if outcome == "protected_path":  # as the transcript's refusal names it
        assert verdict.rule_ids == ("protected",) and verdict.reason == {"kind": outcome, "path": relative}


@pytest.mark.parametrize(("relative", "protected"), [(".", True), (".git", True), ("a/.GIT/b", True),
                                                     ("src", False), ("src/a.txt", False)])  # fmt: skip
def test_is_protected_names_every_git_directory_and_the_root(careful, relative, protected):
    assert careful.is_protected(relative) is protected
