"""The policy as a function, a first example of each guarantee on a small worktree: deny wins, paths resolved
before matching, protected files, a command judged by what it runs and where, tool kinds mapped to rule kinds, the
interactive path; and, under a policy that allows nearly everything (policy_corpus.EVERYTHING), what the shell
would rewrite and requests that are malformed or name their place oddly.

The subject files hold the rest: test_policy_shell.py, test_policy_paths.py, test_policy_programs.py,
test_policy_requests.py (and test_policy_enforced.py, the kernel against a real agent).
"""

from __future__ import annotations

import os

import pytest

from harness import Policy
from harness.config._config import RuleConfig
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import EVERYTHING, READ_ALL, policy_of

pytestmark = LOOP_SCRIPTED


def rules(*specs):
    return [RuleConfig.model_validate(s) for s in specs]


ALLOW_SRC = {"id": "allow-src", "kind": "write", "paths": ["src/**"], "decision": "allow"}
DENY_SECRETS = {"id": "deny-secrets", "kind": "write", "paths": ["src/secrets/**"], "decision": "deny"}
GIT = {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"}
LS = {"id": "ls", "kind": "execute", "commands": ["ls", "ls *"], "decision": "allow"}
NO_PUSH = {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"}
GITHUB = {"id": "github", "kind": "network", "hosts": ["*.github.com", "github.com"], "decision": "allow"}


@pytest.fixture(name="worktree")
def worktree_fixture(tmp_path):
    root = tmp_path / "wt"
    (root / "src").mkdir(parents=True)
    (root / ".git" / "hooks").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "src" / "escape")
    os.symlink(root / ".git", root / "gitlink")
    return root


@pytest.mark.parametrize("order", ["allow-first", "deny-first"])
def test_deny_wins_in_either_order(worktree, order):
    specs = [ALLOW_SRC, DENY_SECRETS] if order == "allow-first" else [DENY_SECRETS, ALLOW_SRC]
    policy = Policy(rules(*specs), worktree)
    verdict = policy.judge_write("src/secrets/key.pem")
    assert not verdict.allowed
    assert verdict.rule_ids == ("deny-secrets",)
    assert policy.judge_write("src/app.py").rule_ids == ("allow-src",)


@pytest.mark.parametrize(
    ("path", "allowed", "why"),
    [
        ("src/a/b/c.txt", True, "allowed"),
        ("src", True, "allowed"),  # src/** matches the directory itself
        ("docs/a.md", False, "unmatched"),
        ("/etc/passwd", False, "outside_worktree"),
        ("src/../../outside.txt", False, "outside_worktree"),
        ("src/escape/file.txt", False, "outside_worktree"),  # a symlink out of the worktree
        (".git/config", False, "protected_path"),
        (".git/hooks/pre-commit", False, "protected_path"),
        (".git/refs/heads/main", False, "protected_path"),
        ("gitlink/config", False, "protected_path"),  # a symlink into .git
    ],
)
def test_write_paths_are_resolved_before_matching(worktree, path, allowed, why):
    # Even an explicit allow rule for .git cannot open a protected path.
    allow_git = {"id": "allow-git", "kind": "write", "paths": [".git/**", "gitlink/**"], "decision": "allow"}
    policy = Policy(rules(ALLOW_SRC, allow_git), worktree)
    verdict = policy.judge_write(path)
    assert verdict.allowed is allowed
    assert verdict.reason["kind"] == why


def test_protected_files_beyond_the_defaults(worktree):
    config = worktree / "loop.yaml"
    policy = Policy(
        rules({"id": "all", "kind": "write", "paths": ["**"], "decision": "allow"}),
        worktree,
        protected_globs=["policy/**"],
        protected_files=[config],
    )
    assert policy.judge_write("loop.yaml").reason["kind"] == "protected_path"
    assert policy.judge_write("policy/rules.yaml").reason["kind"] == "protected_path"
    assert policy.judge_write("src/ok.txt").allowed


@pytest.mark.parametrize(
    ("command", "allowed", "rule_ids_or_why"),
    [
        ("git status", True, ("git",)),
        (["git", "commit", "-m", "a; rm -rf"], True, ("git",)),  # argv: no shell, literal args
        (["/bin/bash", "-lc", "git add -A && git commit -m x"], True, ("git",)),  # Codex's wrapper
        ("git status && rm -rf src", False, "unmatched"),  # a chain behind an allowed command
        ("git status; curl http://x", False, "unmatched"),
        ("git log | sh", False, "unparseable"),  # sh reads its commands from the pipe
        ("(cd src && ls) || git status", False, "unmatched"),  # cd is not allowed
        ("ls && git status\nls src", True, ("ls", "git", "read-all")),  # `src` is read
        ("git push origin main", False, "denied"),
        ("git $(echo push)", False, "unparseable"),
        ("git `whoami`", False, "unparseable"),
        ("cat <<EOF\nx\nEOF", False, "unparseable"),
        ("bash -c 'git status && rm -rf /'", False, "unmatched"),  # nested wrapper, unwrapped
        ("git status > src/out.txt", True, ("git", "allow-src")),  # redirect judged as a write
        ("git status > /etc/motd", False, "outside_worktree"),
        ("git status > /dev/null 2>&1", True, ("git", "builtin:dev-null")),
        ("git log 'unterminated", False, "unparseable"),
        ("FOO=1 git status", False, "unsafe_env"),  # an assignment can change what runs
        ("LANG=C git status", True, ("git",)),  # bash runs git status, with a variable that changes nothing
        ("GIT_DIR=.git/x git status", False, "unsafe_env"),
    ],
)
def test_execute_requests_are_judged_by_what_they_run(worktree, command, allowed, rule_ids_or_why):
    policy = Policy(rules(GIT, LS, NO_PUSH, ALLOW_SRC, READ_ALL), worktree)
    verdict = policy.judge_execute(command)
    assert verdict.allowed is allowed, verdict
    if allowed:
        assert verdict.rule_ids == rule_ids_or_why
    else:
        assert verdict.reason["kind"] == rule_ids_or_why


def test_command_cwd_outside_the_worktree_is_refused(worktree, tmp_path):
    policy = Policy(rules(GIT), worktree)
    why = "the command's cwd is outside the worktree"
    assert policy.judge_execute("git status", cwd=str(tmp_path)).reason == {
        "kind": "outside_worktree", "path": str(tmp_path), "why": why}  # fmt: skip
    assert policy.judge_execute("git status", cwd=str(worktree / "src")).allowed


def test_a_command_never_runs_in_a_directory_it_may_not_read(worktree):
    """Its cwd is where it could `ls`: a read deny there refuses it, named as the rule that did, whatever the
    command (and a write deny of the same place is not what refuses it)."""
    deny_read = {"id": "no-secret-read", "kind": "read", "paths": ["src/secret/**"], "decision": "deny"}
    deny_write = {"id": "no-secret", "kind": "write", "paths": ["src/secret/**"], "decision": "deny"}
    echo = {"id": "echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"}
    policy = policy_of(worktree, [echo, deny_write, deny_read])
    verdict = policy.judge_execute("echo hi", cwd="src/secret")
    assert (verdict.allowed, verdict.rule_ids) == (False, ("no-secret-read",))
    assert verdict.reason == {"kind": "denied", "rule_id": "no-secret-read", "target": "src/secret"}
    assert policy_of(worktree, [echo, deny_write]).judge_execute("echo hi", cwd="src/secret").allowed


@pytest.mark.parametrize(
    ("tool_call", "allowed", "why"),
    [
        ({"kind": "edit", "locations": [{"path": "src/a.py"}]}, True, "allowed"),
        ({"kind": "edit", "rawInput": {"file_path": "docs/a.md"}}, False, "unmatched"),  # Claude Write
        ({"kind": "edit", "rawInput": {"changes": {"src/a.py": {}, "README.md": {}}}}, False, "unmatched"),  # Codex
        ({"kind": "edit", "content": [{"type": "diff", "path": "src/b.py", "newText": "x"}]}, True, "allowed"),
        ({"kind": "delete", "locations": [{"path": "src/a.py"}]}, True, "allowed"),
        ({"kind": "read", "locations": [{"path": "anything.txt"}]}, True, "allowed"),
        ({"kind": "edit", "title": "no path at all"}, False, "no_target"),
        ({"kind": "search", "rawInput": {"pattern": "TODO"}}, True, "allowed"),  # the whole worktree: read **
        ({"kind": "read", "title": "no path at all"}, False, "no_target"),
        ({"kind": "execute", "rawInput": {"command": ["/bin/bash", "-lc", "git status"]}}, True, "allowed"),
        ({"kind": "execute", "rawInput": {"command": "rm -rf /"}}, False, "unmatched"),
        ({"kind": "execute", "title": "git status"}, False, "no_target"),  # titles are not commands
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com/x"}}, True, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://evil.example/x"}}, False, "unmatched"),
        ({"kind": "think"}, True, "no_permission_needed"),
        ({"kind": "other", "rawInput": {"path": "src/a.py"}}, False, "unmatched"),
        ({"title": "kind left unset"}, False, "unmatched"),
    ],
)
def test_permission_requests_map_tool_kinds_to_rule_kinds(worktree, tool_call, allowed, why):
    policy = Policy(rules(ALLOW_SRC, READ_ALL, GIT, GITHUB), worktree)
    verdict = policy.judge_tool_call({"toolCallId": "c1", **tool_call})
    assert verdict.allowed is allowed, verdict
    assert verdict.reason["kind"] == why


def test_a_search_without_a_path_needs_the_whole_worktree(worktree):
    narrow = {"id": "read-src", "kind": "read", "paths": ["src/**"], "decision": "allow"}
    verdict = Policy(rules(narrow), worktree).judge_tool_call({"kind": "search", "rawInput": {"pattern": "x"}})
    assert (verdict.allowed, verdict.reason) == (False, {"kind": "unmatched", "rule_kind": "read", "target": "."})


def test_an_empty_policy_reaches_only_what_a_person_approved(worktree):
    policy = Policy([], worktree)
    assert policy.interactive
    assert policy.judge_write("src/a.txt").reason["kind"] == "not_approved"
    assert policy.judge_execute("touch pwned").reason["kind"] == "not_approved"

    approved = policy.approvals({"kind": "edit", "locations": [{"path": "src/a.txt"}]}) | policy.approvals(
        {"kind": "execute", "rawInput": {"command": ["bash", "-lc", "git status > src/log.txt"]}}
    )
    assert policy.judge_write("src/a.txt", approvals=approved).rule_ids == ("interactive",)
    assert policy.judge_execute("git", ["status"], approvals=approved).allowed
    assert policy.judge_execute("git status > src/log.txt", approvals=approved).allowed  # as the person saw it
    assert policy.judge_execute("git status > .git/config", approvals=approved).reason["kind"] == "protected_path"
    assert policy.judge_execute("git", ["push"], approvals=approved).reason["kind"] == "not_approved"
    assert policy.judge_write("src/b.txt", approvals=approved).reason["kind"] == "not_approved"
    assert policy.judge_write("/etc/passwd", approvals=approved).reason["kind"] == "outside_worktree"
    assert policy.judge_write(".git/config", approvals=approved).reason["kind"] == "protected_path"
    assert policy.judge_write("src/a.txt").reason["kind"] == "not_approved"  # approvals are the turn's only


# --- nearly everything allowed: what the shell would rewrite, malformed requests ------------------


@pytest.fixture(name="policy")
def policy_fixture(tmp_path):
    (tmp_path / "wt" / ".git").mkdir(parents=True)
    return Policy([RuleConfig.model_validate(r) for r in EVERYTHING], tmp_path / "wt")


@pytest.mark.parametrize(
    "script",
    [
        "git status > ~/.bashrc",
        "git status > $HOME/.bashrc",
        "git status > .gi?/confi[g]",
        "git status > $'\\x2egit/config'",
        "git status > ${x}.git/hooks/pre-commit",
        "git pu$@sh origin",
        "git pu${x}sh origin",
        "git $'push'",
        "git status; $(echo git) push",
        "git status \\\n$(id)",
        "echo {a,b}",
        "cd .git && echo x > config",
        "cd /tmp && echo x > pwned",
        "git status # '\ntouch pwned\n#'",  # the shell drops the comment; the quote was never one
        "git status #; rm -rf src",
    ],
)
def test_what_the_shell_would_rewrite_is_refused(policy, script):
    verdict = policy.judge_execute(["/bin/bash", "-lc", script])
    assert not verdict.allowed, script
    assert verdict.reason["kind"] in ("unparseable", "outside_worktree", "protected_path", "denied"), verdict


@pytest.mark.parametrize("script", ["git log --grep='#12'", "git checkout feature#12", 'echo "# heading"'])
def test_a_quoted_or_mid_word_hash_is_no_comment(policy, script):
    assert policy.judge_execute(["/bin/bash", "-lc", script]).allowed, script


@pytest.mark.parametrize("key", ["dir_path", "directory", "cwd", "search_root"])
def test_a_search_naming_its_place_under_an_unknown_key_is_no_worktree_search(policy, key):
    verdict = policy.judge_tool_call({"kind": "search", "rawInput": {"pattern": "root", key: "/etc"}})
    assert not verdict.allowed  # judged as the place it names, or refused for naming one unread
    assert verdict.reason["kind"] in ("no_target", "outside_worktree")


@pytest.mark.parametrize(
    ("tool_call", "why"),
    [
        ({"kind": "delete", "locations": [{"path": "."}]}, "protected_path"),
        ({"kind": "delete", "locations": [{"path": ".git"}]}, "protected_path"),
        ({"kind": "move", "rawInput": {"source": ".git", "destination": "old-git"}}, "protected_path"),
        ({"kind": "edit", "locations": [{"path": ".git/packed-refs"}]}, "protected_path"),
        ({"kind": "edit", "locations": [{"path": ".git/modules/sub/config"}]}, "protected_path"),
        ({"kind": "delete", "locations": [{"path": "src"}]}, "denied"),  # holds src/secrets/
        ({"kind": "execute", "rawInput": {"command": 5}}, "unparseable"),
        ({"kind": "execute", "rawInput": {"command": "git status", "cwd": 5}}, "unparseable"),
        ({"kind": "edit", "locations": [{"path": "src/a\x00b"}]}, "unparseable"),
    ],
)
def test_ancestors_protected_paths_and_malformed_requests(policy, tool_call, why):
    verdict = policy.judge_tool_call({"toolCallId": "c1", **tool_call})
    assert not verdict.allowed
    assert verdict.reason["kind"] == why
