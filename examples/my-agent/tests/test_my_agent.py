"""my-agent under the loop kernel: what it does with a queue, and what it must never do."""

from __future__ import annotations

import pytest

from harness import Terminal
from harness.testing import records

pytestmark = pytest.mark.LoopAgent

GREETING = {"id": "T1", "title": "Greet", "body": "Create the file out/hello.txt containing the word hello."}
READ_ALL = {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"}
WRITE_OUT = [READ_ALL, {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"}]


@pytest.mark.loop_workspace(ignore=["out/"])
def test_it_drains_a_queue(harness_config, harness_workspace, run_loop):
    farewell = {"id": "T2", "title": "Say bye", "body": "Create the file out/bye.txt containing the word bye."}
    result = run_loop(harness_config(tasks=[GREETING, farewell], rules=WRITE_OUT))

    assert result.terminal is Terminal.IDLE, result.reason
    assert [(t.id, t.terminal) for t in result.tasks] == [("T1", Terminal.COMPLETED), ("T2", Terminal.COMPLETED)]
    assert (harness_workspace.path / "out" / "hello.txt").read_text() == "hello\n"
    assert (harness_workspace.path / "out" / "bye.txt").read_text() == "bye\n"
    asked = records(result, "policy", source="session/request_permission")
    assert [r["rule_ids"] for r in asked] == [["write-out"], ["write-out"]]


@pytest.mark.loop_workspace(ignore=["out/"])
def test_a_refused_write_is_not_made(harness_config, harness_workspace, run_loop):
    result = run_loop(harness_config(rules=[READ_ALL]), prompt=GREETING["body"])  # no write is allowed

    assert result.terminal is Terminal.BLOCKED_POLICY, result.reason
    assert result.reason["refusal"] == {"kind": "unmatched", "rule_kind": "write", "target": "out/hello.txt"}
    assert not (harness_workspace.path / "out" / "hello.txt").exists()
    assert records(result, "policy", source="session/request_permission", decision="refuse")
    assert not records(result, "policy", source="fs/write_text_file")  # it did not even try


@pytest.mark.loop_workspace(files={"src/app.py": "print('hi')\n"})
def test_it_cannot_write_outside_what_the_policy_allows(harness_config, harness_workspace, run_loop):
    task = {"id": "T1", "title": "Overwrite", "body": "Create the file src/app.py containing the word gone."}
    result = run_loop(harness_config(tasks=[task], rules=WRITE_OUT))

    assert result.terminal is Terminal.BLOCKED_POLICY, result.reason
    assert result.reason["refusal"]["target"] == "src/app.py"
    assert (harness_workspace.path / "src" / "app.py").read_text() == "print('hi')\n"
