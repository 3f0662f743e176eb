"""Regression tests for ways around the policy found in review: each must be refused, and the
effect must not happen. Unit cases first, then the kernel against a real agent process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import ConfigError, Policy, Terminal, read_transcript
from harness.config._config import RuleConfig
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.testing import READ_ALL
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

EVERYTHING = [
    READ_ALL,
    {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"},
    {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"},
    {"id": "cd", "kind": "execute", "commands": ["cd *"], "decision": "allow"},
    {"id": "echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"},
    {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"},
    {"id": "no-secrets", "kind": "write", "paths": ["src/secrets/**"], "decision": "deny"},
]


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


def test_a_comment_cannot_smuggle_a_command_into_a_terminal(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    sneaky = {"terminal": {"command": "git status # '\ntouch pwned\n#'"}}  # no args: a script for bash -c
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [turn(sneaky)]}))))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "unparseable" and "comment" in result.reason["refusal"]["why"]
    assert not (harness_workspace.path / "pwned").exists()


def test_the_worktree_at_the_filesystem_root_resolves_paths_whole(tmp_path):
    assert Policy([RuleConfig.model_validate(EVERYTHING[0])], Path("/")).resolve("/etc/passwd") == "etc/passwd"


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


# --- against the real agent process ------------------------------------------------------------


@pytest.mark.parametrize("name", ["BASH_FUNC_git%%", "HOME", "XDG_CONFIG_HOME", "PAGER", "GCONV_PATH"])
def test_terminal_env_is_an_allowlist(scripted_scenario, harness_config, run_loop, name):
    hijack = turn({"terminal": {"command": "git", "args": ["status"], "env": {name: "() { touch pwned; }"}}})
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [hijack]}))))
    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"] == {"kind": "unsafe_env", "names": [name]}


def test_the_interactive_path_runs_no_command_nobody_approved(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    sneaky = turn({"terminal": {"command": "bash", "args": ["-c", "touch pwned"]}})
    path = scripted_scenario(scenario({None: [sneaky]}))
    result = run_loop(
        harness_config(path, rules=[]), prompt="hi", interactive_handler=lambda p: {"outcome": "cancelled"}
    )

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "not_approved"
    assert not (harness_workspace.path / "pwned").exists()


def test_reading_a_fifo_is_an_error_not_a_hang(scripted_scenario, harness_config, run_loop, harness_workspace):
    harness_workspace.commit("ignore the pipe", {".gitignore": "pipe\n"}, push=True)
    os.mkfifo(harness_workspace.path / "pipe")
    read = turn({"read": {"path": "pipe"}})
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [read]}))))

    failed = [r for r in read_transcript(result.transcript)
              if r["type"] == "rpc" and "not a regular file" in str(r["msg"])]  # fmt: skip
    assert failed, "the read was answered with an error"
    assert result.tasks[0].terminal is Terminal.COMPLETED  # the turn went on, nothing hung


def test_a_command_that_backgrounds_a_child_does_not_block_its_wait(scripted_scenario, harness_config, run_loop):
    rules = [
        *EVERYTHING[:1],
        {"id": "sleep", "kind": "execute", "commands": ["sleep *", "echo *"], "decision": "allow"},
    ]
    background = turn({"terminal": {"command": "bash", "args": ["-c", "sleep 60 & echo started"]}})
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [background]})), rules=rules,
                                     limits={"turn_timeout_s": 20}))  # fmt: skip
    assert result.terminal is Terminal.IDLE  # not a turn timeout
    waits = [r["msg"]["result"] for r in read_transcript(result.transcript)
             if r["type"] == "rpc" and r["dir"] == "out" and "exitCode" in (r["msg"].get("result") or {})]  # fmt: skip
    assert waits == [{"exitCode": 0}]
