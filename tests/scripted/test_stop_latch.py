"""Issue 30, item 3: no action after a stop. Once a stop is decided for the turn (a budget trips, a policy
refusal ends the run, the user's cancel sends `session/cancel`), the request that tripped it and every later
request of the turn are answered `cancelled` (a permission request) or refused (fs/* and terminal/create, a
JSON-RPC error), never allowed, and the transcript says so with the stop that latched them. Through the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import assert_transcript_valid, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
RULES = [
    {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
    {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"},
    {"id": "run-echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"},
]
TURNS = {"per_segment": 50, "total": 100, "continuations": 0}
# The scripted agent with its cancel checks taken out: it keeps sending requests after `session/cancel`
KEEPS_GOING = ("import sys, scripted_agents._agent as a; a._Player._check_cancel = lambda self: None; "
               "from scripted_agents.__main__ import main; sys.exit(main(sys.argv[1:]))")  # fmt: skip


def config_for(tmp_path, turns, *, autonomy=None, agent=None):
    ws = make_workspace(tmp_path / "ws")
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": turns}))
    extra = {"autonomy": autonomy} if autonomy is not None else {}
    which = {"agent": [*agent, str(path)]} if agent is not None else {"scenario": path}
    config = loop_config(ws, rules=RULES, transcripts=str(tmp_path / "transcripts"), sandbox={"mode": "off"},
                         **which, **extra)  # fmt: skip
    return ws.path, write_yaml(tmp_path / "loop.yaml", config)


def run(tmp_path, turns, *, autonomy=None, agent=None):
    """The CLI on one task: the worktree, its JSON report and transcript records."""
    root, config = config_for(tmp_path, turns, autonomy=autonomy, agent=agent)
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return root, report, assert_transcript_valid(Path(report["transcript"]))


def policy(records, source=None):
    return [r for r in records if r["type"] == "policy" and (source is None or r["source"] == source)]


def latched(records):
    """The requests answered because of a stop: (source, what they asked for, outcome, what stopped them)."""
    return [(r["source"], r.get("toolCallId") or r.get("path") or r.get("command"), r["outcome"], r["reason"]["by"])
            for r in policy(records) if r["reason"]["kind"] == "stopped"]  # fmt: skip


def own_write(k, *, permission=True):
    """One edit call: asked for with a permission request, then written by the agent itself (as Claude Code's
    and Codex's own tools write once allowed), then said to be done."""
    path = f"src/own{k}.txt"
    call = {"id": f"c{k}", "title": f"Write {path}", "kind": "edit", "locations": [path], "raw_input": {"path": path},
            "permission": permission}  # fmt: skip
    return [
        {"tool_call": call},
        {"run": {"script": f"mkdir -p src && echo {k} > {path}"}},
        {"tool_update": {"id": f"c{k}", "status": "completed"}},
    ]


def test_a_tool_call_cap_cancels_the_call_that_trips_it_and_every_later_request(tmp_path):
    cap = 5
    steps = [step for k in range(1, cap + 4) for step in own_write(k)]
    autonomy = {"budget": {"model_turns": TURNS, "tool_calls": {"per_segment": cap, "rate": None}}}
    root, report, records = run(tmp_path, [turn(*steps)], autonomy=autonomy)

    assert report["terminal"] == "MaxIterations", report
    assert (report["reason"]["stop_code"], report["reason"]["current"]) == ("AGGREGATE_TOOL_CALL_LIMIT", cap + 1)
    assert sorted(p.name for p in (root / "src").glob("own*.txt")) == [f"own{k}.txt" for k in range(1, cap + 1)]
    allowed = [r["toolCallId"] for r in policy(records, "session/request_permission") if r["decision"] == "allow"]
    assert allowed == [f"c{k}" for k in range(1, cap + 1)]
    # the call that tripped the cap is answered cancelled (the agent then stops, as ACP says it must)
    assert latched(records)[0] == ("session/request_permission", f"c{cap + 1}", "cancelled", "budget")
    stopped = next(r for r in policy(records) if r["reason"]["kind"] == "stopped")["reason"]
    assert stopped["stop_code"] == "AGGREGATE_TOOL_CALL_LIMIT"


def test_after_the_cap_every_kernel_request_of_the_turn_is_refused(tmp_path):
    """An agent that goes on after the cap (it does not stop for `session/cancel`): its writes, reads and commands
    refused with a JSON-RPC error, each on record with the stop."""
    cap = 3
    late = [
        {"write": {"path": "src/late.txt", "content": "late\n", "on_error": "continue"}},
        {"read": {"path": "README.md", "on_error": "continue"}},
        {"terminal": {"command": "echo", "args": ["late"], "on_error": "continue"}},
    ]
    steps = [step for k in range(1, cap + 1) for step in own_write(k, permission=False)]
    steps += [{"tool_call": {"id": "over", "title": "One too many", "kind": "read"}}, *late]
    autonomy = {"budget": {"model_turns": TURNS, "tool_calls": {"per_segment": cap, "rate": None}}}
    root, report, records = run(tmp_path, [turn(*steps)], autonomy=autonomy, agent=[sys.executable, "-c", KEEPS_GOING])

    assert report["reason"]["stop_code"] == "AGGREGATE_TOOL_CALL_LIMIT", report
    assert not (root / "src" / "late.txt").exists()
    assert [r for r in policy(records) if r["decision"] == "allow"] == []
    assert latched(records) == [("fs/write_text_file", str(root / "src/late.txt"), "refused", "budget"),
                                ("fs/read_text_file", str(root / "README.md"), "refused", "budget"),
                                ("terminal/create", "echo", "refused", "budget")]  # fmt: skip


def test_a_line_cap_refuses_the_request_after_a_600_line_write(tmp_path):
    big = "".join(f"line {i}\n" for i in range(600))
    call = {"id": "w1", "title": "Write src/big.txt", "kind": "edit", "locations": ["src/big.txt"],
            "raw_input": {"path": "src/big.txt"}, "permission": True}  # fmt: skip
    steps = [
        {"tool_call": call},
        {"write": {"path": "src/big.txt", "content": big}},  # the kernel writes it: 600 lines of a 100 cap
        *own_write(2),  # the next request: a permission the agent would act on itself
    ]
    autonomy = {"budget": {"model_turns": TURNS, "changes": {"files_total": 50, "lines_total": 100}}}
    root, report, records = run(tmp_path, [turn(*steps)], autonomy=autonomy)

    assert report["terminal"] == "MaxIterations", report
    assert (report["reason"]["stop_code"], report["reason"]["current"]) == ("LINE_CHANGE_LIMIT", 600)
    assert (root / "src" / "big.txt").exists()
    assert not (root / "src" / "own2.txt").exists()
    assert latched(records) == [("session/request_permission", "c2", "cancelled", "budget")]


def test_a_line_cap_refuses_a_second_write_straight_after_the_first(tmp_path):
    """No tool call between them: the kernel's own 600-line write is measured before it serves the next."""
    big = "".join(f"line {i}\n" for i in range(600))
    steps = [{"write": {"path": "src/big.txt", "content": big}},
             {"write": {"path": "src/next.txt", "content": "next\n", "on_error": "continue"}}]  # fmt: skip
    autonomy = {"budget": {"model_turns": TURNS, "changes": {"files_total": 50, "lines_total": 100}}}
    root, report, records = run(tmp_path, [turn(*steps)], autonomy=autonomy)

    assert report["reason"]["stop_code"] == "LINE_CHANGE_LIMIT", report
    assert (root / "src" / "big.txt").exists() and not (root / "src" / "next.txt").exists()
    assert latched(records) == [("fs/write_text_file", str(root / "src/next.txt"), "refused", "budget")]


def test_after_a_policy_refusal_nothing_more_of_the_turn_is_allowed(tmp_path):
    steps = [
        {"write": {"path": "docs/denied.txt", "content": "no\n", "on_error": "continue"}},  # refused: no rule
        {"write": {"path": "src/after.txt", "content": "after\n", "on_error": "continue"}},
        {"terminal": {"command": "echo", "args": ["after"], "on_error": "continue"}},
        *own_write(1),
    ]
    root, report, records = run(tmp_path, [turn(*steps)])

    assert report["terminal"] == "BlockedPolicy", report
    assert report["reason"]["path"].endswith("docs/denied.txt")
    assert not (root / "docs" / "denied.txt").exists()
    assert not (root / "src" / "after.txt").exists() and not (root / "src" / "own1.txt").exists()
    assert [r for r in policy(records) if r["decision"] == "allow"] == []
    assert latched(records) == [("fs/write_text_file", str(root / "src/after.txt"), "refused", "policy_refusal"),
                                ("terminal/create", "echo", "refused", "policy_refusal"),
                                ("session/request_permission", "c1", "cancelled", "policy_refusal")]  # fmt: skip


@LOOP_SLOW
def test_after_a_cancel_the_agent_s_later_requests_are_refused(tmp_path):
    """SIGINT to the CLI while the agent keeps sending writes (it ignores `session/cancel`): none after the cancel
    is served, during the grace period before the kill."""
    steps = []
    for k in range(12):
        steps += [{"write": {"path": f"src/w{k}.txt", "content": f"{k}\n", "on_error": "continue"}},
                  {"run": {"script": "sleep 0.2"}}]  # fmt: skip
    root, config = config_for(tmp_path, [turn(*steps)], agent=[sys.executable, "-c", KEEPS_GOING])
    config_text = config.read_text().replace("cancel_grace_s: 1", "cancel_grace_s: 3")
    config.write_text(config_text)
    transcript = tmp_path / "run.jsonl"
    process = subprocess.Popen([CLI, "run", str(config), "--json", "--transcript", str(transcript)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (root / "src" / "w1.txt").exists():
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert stdout.strip(), stderr

    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["terminal"] == "Cancelled", stderr
    records = assert_transcript_valid(transcript)
    cancel = next(r["seq"] for r in records if r["type"] == "rpc" and r["dir"] == "out"
                  and r["msg"].get("method") == "session/cancel")  # fmt: skip
    after = [r for r in policy(records, "fs/write_text_file") if r["seq"] > cancel]
    assert after, "the agent sent no write after the cancel: the test proves nothing"
    assert all(r["decision"] == "refuse" and r["reason"] == {**r["reason"], "kind": "stopped", "by": "cancel"}
               for r in after), after  # fmt: skip
    served = [r["path"] for r in policy(records, "fs/write_text_file") if r["decision"] == "allow"]
    assert sorted(p.name for p in (root / "src").glob("w*.txt")) == sorted(Path(p).name for p in served)
    assert len(served) < 12
    assert os.path.exists(root / "src" / "w0.txt")
