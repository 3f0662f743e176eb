"""Issue 34: what a careful user allows runs, while every escape stays closed.

A refusal ends an unattended run, so a refusal of something harmless costs a queue. These tests pin the
everyday requests that now run (`git diff --stat`, `git diff HEAD -- src/a.txt`, a search under the sandbox,
`X=1`, `curl --output`) and the escapes beside each that stay refused (a tag that names a blob, `--full-diff`,
`nice rm` under an `rm *` deny, `printf -v PATH`), checking with real git, real wrappers and a real sandbox
that what the policy judged is what runs. The rest are rows of tests/helpers/policy_verdicts.jsonl.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kernel._assembly import terminal_environment
from harness.policy.commands import analyze
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._recovery import TOKEN_VARIABLE
from tests.helpers.policy_corpus import CAREFUL, OPEN, expect, policy_of, refused

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
GIT_ALL = {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"}
#: The issue's careful user: read everything but src/secret/, write src/, git and a few commands.
CAREFUL_GIT = [*CAREFUL, GIT_ALL]


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


@pytest.fixture(name="repository")
def repository_fixture(tmp_path):
    """A real repository: two commits that change src/a.txt and the secret together, both changed again in the
    worktree, and a tag `v1` naming the secret's blob (what `git tag v1 HEAD:src/secret/key` makes)."""
    root = tmp_path / "wt"
    (root / "src" / "secret").mkdir(parents=True)
    (root / "docs").mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name, value in (("user.email", "t@example.com"), ("user.name", "t"), ("commit.gpgsign", "false")):
        _git(root, "config", name, value)
    for round_ in (1, 2):
        (root / "src" / "a.txt").write_text(f"public {round_}\n")
        (root / "src" / "secret" / "key").write_text(f"TOPSECRET {round_}\n")
        (root / "docs" / "r.md").write_text("readme\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-qm", f"round {round_}")
    _git(root, "tag", "v1", _git(root, "rev-parse", "HEAD:src/secret/key").strip())
    (root / "src" / "a.txt").write_text("public 3\n")
    (root / "src" / "secret" / "key").write_text("TOPSECRET 3\n")
    return root


#: What the careful user runs, and what git prints with it: never the secret.
RUNS = ["git diff --stat", "git diff --stat HEAD~0", "git diff --name-only HEAD", "git diff --numstat HEAD~1",
        "git diff HEAD -- src/a.txt", "git diff -- src/a.txt docs/r.md", "git diff HEAD~1..HEAD -- src/a.txt",
        "git log -p -- src/a.txt", "git log --stat", "git show HEAD -- src/a.txt", "git show --stat HEAD~1",
        "git show --name-status"]  # fmt: skip
#: Beside each: a spelling that would print the secret, still refused (a blob by a tag, a diff beyond the
#: pathspec, a patch beside the stat, a directory that holds it).
STAYS_REFUSED = ["git diff v1 -- src/a.txt", "git show v1 -- src/a.txt", "git show --stat v1",
                 "git log -p --full-diff -- src/a.txt", "git diff --stat -p", "git diff HEAD -- src",
                 "git diff HEAD --", "git diff --no-index -- src/a.txt src/secret/key",
                 "git -C src diff HEAD -- secret"]  # fmt: skip


@pytest.mark.parametrize("command", RUNS)
def test_git_that_prints_names_or_a_readable_pathspec_runs_and_prints_no_secret(repository, command):
    policy = policy_of(repository, CAREFUL_GIT)
    expect(policy.judge_execute(["bash", "-c", command]), "allowed")
    printed = _git(repository, *command.split()[1:])
    assert "TOPSECRET" not in printed, printed
    assert "fatal" not in printed and "usage" not in printed, printed  # it ran, and printed what it does


@pytest.mark.parametrize("command", STAYS_REFUSED)
def test_git_that_would_print_the_secret_stays_refused(repository, command):
    """Each is refused by the secret's deny rule, and each, run, does print the secret: the refusal is what
    keeps it from the agent."""
    policy = policy_of(repository, CAREFUL_GIT)
    verdict = refused(policy.judge_execute(["bash", "-c", command]), "denied")
    assert verdict.rule_ids == ("no-secret-read",), verdict
    words = command.split()
    printed = _git(repository, *(words[1:] if words[1] != "-C" else ["-C", str(repository / "src"), *words[3:]]))
    assert "TOPSECRET" in printed, printed


def test_a_pathspec_is_judged_for_every_revision_not_only_the_worktree_now(repository):
    """`**/.env` may match below any path in some revision (`src/a.txt/.env` once): under a deny that starts
    with a glob, every pathspec diff is refused; a deny with a literal directory lets the others run."""
    rules = [*CAREFUL_GIT, {"id": "no-env", "kind": "read", "paths": ["**/.env"], "decision": "deny"}]
    verdict = refused(policy_of(repository, rules).judge_execute(["git", "diff", "HEAD", "--", "docs/r.md"]), "denied")
    assert verdict.rule_ids == ("no-env",) and verdict.reason == {
        "kind": "denied", "rule_id": "no-env", "target": "docs/r.md", "command": "git diff HEAD -- docs/r.md"
    }, verdict  # fmt: skip
    expect(policy_of(repository, CAREFUL_GIT).judge_execute(["git", "diff", "HEAD", "--", "docs/r.md"]), "allowed")


@pytest.fixture(name="linked_worktree")
def linked_worktree_fixture(tmp_path):
    """The careful user's worktree with one hard-linked file beneath src/ (its other name in docs/)."""
    root = tmp_path / "wt"
    for directory in ("src/secret", ".git", "docs"):
        (root / directory).mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "src" / "a.txt").write_text("a\n")
    (root / "src" / "secret" / "key").write_text("key\n")
    (root / "docs" / "linked.txt").write_text("linked\n")
    os.link(root / "docs" / "linked.txt", root / "src" / "linked.txt")
    return root


SEARCHES = [{"kind": "search", "rawInput": {"path": "src"}}, {"kind": "search", "rawInput": {"pattern": "x"}},
            {"kind": "search", "rawInput": {"path": "."}}]  # fmt: skip


@pytest.mark.parametrize("search", SEARCHES, ids=["src", "no-path", "worktree"])
def test_a_search_under_the_sandbox_runs_and_the_kernel_still_reads_no_linked_or_denied_file(linked_worktree, search):
    """Inside the sandbox a denied file is masked and a hard-linked one is too: a search reaches only what it
    may read, so it runs. What the kernel reads itself (`fs/read_text_file`) stays refused, file by file."""
    sandboxed = policy_of(linked_worktree, CAREFUL_GIT, masked_reads=True)
    verdict = expect(sandboxed.judge_tool_call(search), "allowed")
    assert verdict.rule_ids == ("read-all",), verdict
    refused(sandboxed.judge_read("src/linked.txt"), "hard_link")
    assert refused(sandboxed.judge_read("src/secret/key"), "denied").rule_ids == ("no-secret-read",)
    refused(sandboxed.judge_tool_call({"kind": "search", "rawInput": {"path": "src/linked.txt"}}), "hard_link")
    refused(sandboxed.judge_tool_call({"kind": "search", "rawInput": {"path": "src/secret"}}), "denied")
    refused(sandboxed.judge_tool_call({"kind": "read", "rawInput": {"path": "src"}}), "hard_link")  # not a search
    # With no sandbox the searcher reads what is there: the same search is refused.
    refused(policy_of(linked_worktree, CAREFUL_GIT).judge_tool_call(search), "hard_link", "denied")


#: Each wrapper's own options, as it reads them: what it runs must be `rm src/a.txt`, which the deny sees.
WRAPPED = ["nice rm src/a.txt", "nice -n 5 rm src/a.txt", "nice -5 rm src/a.txt", "nice --adjustment=5 rm src/a.txt",
           "env rm src/a.txt", "env LANG=C rm src/a.txt", "env -u LANG rm src/a.txt", "env -- rm src/a.txt",
           "timeout 5 rm src/a.txt", "timeout -k 3 -s KILL 5 rm src/a.txt", "timeout --signal=TERM 5 rm src/a.txt",
           "timeout -v 5 rm src/a.txt", "timeout --preserve-status 5 rm src/a.txt", "stdbuf -oL rm src/a.txt",
           "stdbuf -i0 -e L rm src/a.txt", "stdbuf --output=0 rm src/a.txt", "setsid rm src/a.txt",
           "setsid -w rm src/a.txt", "setsid --fork rm src/a.txt", "nohup rm src/a.txt", "command rm src/a.txt",
           "command -p rm src/a.txt", "exec rm src/a.txt", "exec -a name rm src/a.txt", "exec -c rm src/a.txt",
           "builtin rm src/a.txt", "nice timeout 5 env LANG=C rm src/a.txt", "/usr/bin/nice rm src/a.txt",
           "/usr/bin/env rm src/a.txt"]  # fmt: skip


@pytest.mark.parametrize("command", WRAPPED)
def test_a_wrapped_command_is_judged_as_what_it_runs(worktree, command):
    """Under `execute *` with `rm *` denied: before, `nice rm src/a.txt` matched no deny and ran."""
    verdict = refused(policy_of(worktree, OPEN).judge_execute(["bash", "-c", command]), "denied")
    assert verdict.rule_ids == ("no-rm",), verdict


#: Run for real with a probe in place of rm: the wrapper runs exactly the command the policy judged.
REAL_WRAPPERS = [w for w in WRAPPED if not w.startswith(("builtin", "exec -c", "command -p"))]  # -p: the system's rm


@pytest.mark.parametrize("command", REAL_WRAPPERS)
def test_each_wrapper_really_runs_the_command_the_policy_judged(tmp_path, command):
    probe = tmp_path / "bin" / "rm"
    probe.parent.mkdir()
    probe.write_text('#!/bin/sh\necho "ran: rm $*"\n')
    probe.chmod(0o755)
    words = command.split()
    assert analyze(words).match_text == "rm src/a.txt"
    env = {**os.environ, "PATH": f"{probe.parent}:{os.environ['PATH']}"}
    if words[0].startswith("/usr/bin/") and not Path(words[0]).exists():
        pytest.skip(f"{words[0]} is not on this machine")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, timeout=30)  # fmt: skip
    ran = done.stdout + (tmp_path / "nohup.out").read_text() if (tmp_path / "nohup.out").exists() else done.stdout
    assert "ran: rm src/a.txt" in ran, (done.stdout, done.stderr)


def test_xargs_runs_a_command_with_arguments_no_one_can_see_so_only_a_deny_or_a_refusal_answers(worktree):
    policy = policy_of(worktree, OPEN)
    assert refused(policy.judge_execute(["bash", "-c", "echo src/a.txt | xargs rm"]), "denied").rule_ids == ("no-rm",)
    reason = refused(policy.judge_execute(["xargs", "cat"]), "unsafe_argument").reason
    assert reason == {
        "kind": "unsafe_argument",
        "command": "xargs cat",
        "why": "xargs runs cat with arguments it reads from its input, which the policy cannot see",
    }
    expect(policy.judge_execute(["xargs", "echo"]), "allowed")  # echo opens nothing, whatever it is given
    assert refused(policy.judge_execute(["xargs", "-a", "src/pkg/secrets/k", "echo"]), "denied").rule_ids == (
        "no-secrets-read",
    )


@pytest.mark.parametrize(
    ("command", "why"),
    [("eval ls", "eval runs a string"), ("exec", "exec with no command"), ("exec > docs/x", "exec with no command"),
     ("env -S 'ls'", "env -S splits a string"), ("env -i ls", "env -i drops"), ("nice bash -c ls", "a shell started"),
     ("timeout 5 sh -c 'rm x'", "a shell started"), ("nice --bogus ls", "nice option --bogus is not one")],
)  # fmt: skip
def test_a_wrapper_whose_command_cannot_be_known_is_refused(worktree, command, why):
    verdict = refused(policy_of(worktree, OPEN).judge_execute(["bash", "-c", command]), "unsafe_argument")
    assert verdict.reason["why"].startswith(why), verdict


def test_curl_output_writes_the_file_it_names_as_curl_reads_it(tmp_path, worktree):
    """`--output` is curl's exact option, never `--output-dir`; what the policy judges written is what curl
    writes."""
    source = tmp_path / "source.txt"
    source.write_text("fetched\n")
    rules = [*CAREFUL, {"id": "curl", "kind": "execute", "commands": ["curl *"], "decision": "allow"}]
    verdict = expect(policy_of(worktree, rules).judge_execute(["curl", "--output", "src/x", "https://x"]), "allowed")
    assert "write-src" in verdict.rule_ids, verdict
    refused(policy_of(worktree, rules).judge_execute(["curl", "--output", "docs/x", "https://x"]), "unmatched")
    if shutil.which("curl") is None:
        pytest.skip("no curl here")
    (tmp_path / "src").mkdir()
    subprocess.run(["curl", "-s", "--output", "src/x", source.as_uri()], cwd=tmp_path, check=True, timeout=30)
    assert (tmp_path / "src" / "x").read_text() == "fetched\n"


def test_an_assignment_alone_needs_no_rule_unless_later_commands_would_see_it(worktree):
    """`X=1` alone sets a shell variable no program sees; bash's own (`PATH`, `IFS`, `CDPATH`) and any name in
    the commands' environment change what later commands run, and `export`/`set -a` would put it there."""
    kernel = policy_of(worktree, CAREFUL, exported=terminal_environment("token"))
    assert expect(kernel.judge_execute(["bash", "-c", "X=1"]), "allowed").rule_ids == ("builtin:assignment",)
    expect(kernel.judge_execute(["bash", "-c", "X=1 Y=2; LANG=C"]), "allowed")
    for script in ("PATH=docs", "IFS=/", "CDPATH=src", "HOME=docs", "GIT_CONFIG_COUNT=0", f"{TOKEN_VARIABLE}=x"):
        refused(kernel.judge_execute(["bash", "-c", script]), "unsafe_env")
    anything = policy_of(worktree, OPEN, exported=terminal_environment("token"))
    for script in ("X=1; export X", "declare -x X", "printf -v PATH docs", "read PATH", "unset PATH", "mapfile IFS",
                   "getopts a PATH"):  # fmt: skip
        refused(anything.judge_execute(["bash", "-c", script]), "unsafe_env")
    for script in ("set -a", "set -o allexport", "set -ek"):
        refused(anything.judge_execute(["bash", "-c", script]), "unsafe_argument")
    expect(anything.judge_execute(["bash", "-c", "printf -v X %s docs; unset X; set -e"]), "allowed")


#: A builtin that sets a variable: each of bash's own (PATH here) is refused however it is spelled, and a name of
#: no one's runs. Every form was checked against bash 5.2: each one sets the name it is judged by.
SETS_PATH = ["printf -v PATH docs", "printf -vPATH docs", "printf -- -v", "read PATH", "read -r PATH", "read -a PATH",
             "read -ra PATH", "read -d x PATH", "read -p prompt PATH", "read -n 1 -r PATH", "read -t1 PATH",
             "read -- PATH", "read -u 0 X PATH", "mapfile PATH", "mapfile -t PATH", "mapfile -d x PATH",
             "mapfile -n 1 PATH", "mapfile -O 0 PATH", "mapfile -- PATH", "readarray PATH", "readarray -t PATH",
             "unset PATH", "unset -v PATH", "unset X PATH", "getopts ab PATH", "getopts -- ab PATH", "let PATH=1",
             "let X=1 PATH=2", "export PATH", "declare -x PATH", "local PATH", "typeset +x PATH",
             "readonly PATH", "export -n PATH"]  # fmt: skip
SETS_ONLY_ITS_OWN = ["printf -v X docs", "read -r X", "read -ra X", "mapfile -t lines", "mapfile", "readarray X",
                     "unset X", "unset -f ls", "getopts ab opt", "let X=1", "set -e", "set -- -a", "set +a",
                     "set - -k", "set -o pipefail", "trap - EXIT", "trap '' INT", "trap -p", "trap -l", "alias",
                     "hash -r", "enable", "enable -p", "shopt -q extglob", "shopt"]  # fmt: skip


@pytest.mark.parametrize("script", SETS_PATH)
def test_a_builtin_that_sets_bash_s_own_variable_is_refused(worktree, script):
    if script == "printf -- -v":
        pytest.skip("printf -- -v prints '-v': the only spelling here that sets nothing")
    verdict = refused(policy_of(worktree, OPEN).judge_execute(["bash", "-c", script]), "unsafe_env")
    assert verdict.reason["names"] == ["PATH"], verdict


@pytest.mark.parametrize("script", SETS_ONLY_ITS_OWN)
def test_a_builtin_that_sets_a_variable_of_no_one_s_runs(worktree, script):
    expect(policy_of(worktree, OPEN).judge_execute(["bash", "-c", script]), "allowed")


@pytest.mark.parametrize(
    "script",
    ["set -a", "set -k", "set -ek", "set -ae", "set -o allexport", "set -o keyword", "set -e -o allexport",
     "trap 'rm src/a.txt' EXIT", "trap -- 'rm x' EXIT", "trap 'rm x' INT TERM", "alias ls=rm", "alias x=y ls=rm",
     "hash -p docs/git git", "hash -rp docs/git git", "enable -n cd", "enable -f x.so y", "shopt -s expand_aliases",
     "shopt -u sourcepath", "shopt -os posix", "mapfile -C 'rm x' -c 1 a", "readarray -tC cb a"],
)  # fmt: skip
def test_a_builtin_that_changes_what_later_lines_run_is_refused(worktree, script):
    refused(policy_of(worktree, OPEN).judge_execute(["bash", "-c", script]), "unsafe_argument")


@pytest.mark.parametrize("script", SETS_PATH[:12] + SETS_PATH[19:22] + ["getopts -- ab PATH -a", "let PATH=1"])
def test_each_spelling_really_sets_the_name_it_is_judged_by(script):
    """bash itself: after the builtin, PATH is not what it was (read, mapfile and getopts get input)."""
    if script == "printf -- -v":
        return
    probe = f"PATH=/before; {script} <<< 'x y' 2>/dev/null; echo \"[$PATH]\""
    done = subprocess.run(["/bin/bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert "[/before]" not in done.stdout, (script, done.stdout, done.stderr)


def test_a_directory_a_command_runs_in_is_judged_where_it_is_as_a_cwd(worktree):
    """`git -C DIR` and `env -C DIR` run the command in DIR: DIR is judged as a cwd is (a command runs where it
    could `ls`), relative to where the script is, and the refusal names the command."""
    policy = policy_of(worktree, CAREFUL_GIT)
    for command in ("git -C src/secret status", "env -C src/secret ls", "cd src && git -C secret status"):
        verdict = refused(policy.judge_execute(["bash", "-c", command]), "denied")
        assert verdict.reason == {"kind": "denied", "rule_id": "no-secret-read", "target": "src/secret",
                                  "command": command.split(" && ")[-1]}, verdict  # fmt: skip
    expect(policy.judge_execute(["bash", "-c", "git -C docs -C .. status"]), "allowed")  # `git status` in `.`
