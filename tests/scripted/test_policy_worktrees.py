"""Requests the policy tables cannot make: each needs a worktree of its own.

The tables judge requests against one shared worktree (policy_corpus.build_worktree). The requests here
need something that worktree lacks: directories reached through symlinks with no link out beside them,
a worktree or a run directory whose name ends in `X`, names with a blank, `[` or mutmut's own `XX`
markers, hard links, symlinks in a directory on PATH, the worktree's absolute path in a script, or the
interactive path's answer. Most were found by mutation testing (a changed policy judged them otherwise and
no other test noticed); the hard links and the committed link on PATH are holes the same review found.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from harness import Policy
from harness.policy._policy import Turn
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import CAREFUL, OPEN, READ_ALL, build_worktree, expect, policy_of

pytestmark = LOOP_SCRIPTED

RUN_ALL = {"id": "run-all", "kind": "execute", "commands": ["*"], "decision": "allow"}
WRITE_ALL = {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"}
TURN = Turn("s1", frozenset({"s1"}))


HARD_LINK_WHY = "a file beneath has another name that may be outside the worktree, protected or denied"


def bash(policy: Policy, script: str):
    return policy.judge_execute(["bash", "-c", script])


def deny_read(rule_id: str, pattern: str) -> dict:
    return {"id": rule_id, "kind": "read", "paths": [pattern], "decision": "deny"}


def make_tree(root: Path, dirs=(), files=(), links=None) -> Path:
    """A worktree: `.git/config`, the directories, the files (each holding a line), the symlinks {path: target}."""
    for directory in (".git", *dirs):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for name in (".git/config", *files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    for link, target in (links or {}).items():
        os.symlink(target, root / link)
    return root


@pytest.fixture(name="own_worktree")
def own_worktree_fixture(tmp_path):
    """The tables' worktree (src/gitlink -> ../.git, src/secret/key, ...), built for this test. The long name
    above it keeps `/proc/self/root` + its path from slicing, at the worktree path's length, to an absolute
    text: a policy that sliced there would then refuse by luck, and only the name's length would tell."""
    return build_worktree(tmp_path.resolve() / "a-worktree-parent")


# --- readers that follow links --------------------------------------------------------------------

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
    from harness.policy import _policy

    monkeypatch.setattr(_policy, "_MAX_CONTENTS", 3)
    root = make_tree(tmp_path / "wt", files=["many/a", "many/b", "many/c"])
    policy = policy_of(root, [READ_ALL, RUN_ALL])
    expect(bash(policy, "grep -R x many"), "allowed")  # three paths: at the bound, not over it
    (root / "many" / "d").write_text("x\n")
    verdict = expect(bash(policy, "grep -R x many"), "too_many_files")
    assert dict(verdict.reason) == {"kind": "too_many_files", "path": "many", "why": "more than 3 paths to judge",
                                    "command": "grep -R x many"}  # fmt: skip


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
    from harness.policy import _policy

    monkeypatch.setattr(_policy, "_MAX_CONTENTS", 3)
    root = make_tree(tmp_path / "wt", files=["big/a", "big/b", "big/c", "big/d"])
    expect(policy_of(root, rules).judge_read("big"), "allowed")
    beneath = policy_of(root, [READ_ALL, deny_read("beneath", "big/nothing")])
    expect(beneath.judge_read("big"), "too_many_files")  # a deny that may hold beneath: walked, and too large


# --- hard links -----------------------------------------------------------------------------------

HARD_LINK_RULES = [READ_ALL, deny_read("no-secret", "src/secret/**"), RUN_ALL,
                   {"id": "write-docs", "kind": "write", "paths": ["docs/**"], "decision": "allow"}]  # fmt: skip
_NOT_WALKED = ("left open by 4babdf0: a directory read whole that no read deny may reach into is not walked, so a "
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


# --- PATH -----------------------------------------------------------------------------------------


def test_path_loses_a_directory_outside_holding_a_link_to_a_path_the_agent_may_write(tmp_path):
    """`npm link` or `ln -s ~/proj/bin/tool ~/.local/bin` leave such a link outside the worktree: an allowed
    `tool` would run what the agent wrote."""
    base = tmp_path.resolve()
    root = make_tree(base / "wt", dirs=["docs"])
    (base / "outbin").mkdir()
    (base / "outbin" / "tool").symlink_to(root / "docs" / "tool")
    (base / "plainbin").mkdir()
    (base / "plainbin" / "ls").symlink_to("/usr/bin/ls")
    policy = policy_of(root, [write_rule("docs/**")])
    path = os.pathsep.join([str(base / "outbin"), str(base / "plainbin"), "/usr/bin"])
    assert policy.search_path(path) == os.pathsep.join([str(base / "plainbin"), "/usr/bin"])


def test_path_loses_a_directory_it_cannot_list(tmp_path):
    """What a directory holds that cannot be listed (a link loop here; a mode-0311 directory for a user
    other than root) cannot be checked for a planted link: it is dropped."""
    base = tmp_path.resolve()
    root = make_tree(base / "wt", dirs=["docs"])
    (base / "loop").symlink_to(base / "loop")
    policy = policy_of(root, [write_rule("docs/**")])
    assert policy.search_path(os.pathsep.join([str(base / "loop"), "/usr/bin"])) == "/usr/bin"


def write_rule(pattern: str) -> dict:
    return {"id": "w", "kind": "write", "paths": [pattern], "decision": "allow"}


@pytest.mark.parametrize(
    ("pattern", "directory", "kept"),
    [
        ("docs/**", "tools", False),  # tools/planted -> ../docs/p: the agent writes docs/p, PATH runs it
        ("docs/**", "bin", False),  # a committed bin/git -> ../docs/g: `git status` would run docs/g
        ("docs/**", "src", True),  # no link in src, and docs/** names nothing in it
        ("planted", "docs", True),  # a file at the top names nothing in docs
        ("git", ".", False),  # the worktree itself on PATH: the agent may write ./git
        ("src/pkg/git", "src/pkg", False),  # a directory two levels down
        ("**/*.py", "src/pkg", False),  # `**` reaches into any directory
        ("**/*.py", "src", False),
        ("src", "src/pkg", True),  # the directory above names nothing in it
        ("docs/**", "missing", True),  # not there, and no rule lets the agent make it
    ],
)
def test_path_loses_a_worktree_directory_where_a_program_could_be_planted(tmp_path, pattern, directory, kept):
    """A worktree directory on PATH stays only if no write rule lets the agent put a program there, directly
    or through a symlink the directory already holds."""
    root = make_tree(
        tmp_path.resolve() / "wt",
        dirs=["src/pkg", "docs", "tools", "bin"],
        links={"tools/planted": "../docs/p", "bin/git": "../docs/g"},
    )
    policy = policy_of(root, [write_rule(pattern)])
    entry = str(root) if directory == "." else str(root / directory)
    path = os.pathsep.join([entry, "/usr/bin"])
    assert policy.search_path(path) == (path if kept else "/usr/bin")


# --- names ------------------------------------------------------------------------------------------


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


# --- the worktree's absolute path in a script -------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("cd {root}/src/gitlink/../secret && cat key", "denied"),  # bash drops gitlink/.. as text: src/secret
        ("cd /proc/self/root{root}/src/gitlink/../secret && cat key", "outside_worktree"),
        ("cd /proc/self/root{root}/src", "outside_worktree"),  # not the worktree's own spelling: refused
        ("cd {root}/src && cat a.txt", "allowed"),
    ],
)
def test_cd_to_the_worktrees_absolute_path_is_judged_where_bash_lands(own_worktree, script, outcome):
    """`cd` is logical: an absolute path under the worktree's own is judged as the relative place bash lands
    in; an absolute path that does not start with it is refused, even where the kernel would take it inside
    (bash's later `cd ..` would climb that spelling, not the worktree)."""
    careful = policy_of(own_worktree, CAREFUL)
    verdict = expect(bash(careful, script.format(root=own_worktree)), outcome)
    if outcome == "denied":
        assert verdict.rule_ids == ("no-secret-read",)


# --- the interactive path and the answer to a permission request --------------------------------------

READ_A = {"kind": "read", "locations": [{"path": "src/a.txt"}]}


def test_the_interactive_path_asks_a_person_and_grants_nothing_itself(own_worktree):
    """With no rules the policy does not decide: it asks, and its own verdict is a refusal naming no rule."""
    verdict = Policy([], own_worktree).permission("s1", READ_A, [("a", "allow_once"), ("r", "reject_once")], TURN)
    assert verdict.ask is True
    assert verdict.allowed is False
    assert verdict.rule_ids == ()
    assert dict(verdict.reason) == {"kind": "interactive"}
    assert verdict.option_id is None


@pytest.mark.parametrize(
    ("options", "option_id"),
    [
        ([("aa", "allow_always"), ("r", "reject_once")], "r"),
        ([("aa", "allow_always")], None),  # nothing to reject with: the client answers `cancelled`
    ],
)
def test_an_allow_with_no_allow_once_option_is_refused_naming_the_rules_that_would_allow_it(
    own_worktree, options, option_id
):
    """`allow_always` could become the agent's own standing rule: the request is refused, and the reason
    (the transcript records it) names the rules that allowed it, so a person sees why it was asked."""
    verdict = policy_of(own_worktree, CAREFUL).permission("s1", READ_A, options, TURN)
    assert verdict.allowed is False
    assert verdict.option_id == option_id
    assert dict(verdict.reason) == {"kind": "no_allow_once_option", "allowed_by": ["read-all"]}


def test_a_persons_allow_of_an_argv_approves_that_argv_whatever_args_say(own_worktree):
    """A command given as a list is the whole command: an `args` beside it is not part of it."""
    tool_call = {"kind": "execute", "rawInput": {"command": ["ls", "src"], "args": "x"}}
    assert Policy([], own_worktree).approvals(tool_call) == {("execute", "ls src")}
