"""The real Claude Code ACP adapter under the OS sandbox.

`@zed-industries/claude-agent-acp@0.23.1` runs under `loop-harness run` against a stand-in for the Anthropic
Messages API on 127.0.0.1 (`harness.fake_model`, through the plugin's `fake_messages` fixture), reached from
inside the sandbox only through the kernel's filtering proxy (a network rule allows `127.0.0.1`). The fake model
asks Claude Code's Bash tool to run a command the policy allows, a script in the worktree the policy cannot see
into, which tries to write outside the worktree and into `.git/hooks`; then it ends the turn. With the sandbox on
both writes fail; with it off both land, so the attack is real. Claude Code runs the command itself (no
`terminal/*`): the permission request is the kernel's only say, and the sandbox the only bound on what the
command then does.

The adapter comes from npm into `$LOOP_HARNESS_NPM_CACHE` (default `~/.cache/loop-harness/npm`) once; without
node/npm or the registry the module is skipped, saying why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import read_transcript
from harness.fake_model._messages import FakeMessages
from harness.pytest_plugin import LOOP_REAL, LOOP_SCRIPTED, LOOP_SLOW
from harness.server._modules import ADAPTERS
from harness.testing import loop_config, make_workspace, write_yaml
from tests.helpers.adapter_table import (
    HELLO,
    TABLE,
    WRITER,
    assert_hello,
    assert_refused,
    hello_rules,
    writer_files,
    writer_rules,
)
from tests.helpers.npm_adapters import npm_adapter

pytestmark = [LOOP_SCRIPTED, LOOP_REAL]

CLI = str(Path(sys.executable).parent / "loop-harness")
PACKAGE = ADAPTERS["claude"]  # the version the server's claude module pins
SCRIPT = "node_modules/@zed-industries/claude-agent-acp/dist/index.js"
COMMAND = "python3 tools/escape.py"
RULES = [
    {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
    {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"},
    {"id": "escape", "kind": "execute", "commands": [COMMAND], "decision": "allow"},
    {"id": "model-api", "kind": "network", "hosts": ["127.0.0.1"], "decision": "allow"},
]

#: What the allowed command does: one line per attempt, "<what>: done" or "<what>: blocked (...)".
ESCAPE = """\
def attempt(what, path):
    try:
        with open(path, "a") as out:
            out.write("planted\\n")
        print(what + ": done")
    except OSError as exc:
        print(what + ": blocked (" + type(exc).__name__ + ": " + str(exc.strerror) + ")")
attempt("write outside", {outside!r})
attempt("write git hook", ".git/hooks/pre-commit")
attempt("write src", "src/allowed.txt")
"""


@pytest.fixture(name="claude_acp", scope="module")
def claude_acp_fixture() -> Path:
    """The adapter's entry script, installed from npm once (skip when that cannot be done here)."""
    return npm_adapter(PACKAGE, SCRIPT)


def claude_home(root: Path) -> Path:
    """A private HOME with a fresh plugin blocklist (else Claude Code fetches one from the internet at start)."""
    home = root / "home"
    (home / ".claude/plugins").mkdir(parents=True)
    blocklist = {"fetchedAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), "plugins": []}
    (home / ".claude/plugins/blocklist.json").write_text(json.dumps(blocklist))
    (home / "tmp").mkdir()
    return home


def claude_run(tmp_path: Path, script: Path, fake_messages: Callable[..., FakeMessages], mode: str, *,
               command: str = COMMAND, rules: list | None = None, files: dict[str, str] | None = None,
               sandbox: dict | None = None) -> tuple[dict, list[dict], FakeMessages]:  # fmt: skip
    """One `loop-harness run` of Claude Code against the fake Messages API playing: run `command`, then say
    done."""
    outside = tmp_path / "outside.txt"
    ws = make_workspace(tmp_path / "ws", files={"tools/escape.py": ESCAPE.format(outside=str(outside)),
                                                "src/keep.txt": "kept\n", **(files or {})})  # fmt: skip
    api = fake_messages([[{"shell": command}], [{"say": "all done"}]])
    home = claude_home(tmp_path)
    box = {"mode": mode, **(sandbox or {})}
    config = loop_config(ws, tmp_path / "unused.yaml", rules=rules or RULES, sandbox=box, commit={},
                         transcripts=str(tmp_path / "transcripts"))  # fmt: skip
    config["agent"] = {"command": [shutil.which("node") or "node", str(script)],
                       "supports_permission_requests": True,
                       "env": {"HOME": str(home), "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "sk-fake",
                               "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                               "DISABLE_ERROR_REPORTING": "1",
                               # The sandbox sets CLAUDE_CODE_TMPDIR (its Bash tool's files, default `/tmp`,
                               # which is read-only inside) to the private temp dir: nothing to do here.
                               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}}  # fmt: skip
    path = write_yaml(tmp_path / "loop.yaml", config)
    done = subprocess.run([CLI, "run", str(path), "--json"], capture_output=True, text=True, timeout=180)
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, read_transcript(Path(report["transcript"])), api


def diagnose(report: dict, records: list[dict], api: FakeMessages) -> str:
    """What to read when Claude Code did not get through: the report, the kernel's records (agent exit with its
    stderr tail, egress), and what the fake API saw."""
    lines = [json.dumps(report)[:2000]]
    lines += [json.dumps(r)[:3000] for r in records if r["type"] not in ("rpc", "sandbox", "agent_start")]
    seen = [(r["method"], r["path"], r["turn"], (r["body"] or {}).get("model")) for r in api.requests]
    lines += [f"api requests: {seen}, errors: {api.errors}", f"outputs: {api.outputs()}"]
    return "\n".join(lines)


def rpcs(records: list[dict], method: str) -> list[dict]:
    return [r["msg"] for r in records if r["type"] == "rpc" and r["msg"].get("method") == method]


@LOOP_SLOW
@pytest.mark.parametrize("mode", ["workspace-write", "off"])
def test_claude_runs_an_allowed_command_that_cannot_leave_the_workspace(tmp_path, claude_acp, fake_messages, mode):
    report, records, api = claude_run(tmp_path, claude_acp, fake_messages, mode)
    outside, hook = tmp_path / "outside.txt", tmp_path / "ws/workspace/.git/hooks/pre-commit"
    on = mode != "off"
    why = diagnose(report, records, api)
    try:
        assert report["terminal"] == "Idle" and report["tasks"][0]["terminal"] == "Completed", why
        # Claude Code asked before running the command, and the execute rule answered (allow once, never always)
        asked = rpcs(records, "session/request_permission")
        assert [a["params"]["toolCall"]["rawInput"]["command"] for a in asked] == [COMMAND], why
        policy = [r for r in records if r["type"] == "policy" and r["source"] == "session/request_permission"]
        assert [(p["decision"], p["rule_ids"][0], p["outcome"]) for p in policy] == [("allow", "escape", "allow")]
        answer = next(r["msg"] for r in records if r["type"] == "rpc" and r["dir"] == "out"
                      and r["msg"].get("id") == asked[0]["id"] and "result" in r["msg"])  # fmt: skip
        assert answer["result"]["outcome"] == {"outcome": "selected", "optionId": "allow"}
        # the command ran: its output went back to the model in the next turn, and the turn ended
        assert len(api.turns()) == 2 and not api.errors, why
        (output,) = api.outputs()
        expected = "blocked (OSError: Read-only file system)" if on else "done"
        assert f"write outside: {expected}" in output, output
        assert f"write git hook: {expected}" in output, output
        assert "write src: done" in output, output  # what the write rule opens stays writable
        said = "".join(u["params"]["update"]["content"]["text"] for u in rpcs(records, "session/update")
                       if u["params"]["update"]["sessionUpdate"] == "agent_message_chunk")  # fmt: skip
        assert "all done" in said
        # the files themselves
        assert outside.exists() is not on
        assert hook.exists() is not on
        assert (tmp_path / "ws/workspace/src/allowed.txt").read_text() == "planted\n"
        # the sandbox, and the model API reached only through the kernel's proxy under the network rule
        (sandbox,) = [r for r in records if r["type"] == "sandbox"]
        assert sandbox["mode"] == mode
        egress = [r for r in records if r["type"] == "egress" and r["rule_ids"] != ["host-tools"]]
        port = int(api.url.rsplit(":", 1)[1].split("/")[0])
        if on:
            assert egress and all(
                (e["host"], e["port"], e["allowed"], e["rule_ids"]) == ("127.0.0.1", port, True, ["model-api"])
                for e in egress
            ), why
        else:
            assert egress == []
    finally:  # the off case wrote outside the worktree: leave nothing behind
        outside.unlink(missing_ok=True)
        hook.unlink(missing_ok=True)


@LOOP_SLOW
@pytest.mark.parametrize("worktree", ["overlay", "bind"])
def test_a_rule_for_one_new_file_lets_claude_write_it(tmp_path, claude_acp, fake_messages, worktree):
    """Issue 30's table, fourth row, with the real adapter (see adapter_table.py)."""
    report, records, api = claude_run(tmp_path, claude_acp, fake_messages, "workspace-write", command=HELLO,
                                      rules=hello_rules(RULES[0], RULES[3]),
                                      sandbox={"worktree": worktree})  # fmt: skip
    why = diagnose(report, records, api)
    assert len(api.turns()) == 2, why
    assert_hello(report, records, api.outputs()[0], tmp_path, worktree, why)


@LOOP_SLOW
@pytest.mark.parametrize("row", TABLE.values(), ids=TABLE.keys())
def test_a_silent_write_the_rules_refuse_is_never_committed_by_claude(tmp_path, claude_acp, fake_messages, row):
    """Issue 30's table, rows 1-3, with the real adapter (see adapter_table.py)."""
    extra, refused = row
    report, records, api = claude_run(tmp_path, claude_acp, fake_messages, "workspace-write", command=WRITER,
                                      rules=writer_rules(RULES[0], extra, RULES[3]),
                                      files=writer_files(refused))  # fmt: skip
    assert_refused(report, records, refused, tmp_path, diagnose(report, records, api))
