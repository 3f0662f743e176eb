"""`sandbox.hide`: paths outside the worktree the agent may not even read (the control server hides the other
workspaces and its own state this way); one that holds what the run needs is refused, not half-applied."""

from __future__ import annotations

import json

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED


def said(result) -> list[str]:
    return [r["msg"]["params"]["update"]["content"]["text"] for r in read_transcript(result.transcript)
            if r["type"] == "rpc" and "agent_message_chunk" in json.dumps(r)]  # fmt: skip


def test_a_hidden_directory_and_file_read_as_nothing(tmp_path, scripted_scenario, harness_config, run_loop):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("s3cr3t-dir\n")
    token = tmp_path / "token"
    token.write_text("s3cr3t-file\n")
    visible = tmp_path / "visible"
    visible.write_text("in plain sight\n")
    reads = turn(*({"run": {"script": f"cat {path}"}} for path in (secrets / "key", token, visible)))
    config = harness_config(scripted_scenario(scenario({None: [reads]})), rules=[],
                            sandbox={"hide": [str(secrets), str(token)]})  # fmt: skip

    result = run_loop(config, prompt="read")

    assert result.terminal is Terminal.END_TURN, result.reason
    outputs = [text.split("\n", 1)[1] for text in said(result)]
    assert "s3cr3t-dir" not in outputs[0] and "No such file" in outputs[0]
    assert outputs[1].strip() == ""  # the file reads empty
    assert "in plain sight" in outputs[2]  # what is not hidden reads as before (the test can fail)


def test_hiding_what_holds_the_worktree_is_refused(tmp_path, scripted_scenario, harness_config, run_loop):
    config = harness_config(scripted_scenario(scenario({None: [turn({"message": "hi"})]})),
                            sandbox={"hide": [str(tmp_path)]})  # fmt: skip

    result = run_loop(config, prompt="hi")

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["check"] == "sandbox_available" and "sandbox.hide" in result.reason["detail"], result.reason
