"""Issue 34 through the CLI and a real sandbox: a search the policy now allows reads nothing masked, and the
names a sandboxed command starts with are the ones the policy knows (`X=1` alone is judged by them).
The in-process tables of the same issue are in test_policy_refuse_less.py (which `make mutation` runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import read_transcript
from harness.kernel._assembly import terminal_environment
from harness.policy._scripts import ALWAYS_EXPORTED
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._recovery import TOKEN_VARIABLE
from harness.testing import agent_messages, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn
from tests.helpers.policy_corpus import CAREFUL

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
CAREFUL_GIT = [*CAREFUL, {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"}]


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
def test_a_search_through_the_cli_runs_in_the_sandbox_and_finds_no_masked_or_linked_text(tmp_path, mode):
    """The agent asks to search the worktree and greps it itself: in the sandbox the request is allowed and the
    search finds the public file but neither the denied one nor the hard-linked one (both masked); with the
    sandbox off the request is refused."""
    ws = make_workspace(tmp_path / "ws", files={"src/a.txt": "PUBLIC\n", "src/secret/key": "TOPSECRET\n",
                                                "docs/linked.txt": "LINKED\n"})  # fmt: skip
    os.link(ws.path / "docs" / "linked.txt", ws.path / "src" / "linked.txt")
    ws.git("add", "-A")
    ws.git("commit", "-qm", "a linked file")
    ws.git("push", "-q")
    search = {"tool_call": {"title": "Grep", "kind": "search", "raw_input": {"path": "."}, "permission": True}}
    steps = [search, {"run": {"script": "grep -rh -e PUBL -e TOPSEC -e LINK src || true"}}]
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(*steps)]}))
    rules = [*CAREFUL_GIT]
    sandbox = {"mode": mode, "worktree": "bind"} if mode != "off" else {"mode": "off"}
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules, sandbox=sandbox))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if mode == "off":
        assert report["terminal"] == "BlockedPolicy", report
        assert report["reason"]["refusal"]["kind"] in ("hard_link", "denied"), report
        return
    said = "\n".join(agent_messages(Path(report["transcript"])))
    assert "PUBLIC" in said and "TOPSECRET" not in said and "LINKED" not in said, said
    decisions = [r for r in read_transcript(Path(report["transcript"])) if r["type"] == "policy"]
    assert [d["decision"] for d in decisions] == ["allow"], decisions
    assert (ws.path / "src" / "linked.txt").read_text() == "LINKED\n"  # masked inside, untouched outside


def test_every_name_a_sandboxed_command_starts_with_is_one_the_policy_knows(tmp_path):
    """`X=1` alone is allowed only for a name not in the commands' environment: each name a real terminal in
    the sandbox starts with must be among those the kernel tells the policy (else `NAME=...` would reach every
    later command unjudged)."""
    ws = make_workspace(tmp_path / "ws")
    step = {"terminal": {"command": "bash", "args": ["-c", "env | cut -d= -f1"]}}  # names only: short output
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(step)]}))
    rules = [*CAREFUL, {"id": "env", "kind": "execute", "commands": ["env", "cut -d= -f1"], "decision": "allow"}]
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules,
                                                            sandbox={"mode": "workspace-write"}))  # fmt: skip
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = "\n".join(agent_messages(Path(report["transcript"])))
    names = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)$", said, re.MULTILINE))
    assert {"PATH", "HOME", TOKEN_VARIABLE} <= names, said  # what env printed reached the test
    known = ALWAYS_EXPORTED | set(terminal_environment("token"))
    assert names <= known, sorted(names - known)
