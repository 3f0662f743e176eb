"""The classes of attack an adversarial review found under a careful user's policy (issue 8).

The policy of the review: `read **`, `write src/**`, a denied `src/secret/**`, and execute
`git status`, `git log *`, `git diff *`, `ls *`, `cat *`, `python -m pytest *`. Each class is a
table of variants judged by the policy as a pure function, and the worst of each goes through the
kernel with a real agent process, checking that the effect did not happen. The last table is the
other side: what a careful user allows must still work.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import Policy, Terminal
from harness.config._config import RuleConfig
from harness.policy._policy import Turn
from harness.policy._shell import Unparseable, parse_script
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import commit_step, scenario, turn, write_turn
from tests.helpers.policy_corpus import CAREFUL_CORE

pytestmark = LOOP_SCRIPTED

CAREFUL = [
    *CAREFUL_CORE,
    {"id": "diff", "kind": "execute", "commands": ["git diff *"], "decision": "allow"},
    {"id": "ls", "kind": "execute", "commands": ["ls", "ls *"], "decision": "allow"},
    {"id": "cat", "kind": "execute", "commands": ["cat", "cat *"], "decision": "allow"},
    {"id": "pytest", "kind": "execute", "commands": ["python -m pytest *"], "decision": "allow"},
    {"id": "api", "kind": "network", "hosts": ["api.github.com"], "decision": "allow"},
]


@pytest.fixture(name="worktree")
def worktree_fixture(tmp_path):
    root = tmp_path / "wt"
    for directory in ("src/secret", "src/ls\r", ".git/hooks", "docs"):
        (root / directory).mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "src" / "a.txt").write_text("a\n")
    (root / "src" / "secret" / "key").write_text("key\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return root


@pytest.fixture(name="policy")
def policy_fixture(worktree):
    return Policy([RuleConfig.model_validate(r) for r in CAREFUL], worktree)


def refused(verdict, *kinds):
    assert not verdict.allowed, verdict
    assert verdict.reason["kind"] in kinds, verdict.reason
    return verdict


# --- 1. the lexer is bash's -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    [
        "ls\r/../../../../../../usr/bin/touch pwned",  # bash runs a program named `ls\r/../..`
        "ls\x0b/../../usr/bin/touch pwned",
        "ls\x0c/../../usr/bin/touch pwned",
        "ls\r;touch pwned",  # `ls\r` is one word for bash: the allowed `ls` never runs
        "cat src/a.txt\r> .git/config",  # `src/a.txt\r` is the argument, `.git/config` the target
        "ls > src/ok\r/../../.git/config",  # the target is one word: it resolves into .git
        "ls src/a.txt\x00; touch pwned",
        "ls \ud800",
        "bash \u0662>/dev/null -c ls",  # an Arabic-Indic digit is a word for bash: it runs the file
        "bash 2147483648>/dev/null -c ls",  # past INT_MAX bash takes it for a word too
        "bash 12>/dev/null -c ls",  # dash reads `12` as a word, bash as an fd
        "ls >&\u0662",  # not a digit for bash: a file named so, outside src/
        "compgen -W 'x' x",
    ],
    ids=[
        "cr-path",
        "vt-path",
        "ff-path",
        "cr-semicolon",
        "cr-redirect",
        "cr-target",
        "nul",
        "surrogate",
        "unicode-fd",
        "huge-fd",
        "two-digit-fd",
        "unicode-dup",
        "compgen",
    ],
)
def test_bytes_bash_keeps_inside_a_word_stay_inside_it(policy, script):
    refused(
        policy.judge_execute(["bash", "-lc", script]), "unmatched", "unparseable", "protected_path", "outside_worktree"
    )


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("ls\ra b", [["ls\ra", "b"]]),
        ("ls\x0b\x0cx", [["ls\x0b\x0cx"]]),
        ("ls\u00a0src", [["ls\u00a0src"]]),  # a no-break space is no blank for bash either
        ("git status 2>&1 | cat", [["git", "status"], ["cat"]]),
        ("ls 'a b' \"c d\" e'f'g", [["ls", "a b", "c d", "efg"]]),
    ],
)
def test_words_are_split_where_bash_splits_them(script, words):
    assert [list(c.words) for c in parse_script(script).commands if c.words] == words


_FUZZ_PIECES = ["aa", "bb", "cc", "dd", "x=y", "'q r'", '"s t"', "'", '"', " ", " ", "\t", "\r", "\x0b", "\x0c",
                "\u00a0", "é", ";", "&", "&&", "|", "||", "|&", "\n", "(", ")", "#", "-e", "=", "2"]  # fmt: skip
BASH = shutil.which("bash") or "/bin/bash"
_BASH_BUILTINS = frozenset(subprocess.run([BASH, "-c", "compgen -b -k"], capture_output=True, text=True).stdout.split())


@pytest.mark.skipif(shutil.which("bash") is None, reason="the differential check needs bash")
def test_every_command_bash_runs_is_one_the_policy_judged(tmp_path):
    """Differential: random scripts from the bytes that matter run through real bash, whose
    command_not_found_handle logs each argv it would run; every one must be among the commands the
    parser returned (pipes and `&` reorder them, `||` may skip some: a multiset inclusion)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    logs = tmp_path / "argv"
    prelude = tmp_path / "prelude.sh"  # one file per command run: pipelines run them concurrently
    prelude.write_text(f"command_not_found_handle() {{ n=$((n+1)); printf '%s\\037' \"$@\" > {logs}/$BASHPID.$n; }}\n")
    rng = random.Random(8)
    judged = compared = 0
    for _ in range(400):
        script = "".join(rng.choice(_FUZZ_PIECES) for _ in range(rng.randint(1, 10)))
        try:
            commands = [c.words for c in parse_script(script).commands if c.words]
        except Unparseable:
            continue
        judged += 1
        if any(c[0] in _BASH_BUILTINS for c in commands):
            continue
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        env = {"PATH": str(empty), "BASH_ENV": str(prelude), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        subprocess.run([BASH, "-c", script], cwd=tmp_path, env=env, capture_output=True, timeout=10,
                       stdin=subprocess.DEVNULL, check=False)  # fmt: skip
        # bytes, not text: universal newlines would turn \r into \n
        ran = [tuple(f.read_bytes().decode().split("\x1f")[:-1]) for f in logs.iterdir()]
        remaining = list(commands)
        for argv in ran:
            assert argv in remaining, f"bash ran {argv!r} for {script!r}; the policy judged {commands!r}"
            remaining.remove(argv)
        compared += 1
    assert judged > 100 and compared > 80, (judged, compared)


# --- 2. shell options are bash's ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-", "-c", "ls src"],  # `-` ends the options: bash runs a file named -c
        ["sh", "-", "-c", "ls src"],
        ["bash", "--", "-c", "ls src"],
        ["bash", "-s", "-c", "ls src"],  # reads its commands from stdin
        ["bash", "-i", "-c", "ls src"],  # interactive: aliases, history, ~/.bashrc
        ["bash", "-O", "extglob", "-c", "ls src"],  # changes how the script is parsed
        ["bash", "-o", "history", "-c", "ls src"],
        ["bash", "+O", "extglob", "-c", "ls src"],
        ["bash", "--rcfile", "src/rc", "-c", "ls src"],
        ["bash", "-k", "-c", "ls src"],  # -k: assignments anywhere reach the environment
        ["bash", "-c"],
        ["bash"],  # reads stdin
        ["bash", "check.sh", "ls src"],  # runs the script file check.sh
        ["dash", "-c", "bash -s"],
        ["src/sh", "-c", "ls src"],  # a program named like a shell is not one
        ["/tmp/x/bash", "-c", "ls src"],
        ["src/git", "log", "-1"],  # nor is one named like git
    ],
)
def test_shell_options_are_parsed_as_bash_parses_them(policy, argv):
    refused(policy.judge_execute(argv), "unparseable", "unmatched")


@pytest.mark.parametrize(
    "argv",
    [["bash", "-lc", "ls src"], ["bash", "-c", "-l", "ls src"], ["bash", "-euo", "pipefail", "-c", "ls src"],
     ["sh", "-c", "ls src", "arg0"], ["bash", "--noprofile", "--norc", "-ec", "ls src"],
     ["bash", "-c", "--", "ls src"]],
)  # fmt: skip
def test_the_usual_wrappers_are_unwrapped(policy, argv):
    assert policy.judge_execute(argv).allowed


def test_a_script_file_named_like_an_option_never_runs(scripted_scenario, harness_config, run_loop, harness_workspace):
    plant = write_turn("src/-c", "touch pwned\n")["steps"]
    sneaky = {"terminal": {"command": "bash", "args": ["-", "-c", "ls src"], "cwd": "src"}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(*plant, sneaky)]})), rules=CAREFUL))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "unmatched"
    assert not (harness_workspace.path / "src" / "pwned").exists()


# --- 3. nested repositories -----------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("plant", "command", "cwd"),
    [
        ("src/sub/.git/config", "git status", "src/sub"),
        ("src/sub/.git/config", "git status", "src/sub/deeper"),
        ("src/sub/.git", "git diff HEAD", "src/sub"),  # a gitfile
        ("src/bare/HEAD", "git log -1", "src/bare"),  # a bare repository: HEAD, objects/, refs/
        ("src/sub/.git/config", "ls", "src/sub"),  # any program may run git (pytest plugins, make)
    ],
)
def test_commands_inside_a_nested_repository_are_refused(policy, worktree, plant, command, cwd):
    (worktree / plant).parent.mkdir(parents=True, exist_ok=True)
    (worktree / plant).write_text("[core]\n\tfsmonitor = touch pwned\n")
    (worktree / "src" / "bare" / "objects").mkdir(parents=True, exist_ok=True)
    (worktree / "src" / "bare" / "refs").mkdir(exist_ok=True)
    (worktree / cwd).mkdir(parents=True, exist_ok=True)
    refused(policy.judge_execute(command, cwd=str(worktree / cwd)), "nested_repository")
    with_cd = Policy(
        [*policy.rules, RuleConfig(id="cd", kind="execute", commands=["cd *"], decision="allow")], worktree
    )
    refused(with_cd.judge_execute(f"cd {cwd} && {command}"), "nested_repository")


@pytest.mark.parametrize(
    "command",
    ["git init src/sub", "git clone ../x src/sub", "git submodule add ../x src/sub", "git worktree add src/w",
     "git -c core.fsmonitor=touch status", "git --exec-path=src status", "git --git-dir=src/sub status",
     "git config core.fsmonitor 'touch pwned'", "git remote add evil ../x"],
)  # fmt: skip
def test_git_that_creates_repositories_or_rewrites_config_is_refused(worktree, command):
    everything = Policy([RuleConfig.model_validate({"id": "git", "kind": "execute", "commands": ["git *"],
                                                    "decision": "allow"}), *_reads()], worktree)  # fmt: skip
    refused(everything.judge_execute(command), "unsafe_argument")


def test_an_fsmonitor_in_a_nested_repository_never_runs(scripted_scenario, harness_config, run_loop, harness_workspace):
    ws = harness_workspace
    subprocess.run(["git", "init", "-q", str(ws.path / "src" / "sub")], check=True)
    marker = ws.path.parent / "fsmonitor-ran"
    (ws.path / "src" / "sub" / ".git" / "config").write_text(f"[core]\n\tfsmonitor = touch {marker}\n")
    ws.commit("ignore the nested repo", {".gitignore": "src/sub/\n"}, push=True)
    status = {"terminal": {"command": "git", "args": ["status"], "cwd": "src/sub"}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(status)]})), rules=CAREFUL))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "nested_repository"
    assert not marker.exists()


def test_a_bare_repository_a_script_completes_runs_nothing(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """Judged before it runs, `src/fake` is no repository; the script's first command gives it a HEAD, and
    git would take it for a bare repository and run the diff.external its config names. The kernel's git
    never takes a directory for a bare repository on its own (safe.bareRepository=explicit)."""
    ws = harness_workspace
    ws.commit("second", {"notes.txt": "x\n"}, push=True)
    fake = ws.path / "src" / "fake"
    subprocess.run(["git", "clone", "-q", "--bare", str(ws.path), str(fake)], check=True)
    (fake / "HEAD").unlink()
    marker = ws.path.parent / "diff-external-ran"
    (fake / "config").write_text(f'[core]\n\tbare = true\n[diff]\n\texternal = "touch {marker}"\n')
    ws.commit("ignore the fake", {".gitignore": "src/fake/\n"}, push=True)
    script = "echo ref: refs/heads/main > src/fake/HEAD && git -C src/fake diff HEAD~1 HEAD"
    rules = [*CAREFUL, {"id": "echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"}]
    work = {"terminal": {"command": "bash", "args": ["-c", script]}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(work)]})), rules=rules))

    assert (fake / "HEAD").exists(), "the script ran"
    assert not marker.exists(), "git ran the config of a bare repository the agent made"
    assert result.tasks[0].terminal is Terminal.COMPLETED


# --- 4. hard links --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["../outside.txt", ".git/config", "src/secret/key"])
@pytest.mark.parametrize("how", ["read", "write", "cat", "redirect"])
def test_a_hard_link_never_reaches_its_other_name(policy, worktree, target, how):
    os.link(worktree / target, worktree / "src" / "link.txt")
    verdict = {
        "read": lambda: policy.judge_read("src/link.txt"),
        "write": lambda: policy.judge_write("src/link.txt"),
        "cat": lambda: policy.judge_execute("cat src/link.txt"),
        "redirect": lambda: policy.judge_execute("ls > src/link.txt"),
    }[how]()
    refused(verdict, "hard_link")


def test_a_hard_linked_file_is_neither_written_nor_read_through_the_kernel(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    outside = harness_workspace.path.parent / "victim.txt"
    outside.write_text("precious\n")
    (harness_workspace.path / "src").mkdir()
    os.link(outside, harness_workspace.path / "src" / "link.txt")
    harness_workspace.commit("a link", {".gitignore": "src/link.txt\n"}, push=True)
    write = {"write": {"path": "src/link.txt", "content": "pwned\n"}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(write)]})), rules=CAREFUL))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "hard_link"
    assert outside.read_text() == "precious\n"


# --- 5. the paths arguments name ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("git log --output=.git/config", "protected_path"),
        ("git log --output=/tmp/x", "outside_worktree"),
        ("git log --output docs/x", "unmatched"),  # a write no write rule allows
        ("git diff --output=../x HEAD", "outside_worktree"),
        ("git diff --no-index /etc/passwd src/a.txt", "outside_worktree"),
        ("git diff --no-index ../outside.txt src/a.txt", "outside_worktree"),
        (f"cat /proc/{os.getppid()}/environ", "proc"),
        ("cat /proc/self/environ", "proc"),
        ("cat src/secret/key", "denied"),  # a read deny holds for what a command reads
        ("cat ../outside.txt", "outside_worktree"),
        ("ls -la /", "outside_worktree"),
        ("cat src/../src/secret/key", "denied"),
        ("git log -p -- src", "denied"),  # src is read whole, src/secret with it
        ("python -m pytest -p src.evil", "unsafe_argument"),
        ("python -m pytest -psrc.evil", "unsafe_argument"),
        ("python -m pytest --rootdir=/tmp", "outside_worktree"),
        ("python -m pytest -o cache_dir=/tmp/cache", "outside_worktree"),
        ("python -m pytest --override-ini=cache_dir=../c", "outside_worktree"),
        ("python -m pytest -o addopts=-pevil", "unsafe_argument"),
        ("python -m pytest --basetemp=/tmp/t", "outside_worktree"),
        ("python -m pytest --basetemp docs/t", "unmatched"),
        ("python -m pytest --junitxml=.git/hooks/pre-commit", "protected_path"),
        ("git log --format=%H file:///etc/passwd", "outside_worktree"),
        ("git log --outp=.git/config", "protected_path"),  # git's parse-options take abbreviations
        ("git diff --out docs/x HEAD", "unmatched"),
        ("git log --no-index -- .git/config", "protected_path"),  # git might write what it is given
        ("git log -p", "denied"),  # prints what every file held: src/secret too
        ("git diff HEAD~1", "denied"),
        ("git log -p -- 'src/secre?/key'", "denied"),  # a pathspec glob
        ("git log -p -- ':(icase)SRC/SECRET/KEY'", "denied"),  # pathspec magic
        ("git diff HEAD:src/secret/key src/a.txt", "denied"),
        ("git log --format=%H HEAD:src/secret/key", "denied"),
        ("python -m pytest -q -vo addopts=-psrc.evil", "unsafe_argument"),  # -v -o addopts=...
        ("python -m pytest -vp src.evil", "unsafe_argument"),
        ("python -m pytest -vo cache_dir=junk", "unmatched"),  # a write outside src/
    ],
)
def test_every_path_an_argument_names_is_judged(policy, command, why):
    refused(policy.judge_execute(command), why)


@pytest.mark.parametrize("command", ["/bin/rm -rf src", "./rm src", "rm -rf src", "/usr/bin/git push origin main"])
def test_a_deny_sees_the_program_by_its_name_wherever_it_lives(worktree, command):
    rules = [{"id": "all", "kind": "execute", "commands": ["*"], "decision": "allow"},
             {"id": "no-rm", "kind": "execute", "commands": ["rm *"], "decision": "deny"},
             {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"},
             *CAREFUL[:2]]  # fmt: skip
    verdict = refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command), "denied")
    assert verdict.rule_ids[0] in ("no-rm", "no-push")


def test_a_basetemp_outside_is_never_deleted(scripted_scenario, harness_config, run_loop, harness_workspace, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep\n")
    rules = [*CAREFUL, {"id": "py", "kind": "execute", "commands": [f"{sys.executable} -m pytest *"],
                        "decision": "allow"}]  # fmt: skip
    run = {"terminal": {"command": sys.executable, "args": ["-m", "pytest", f"--basetemp={victim}", "-q"]}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(run)]})), rules=rules))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "outside_worktree"
    assert (victim / "keep.txt").read_text() == "keep\n"


def test_the_kernels_environment_is_never_read(scripted_scenario, harness_config, run_loop, harness_workspace):
    steal = {"terminal": {"command": "cat", "args": [f"/proc/{os.getpid()}/environ"]}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(steal)]})), rules=CAREFUL))
    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "proc"


# --- 7. the turn gate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("turn_", "session", "why"),
    [
        (Turn(None, frozenset({"s1"})), "s1", "outside_turn"),  # after the turn's answer
        (Turn("s2", frozenset({"s1", "s2"})), "s1", "outside_turn"),  # an earlier task's session
        (Turn("s1", frozenset({"s1"})), "s9", "unknown_session"),
        (Turn(None, frozenset()), "s1", "unknown_session"),  # before any turn
    ],
)
def test_only_the_running_turns_session_may_act(policy, turn_, session, why):
    refused(policy.write(session, "src/ok.txt", turn_), why)
    refused(policy.read(session, "src/a.txt", turn_), why)
    refused(policy.terminal(session, "ls", [], {}, None, turn_), why)
    verdict = refused(policy.permission(session, {"kind": "read", "locations": [{"path": "src/a.txt"}]},
                                        [("ok", "allow_once"), ("no", "reject_once")], turn_), why)  # fmt: skip
    assert verdict.option_id == "no"
    assert policy.write("s1", "src/ok.txt", Turn("s1", frozenset({"s1"}))).allowed


@pytest.mark.parametrize(
    "late",
    [{"write": {"path": "src/late.txt", "content": "late\n"}},
     {"terminal": {"command": "ls", "args": ["src"]}},
     {"write": {"path": "src/late.txt", "content": "late\n", "session": "sess_999"}}],
    ids=["write", "terminal", "stray-session"],
)  # fmt: skip
def test_a_call_after_the_turns_answer_is_refused_and_stops_the_run(
    scripted_scenario, harness_config, run_loop, harness_workspace, late
):
    done = write_turn("src/a.txt", "a\n", commit="T1")
    done["after_stop"] = [late]
    tasks = [{"id": "T1", "title": "one"}, {"id": "T2", "title": "two"}]
    result = run_loop(harness_config(scripted_scenario(scenario({None: [done]})), rules=[*CAREFUL, _git_all()],
                                     tasks=tasks))  # fmt: skip

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] in ("outside_turn", "unknown_session")
    assert not (harness_workspace.path / "src" / "late.txt").exists()
    assert [t.id for t in result.tasks] in (["T1"], ["T1", "T2"])  # T2 never completes after it
    assert all(t.terminal is not Terminal.COMPLETED for t in result.tasks[1:])


# --- 8. URL hosts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["https://evil.example\\@api.github.com/", "https://evil.example\\.api.github.com/",
     "https://api.github.com@evil.example/", "https://user:pw@api.github.com/", "https:api.github.com",
     "https://api.github.com%2f@evil.example/", "https://%61pi.github.com/", "https://api.github.com\t.evil/",
     "https://\uff41pi.github.com/", "https://api.github.com\n/", "api.github.com@evil.example"],
)  # fmt: skip
def test_urls_a_whatwg_parser_reads_otherwise_are_refused(policy, url):
    refused(policy.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}), "unparseable", "unmatched")


@pytest.mark.parametrize("url", ["https://api.github.com/repos/x", "https://API.github.com:443/x", "api.github.com"])
def test_plain_urls_reach_their_host(policy, url):
    assert policy.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}).allowed


# --- 9. hidden changes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hider",
    [{"src/.gitignore": "*\n"}, {"src/.gitignore": "/.gitignore\nleft.txt\n"},
     {"src/deep/.gitignore": "*\n", "src/deep/x.txt": "x\n"}],
    ids=["star", "itself", "deeper"],
)  # fmt: skip
def test_a_task_cannot_hide_what_it_left(scripted_scenario, harness_config, run_loop, hider):
    writes = [{"write": {"path": path, "content": content}} for path, content in hider.items()]
    left = turn({"tool_call": {"title": "hide", "kind": "edit", "locations": ["src/left.txt"], "permission": True}},
                {"write": {"path": "src/left.txt", "content": "left\n"}}, *writes)  # fmt: skip
    tasks = [{"id": "T1", "title": "one"}, {"id": "T2", "title": "two"}]
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [left], "T2": [left]})), tasks=tasks))

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert (result.reason["check"], result.reason["left_by_task"]) == ("git_clean_tree", "T1")
    assert any(".gitignore" in change for change in result.reason["changes"])


# --- no false positives ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    ["git status", "git log --oneline -5", "ls src", "ls", "cat src/a.txt", "ls src > src/listing.txt",
     "git status 2>&1 | cat", "git log --format='%h %s' -- docs", "cat src/a.txt >> src/b.txt",
     "git status > /dev/null 2>&1", "python -m pytest -q docs", "python -m pytest -p no:cacheprovider",
     "git log --output=src/log.txt", "ls && git status\ncat src/a.txt", "cat src/a.txt >/dev/stderr",
     "ls 1>/dev/stdout 2>/dev/null"],
)  # fmt: skip
def test_what_a_careful_user_allows_still_works(policy, command):
    assert policy.judge_execute(["/bin/bash", "-lc", command]).allowed, policy.judge_execute(command)


def test_a_careful_task_still_completes(scripted_scenario, harness_config, run_loop, harness_workspace):
    work = turn(
        *write_turn("src/a.txt", "a\n")["steps"],
        {"terminal": {"command": "bash", "args": ["-lc", "git status 2>&1 | cat > src/status.txt"]}},
        {"terminal": {"command": "bash", "args": ["-lc", "ls src && cat src/a.txt"], "on_failure": "end_turn"}},
        commit_step("T1"),
    )
    rules = [*CAREFUL, _git_all(), {"id": "sh", "kind": "execute", "commands": ["cat"], "decision": "allow"}]
    config = harness_config(scripted_scenario(scenario({"T1": [work]})), rules=rules, commit={"message": "{id}"})
    result = run_loop(config)  # the kernel commits: nothing left behind (issue 30)
    assert result.terminal is Terminal.IDLE, result.reason
    assert (harness_workspace.path / "src" / "status.txt").read_text().startswith("On branch main")


def _git_all():
    return {"id": "git-all", "kind": "execute", "commands": ["git *"], "decision": "allow"}


def _reads():
    return [RuleConfig.model_validate(CAREFUL[0]), RuleConfig.model_validate(CAREFUL[1])]


# --- programs planted where a trusted name would find them ---------------------------------------


def test_path_keeps_no_directory_the_agent_can_write(policy, worktree):
    outside = "/usr/local/bin:/usr/bin"
    value = f"{worktree}/src/bin:bin:.:{worktree}/docs/bin::{outside}"
    assert policy.search_path(value) == f"{worktree}/docs/bin:{outside}"  # docs/ is not writable


def test_a_planted_git_on_path_never_runs(scripted_scenario, harness_config, run_loop, harness_workspace, monkeypatch):
    ws = harness_workspace
    marker = ws.path.parent / "planted-git-ran"
    planted = ws.write("src/bin/git", f"#!/bin/sh\ntouch {marker}\n")
    planted.chmod(0o755)
    ws.commit("ignore the planted program", {".gitignore": "src/bin/\n"}, push=True)
    monkeypatch.setenv("PATH", f"{planted.parent}:src/bin:{os.environ['PATH']}")
    status = {"terminal": {"command": "git", "args": ["status"], "on_failure": "end_turn"}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(status)]})), rules=CAREFUL))

    assert result.terminal is Terminal.IDLE, result.reason
    assert not marker.exists()


# --- one place decides: permission answers and terminals as a pure function -----------------------

OPTIONS = [("ok", "allow_once"), ("always", "allow_always"), ("no", "reject_once")]
HOST_TOOL = {"title": "mcp__loop-harness-host__open_proposal", "kind": "other", "rawInput": {}}
IN_TURN = Turn("s1", frozenset({"s1"}), frozenset({"get_issue"}))


@pytest.mark.parametrize(
    ("tool_call", "options", "turn_", "allowed", "option", "why"),
    [
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS, IN_TURN, True, "ok", "allowed"),
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS[1:], IN_TURN, False, "no",
         "no_allow_once_option"),  # never allow_always: the agent could keep it past the policy
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS[1:2], IN_TURN, False, None,
         "no_allow_once_option"),  # nothing to reject with: answered `cancelled`
        ({"kind": "edit", "locations": [{"path": "docs/a.md"}]}, OPTIONS, IN_TURN, False, "no", "unmatched"),
        ({**HOST_TOOL, "title": "mcp__loop-harness-host__get_issue"}, OPTIONS, IN_TURN, True, "ok", "host_tool"),
        (HOST_TOOL, OPTIONS, IN_TURN, False, "no", "unmatched"),  # not in the role's allowlist
        ({**HOST_TOOL, "title": "mcp__other__get_issue"}, OPTIONS, IN_TURN, False, "no", "unmatched"),
        ({**HOST_TOOL, "kind": "execute", "title": "mcp__loop-harness-host__get_issue"}, OPTIONS, IN_TURN, False,
         "no", "no_target"),  # a host tool's title on another kind is that kind's request
    ],
)  # fmt: skip
def test_permission_answers(policy, tool_call, options, turn_, allowed, option, why):
    verdict = policy.permission("s1", tool_call, options, turn_)
    assert (verdict.allowed, verdict.option_id, verdict.reason["kind"]) == (allowed, option, why)


@pytest.mark.parametrize(
    ("command", "args", "env", "cwd", "argv", "why"),
    [
        ("git", ["status"], {}, None, ("git", "status"), "allowed"),
        ("git status && ls src", None, {}, None, ("bash", "-c", "git status && ls src"), "allowed"),
        ("git status && touch x", None, {}, None, None, "unmatched"),
        ("ls", [], {"LANG": "C", "CLAUDECODE": "1"}, "src", ("ls",), "allowed"),
        ("ls", [], {"GIT_DIR": "x"}, None, None, "unsafe_env"),
        ("ls", [], {"PATH": "src"}, None, None, "unsafe_env"),
        ("ls", [], {}, "/tmp", None, "outside_worktree"),
    ],
)
def test_terminals(policy, worktree, command, args, env, cwd, argv, why):
    verdict = policy.terminal("s1", command, args, env, cwd and str(worktree / cwd), IN_TURN)
    assert verdict.reason["kind"] == why
    if argv is not None:
        assert (Path(verdict.argv[0]).name, *verdict.argv[1:]) == argv
        assert verdict.workdir == str(worktree / (cwd or "") if cwd else worktree)


# --- second review: cd as bash does it, more git, sed, clusters ------------------------------------

WITH_CD = [*CAREFUL, {"id": "cd", "kind": "execute", "commands": ["cd *", "echo *"], "decision": "allow"}]


@pytest.fixture(name="linked")
def linked_fixture(worktree):
    """`up` -> src/a/b: bash's cd reads `up/..` as `.`, the kernel as src/a."""
    (worktree / "src" / "a" / "b").mkdir(parents=True)
    os.symlink("src/a/b", worktree / "up")
    return Policy([RuleConfig.model_validate(r) for r in WITH_CD], worktree)


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("(cd up/../src/secret && cat key)", "denied"),  # bash is in src/secret; the kernel's reading, src/a/...
        ("cd up/../.. && cat outside.txt", "outside_worktree"),
        ("cd up/.. && echo x > docs.txt", "unmatched"),  # bash writes ./docs.txt, not src/a/docs.txt
        ("cd src; echo x > y.txt", "unmatched"),  # if the cd fails, y.txt is written where the script began
        ("(cd src) && echo x > y.txt", "unmatched"),  # a subshell's cd ends with it
        ("bash -c 'cd src' && echo x > y.txt", "unmatched"),  # so does a nested shell's
        ("cd src | echo x > y.txt", "unmatched"),
    ],
)
def test_cd_is_judged_as_bash_moves(linked, script, why):
    refused(linked.judge_execute(["bash", "-c", script]), why)


@pytest.mark.parametrize(
    "script", ["cd src && echo x > y.txt", "cd src && (echo x > y.txt)", "cd up/.. && cd src && echo x > y.txt"]
)
def test_cd_then_and_writes_where_the_cd_led(linked, script):
    assert linked.judge_execute(["bash", "-c", script]).allowed


def test_a_logical_cd_never_reads_a_denied_file(scripted_scenario, harness_config, run_loop, harness_workspace):
    ws = harness_workspace
    (ws.path / "src" / "a" / "b").mkdir(parents=True)
    (ws.path / "src" / "a" / "b" / "keep").write_text("\n")
    os.symlink("src/a/b", ws.path / "up")
    ws.commit("a link", {"src/secret/key": "TOPSECRET\n"}, push=True)
    peek = {"terminal": {"command": "bash", "args": ["-c", "cd up/../src/secret && cat key"]}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(peek)]})), rules=WITH_CD))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "denied"
    assert "TOPSECRET" not in result.transcript.read_text()


@pytest.mark.parametrize(
    "command",
    ["git log -U1", "git log --unified=0", "git log --binary", "git log --remerge-diff", "git whatchanged -1",
     "git log -1 --stat", "git log --oneline -p"],
)  # fmt: skip
def test_git_log_that_prints_diffs_reads_the_whole_worktree(worktree, command):
    everything = Policy([RuleConfig.model_validate(r) for r in [*CAREFUL, _git_all()]], worktree)
    refused(everything.judge_execute(command), "denied")


@pytest.mark.parametrize(
    "command",
    ["git merge-tree a b c", "git request-pull -p HEAD~1 origin HEAD", "git checkout-index -a --prefix=src/leak/",
     "git ls-remote --upload-pac=touch origin", "git fetch --upload-pa=touch origin", "git rebase --exe=touch HEAD~1",
     "git rebase -fx touch HEAD~1", "git grep -iO x"],
)  # fmt: skip
def test_more_git_that_reads_everything_or_runs_programs(worktree, command):
    everything = Policy([RuleConfig.model_validate(r) for r in [*CAREFUL, _git_all()]], worktree)
    refused(everything.judge_execute(command), "denied", "unsafe_argument")


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("sed --i s/a/b/ docs/t.txt", "unmatched"),  # --i is --in-place
        ("sed -ni 1p docs/t.txt", "unmatched"),
        ("sed -n 'w docs/w.txt' src/a.txt", "unsafe_argument"),
        ("sed '1e touch pwned' src/a.txt", "unsafe_argument"),
        ("sed 's/a/b/w docs/w.txt' src/a.txt", "unsafe_argument"),
        ("sed 1r/etc/passwd src/a.txt", "unsafe_argument"),
        ("sed -f script.sed src/a.txt", "unsafe_argument"),
        ("sort -uo docs/sorted src/a.txt", "unmatched"),  # -o inside a cluster
        ("cp -vt docs src/a.txt", "unmatched"),
        ("ls -R src", "denied"),  # lists what src/secret holds
    ],
)
def test_writes_hidden_in_scripts_and_clusters(worktree, command, why):
    rules = [*CAREFUL, {"id": "tools", "kind": "execute", "commands": ["sed *", "sort *", "cp *"], "decision": "allow"}]
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command), why)


@pytest.mark.parametrize(
    "command", ["sed -n 1,10p src/a.txt", "sed -i 's/a/b/g' src/a.txt", "sed '/x/d;$a end' src/a.txt"]
)
def test_ordinary_sed_still_works(worktree, command):
    rules = [*CAREFUL, {"id": "sed", "kind": "execute", "commands": ["sed *"], "decision": "allow"}]
    assert Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command).allowed


# --- third review: where commands run, sed as getopt reads it, recursive readers, git's pathspecs -----


class _Spy(Policy):
    """A policy that remembers where it judged each command to run (for the differential check below)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.places: dict[str, list[str]] = {}

    def _judge_step(self, step, cwds, approvals):
        if step.words:
            self.places[step.words[0]] = list(cwds)
        return super()._judge_step(step, cwds, approvals)


def test_every_command_runs_where_the_policy_judged_it(tmp_path):
    """Differential: random scripts of `cd`s, probes and operators run through real bash; each probe logs
    the directory it really ran in, which must be one of the places the policy judged it in."""
    root = tmp_path / "wt"
    for directory in ("src/a/b", "docs", "src/pkg"):
        (root / directory).mkdir(parents=True)
    os.symlink("src/a/b", root / "up")
    rules = [{"id": "all", "kind": "execute", "commands": ["*"], "decision": "allow"}, *CAREFUL[:2]]
    empty = tmp_path / "bin"
    empty.mkdir()
    os.symlink(BASH, empty / "bash")  # the only program there: nested shells run, every probe is "not found"
    logs = tmp_path / "where"
    prelude = tmp_path / "prelude.sh"
    prelude.write_text(f'command_not_found_handle() {{ pwd -P > {logs}/"$1"; return ${{2:-0}}; }}\n')
    places = ["src", "src/a", "docs", "nope", "up", "up/..", "up/../docs", "src/pkg", "."]
    operators = [" && ", " || ", "; ", " | ", "\n", " & "]
    rng = random.Random(80)
    compared = 0
    for _ in range(300):
        parts = []
        for index in range(rng.randint(2, 7)):
            part = f"cd {rng.choice(places)}" if rng.random() < 0.5 else f"probe{index} {rng.choice([0, 1])}"
            if rng.random() < 0.15:
                part = f"( {part} )" if rng.random() < 0.5 else f"bash -c '{part}'"
            parts.append(part)
        script = parts[0] + "".join(rng.choice(operators) + p for p in parts[1:])
        spy = _Spy([RuleConfig.model_validate(r) for r in rules], root)
        if not spy.judge_execute(["bash", "-c", script]).allowed:
            continue
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        env = {"PATH": str(empty), "BASH_ENV": str(prelude), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        subprocess.run([BASH, "-c", f"{script}\nwait"], cwd=root, env=env, capture_output=True, timeout=10, check=False)
        for log in logs.iterdir():
            judged = {os.path.realpath(root / p) for p in spy.places[log.name]}
            assert log.read_text().strip() in judged, f"{log.name} ran elsewhere in {script!r}: judged {judged}"
            compared += 1
    assert compared > 300, compared


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("ls || cd src/x/y && echo pwned > ../../../../pwn", "outside_worktree"),  # `ls` ran: the cd never did
        ("ls | cd src && echo pwned > README.md", "unmatched"),  # a pipeline's cd moves nothing
        ("ls || cd src && cat src/secret/key", "denied"),
        ("cd nope || (ls) && cat src/secret/key", "denied"),
        ("cd nope || bash -c ls && cat src/secret/key", "denied"),
        ("pushd src && popd && cat src/secret/key", "denied"),
        ("cd src & cat src/secret/key", "denied"),
    ],
)
def test_where_a_cd_cannot_have_moved_the_shell(worktree, script, why):
    rules = [*CAREFUL, {"id": "moves", "kind": "execute", "commands": ["cd *", "pushd *", "popd", "echo *"],
                        "decision": "allow"}]  # fmt: skip
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", script]), why)


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("sed '-nee touch pwned'", "unsafe_argument"),  # -n -e 'e touch pwned'
        ("sed -n 't;e touch pwned'", "unsafe_argument"),  # a label ends at `;`
        ("sed '-new ../pwned'", "unsafe_argument"),
        ("sed -n ':a;w ../pwned'", "unsafe_argument"),
        ("sed -nep src/secret/../../src/secret/key", "denied"),  # the file operand, not a script
        ("sed --expr=p src/secret/key", "denied"),
        ("sed -i --expr=s/x/P/ src/../../outside.txt", "outside_worktree"),
        ("sed -i -Ees/x/P/ docs/x.txt", "unmatched"),
        ("grep -r TOP", "denied"),  # reads where it runs, src/secret too
        ("grep -d recurse TOP", "denied"),
        ("ls -R", "denied"),
        ("git add -A && git commit --dry-run -v", "denied"),  # prints the staged diff
        ("git add ':(top)src/secret'", "denied"),  # pathspec magic
        ("git add 'src/secre?/*'", "denied"),  # a pathspec glob
        ("git commit --allow-empty -qFsrc/secret/key", "denied"),  # -q -F src/secret/key
        ("grep -hfsrc/secret/key src/a.txt", "denied"),
    ],
)
def test_hidden_reads_and_writes_found_in_the_third_review(worktree, command, why):
    rules = [*CAREFUL, _git_all(), {"id": "tools", "kind": "execute", "commands": ["sed *", "grep *"],
                                    "decision": "allow"}]  # fmt: skip
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", command]), why)


@pytest.mark.parametrize(
    "command",
    ["git log -n5 --oneline", "git log --oneline -- src", "sed -n '1,+3p' src/a.txt", "cd src && ls && cd .. && ls",
     "grep -rn TODO src/a.txt", "git commit -qam 'fix: a/b?'"],
)  # fmt: skip
def test_ordinary_work_the_third_review_found_refused(worktree, command):
    rules = [*CAREFUL, _git_all(), {"id": "tools", "kind": "execute", "commands": ["sed *", "grep *", "cd *"],
                                    "decision": "allow"}]  # fmt: skip
    verdict = Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", command])
    assert verdict.allowed, verdict


# --- fourth review: programs the kernel had no table for -----------------------------------------

TOOLS = [*CAREFUL, {"id": "tools", "kind": "execute", "decision": "allow", "commands": [
    f"{p} *" for p in ("head", "tail", "wc", "diff", "tar", "tee", "touch", "mkdir", "mv", "cp", "ln", "uniq", "shuf",
                       "split", "cut", "echo", "zip", "unzip", "install", "patch", "rm", "chmod", "gcc")]}]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("split --filter='touch pwned' src/a.txt", "unsafe_argument"),
        ("zip src/z.zip src/a.txt -T --unzip-command='cat src/secret/key'", "unsafe_argument"),
        ("zip -q src/z.zip src/a.txt -T -TT 'touch pwned'", "unsafe_argument"),
        ("install -s --strip-program=sh src/evil src/out", "unsafe_argument"),
        ("tar -cf x:y --rsh-command=src/evil src/a.txt", "unsafe_argument"),
        ("tar -vCsrc/secret -cf - key", "unsafe_argument"),  # -C moves where names resolve
        ("tar -vC/etc -cf - hostname", "unsafe_argument"),
        ("tar -cf/tmp/out.tar src/a.txt", "outside_worktree"),
        ("tar -xf src/h.tar", "unsafe_argument"),  # extracting writes the names the archive holds
        ("tar xf src/h.tar", "unsafe_argument"),
        ("tar -cf - -T src/list", "unsafe_argument"),
        ("tar -cf src/h.tar --transform=s,^src/pc,.git/hooks/pre-commit, src/pc", "unsafe_argument"),
        ("unzip -qd/tmp/uz src/z.zip", "unsafe_argument"),
        ("patch -p1 src/a.txt src/p.diff", "unsafe_argument"),
        ("shuf -eo/tmp/shuf.out hi", "outside_worktree"),
        ("cat - 0<>src/secret/key", "denied"),  # `<>` reads as well as writes
        ("mv src/secret/key src/k", "denied"),  # what is moved is read
        ("uniq src/a.txt docs/uniq", "unmatched"),  # the second operand is the output
        ("shuf -o docs/x src/a.txt", "unmatched"),
        ("split src/a.txt docs/pre", "unmatched"),
        ("tar -cf docs/x.tar src/a.txt", "unmatched"),
        ("tar czf docs/x.tgz src/a.txt", "unmatched"),
        ("wc --files0-from=src/list", "unsafe_argument"),
        ("rm /dev/null", "outside_worktree"),  # a device is no argument to write
        ("mv src/a.txt /dev/stdout", ("proc", "outside_worktree")),  # where the test's stdout really is
        ("touch /dev/stdout", ("proc", "outside_worktree")),
        ("ln src/a.txt", "unmatched"),  # makes ./a.txt at the root
    ],
)
def test_programs_without_a_table_still_name_their_files(worktree, command, why):
    kinds = why if isinstance(why, tuple) else (why,)
    policy = Policy([RuleConfig.model_validate(r) for r in TOOLS], worktree)
    refused(policy.judge_execute(["bash", "-c", command]), *kinds)


@pytest.mark.parametrize(
    "command",
    ["cut -d/ -f2 src/a.txt", "cut -d / -f1 src/a.txt", "echo done: /", "head -c 100 /dev/urandom",
     "tar czf src/x.tgz src/a.txt", "tar -tf src/x.tgz", "gcc -osrc/app -Wall -O2 src/a.c", "unzip -l src/z.zip",
     "diff src/a.txt /dev/null"],
)  # fmt: skip
def test_ordinary_work_with_those_programs(worktree, command):
    verdict = Policy([RuleConfig.model_validate(r) for r in TOOLS], worktree).judge_execute(["bash", "-c", command])
    assert verdict.allowed, verdict


# --- fifth review: the kernel's side of the turn ---------------------------------------------------


def test_an_answer_spelled_two_ways_is_no_answer(scripted_scenario, harness_config, run_loop, harness_workspace):
    """`"method": null` is an answer to the SDK and a request to a reader of `"method" in message`: framing."""
    fake = {"jsonrpc": "2.0", "id": 2, "method": None, "result": {"stopReason": "end_turn"}}
    late = {"write": {"path": "src/late.txt", "content": "late\n"}}
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn({"garbage": {"text": json.dumps(fake)}},
                                                                             late)]}))))  # fmt: skip
    assert result.terminal is Terminal.FAILED
    assert (result.reason["kind"], result.reason["error"]) == ("framing_error", "JSON-RPC method is not a name")
    assert not (harness_workspace.path / "src" / "late.txt").exists()


@pytest.mark.parametrize(
    ("method", "session", "when", "why"),
    [
        ("terminal/output", "no-such-session", "in_turn", "unknown_session"),
        ("terminal/kill", None, "after_stop", "outside_turn"),
        ("terminal/release", None, "after_stop", "outside_turn"),
        ("terminal/output", None, "after_release", "outside_turn"),  # the id is gone: still the gate's call
    ],
)
def test_terminal_calls_belong_to_the_running_turns_session(
    scripted_scenario, harness_config, run_loop, method, session, when, why
):
    rules = [*CAREFUL, {"id": "sleep", "kind": "execute", "commands": ["sleep *"], "decision": "allow"}]
    raw = {"jsonrpc": "2.0", "id": 901, "method": method, "params": {"sessionId": session or "sess_1",
                                                                      "terminalId": "term_1"}}  # fmt: skip
    poke = {"garbage": {"text": json.dumps(raw)}}
    start = {"terminal": {"command": "sleep", "args": ["30" if when != "after_release" else "0"],
                          "wait": when == "after_release"}}  # fmt: skip
    work = turn(start, {"sleep": 0.3}, poke, {"sleep": 0.3}) if when == "in_turn" else turn(start, {"sleep": 0.2})
    scripts, tasks = {"T1": [work]}, [{"id": "T1", "title": "one"}]
    if when != "in_turn":
        # The agent writes the poke before it reads T2's session/new, so the kernel always reads it
        # while it still runs: the run cannot end before the late call arrives (no race with teardown).
        work["after_stop"] = [poke]
        scripts["T2"] = [turn({"sleep": 0.5})]
        tasks.append({"id": "T2", "title": "two"})
    result = run_loop(harness_config(scripted_scenario(scenario(scripts)), rules=rules, tasks=tasks))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["source"] == method
    assert result.reason["refusal"]["kind"] == why
    assert all(t.terminal is not Terminal.COMPLETED for t in result.tasks[1:])  # nothing completes after it


def test_a_decision_is_on_record_before_it_is_acted_on(scripted_scenario, harness_config, run_loop, harness_workspace):
    """The transcript holds the decision before the file is written (a kernel stopped mid-write loses nothing)."""
    target = harness_workspace.path / "src" / "a.txt"
    seen: list[bool] = []

    def observe(record):
        if record["type"] == "policy" and record["source"] == "fs/write_text_file":
            seen.append(target.exists())

    run_loop(harness_config(scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n")]}))), observer=observe)
    assert seen == [False] and target.read_text() == "a\n"


def test_an_agent_cannot_ask_the_kernel_to_keep_unbounded_output(tmp_path):
    from harness.sandbox._exec import MAX_OUTPUT_LIMIT, ExecHost

    async def run() -> dict:
        host = ExecHost(dict(os.environ))
        terminal = await host.create("s1", ["head", "-c", str(MAX_OUTPUT_LIMIT + (1 << 20)), "/dev/zero"],
                                     cwd=str(tmp_path), output_byte_limit=10**11)  # fmt: skip
        await host.wait_for_exit(terminal)
        await asyncio.sleep(0.2)
        out = host.output(terminal)
        await host.release_all()
        return out

    out = asyncio.run(run())
    assert out["truncated"] and len(out["output"]) <= MAX_OUTPUT_LIMIT
