"""An empty rule list is the interactive path: permission requests go to the handler untouched."""

from __future__ import annotations

import asyncio

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

ASK_THEN_WRITE = turn(
    {
        "tool_call": {
            "id": "c1",
            "title": "Write notes.txt",
            "kind": "edit",
            "locations": ["notes.txt"],
            "raw_input": {"path": "notes.txt", "why": "the user asked"},
            "permission": True,
        }
    },
    {"write": {"path": "notes.txt", "content": "written after a person said yes\n"}},
)


def incoming_permission_params(records):
    return [
        r["msg"]["params"]
        for r in records
        if r["type"] == "rpc" and r["dir"] == "in" and r["msg"].get("method") == "session/request_permission"
    ]


def test_requests_reach_the_handler_untouched(scripted_scenario, harness_config, run_loop, harness_workspace):
    seen = []

    def person(params):
        seen.append(params)
        return {"outcome": "selected", "optionId": "allow-always"}  # a person may choose what the kernel never would

    path = scripted_scenario(scenario({None: [ASK_THEN_WRITE]}))
    result = run_loop(harness_config(path, rules=[]), prompt="write some notes", interactive_handler=person)

    assert result.terminal is Terminal.END_TURN
    records = read_transcript(result.transcript)
    assert seen == incoming_permission_params(records)  # exactly what the agent sent
    assert seen[0]["toolCall"]["rawInput"] == {"path": "notes.txt", "why": "the user asked"}
    answer = next(r for r in records if r["type"] == "rpc" and r["dir"] == "out" and "outcome" in str(r["msg"]))
    assert answer["msg"]["result"] == {"outcome": {"outcome": "selected", "optionId": "allow-always"}}
    decision = next(r for r in records if r["type"] == "policy")
    assert decision["decision"] == "interactive"
    assert (harness_workspace.path / "notes.txt").read_text() == "written after a person said yes\n"


def test_an_async_handler_that_declines(scripted_scenario, harness_config, run_loop, harness_workspace):
    async def person(params):
        await asyncio.sleep(0.01)
        return {"outcome": "selected", "optionId": "reject"}

    path = scripted_scenario(scenario({None: [ASK_THEN_WRITE]}))
    result = run_loop(harness_config(path, rules=[]), prompt="write some notes", interactive_handler=person)

    assert result.terminal is Terminal.END_TURN  # a person's "no" is not a policy stop
    assert not (harness_workspace.path / "notes.txt").exists()


def test_a_cancel_answers_a_waiting_handler_cancelled(scripted_scenario, harness_config, run_loop):
    kernel = {}

    async def person_who_never_answers(params):
        kernel["k"].cancel()
        await asyncio.Event().wait()

    path = scripted_scenario(scenario({None: [ASK_THEN_WRITE]}))
    result = run_loop(
        harness_config(path, rules=[]),
        prompt="write some notes",
        interactive_handler=person_who_never_answers,
        setup=lambda k: kernel.setdefault("k", k),
    )

    assert result.terminal is Terminal.CANCELLED
    assert result.reason["agent_stop_reason"] == "cancelled"
    records = read_transcript(result.transcript)
    answer = next(r for r in records if r["type"] == "rpc" and r["dir"] == "out" and "outcome" in str(r["msg"]))
    assert answer["msg"]["result"] == {"outcome": {"outcome": "cancelled"}}


def test_the_interactive_path_is_still_confined(scripted_scenario, harness_config, run_loop, tmp_path):
    escape = turn({"write": {"path": str(tmp_path / "outside.txt"), "content": "x"}})
    path = scripted_scenario(scenario({None: [escape]}))
    result = run_loop(
        harness_config(path, rules=[]), prompt="go", interactive_handler=lambda p: {"outcome": "cancelled"}
    )

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "outside_worktree"
    assert not (tmp_path / "outside.txt").exists()
