"""`loop-harness check`'s cancel-honoured sees a cancel ignored mid-work (issue 30, item 6): it cancels once while
the agent's permission request is pending (probe `cancel`) and once while its turn runs with none pending (probe
`cancel-running`). Hostile agents, each a small ACP agent on raw JSON-RPC, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from harness import testing
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW

pytestmark = LOOP_SCRIPTED

#: One agent, three behaviours (argv[1]):
#:   honours          asked for out/hello.txt it asks, and ends `cancelled` when the answer is; any other work (the
#:                    cancel-running probe's prompt) is a tool call every 0.2 s for 30 s, ended `cancelled` at
#:                    once on session/cancel
#:   ignores-pending  the same, but when its permission is answered `cancelled` it goes on for 1.5 s (tool calls,
#:                    fs/write_text_file, more permission requests), then answers `cancelled`, within the grace
#:   ignores-running  the same as honours, but session/cancel does not stop its work: 30 s, then end_turn
#:   late-running     the same as honours, but session/cancel stops its work only 1.5 s later (tool calls all the
#:                    while), then it answers `cancelled`, within the grace
AGENT = r"""
import json, os, sys, threading, time

MODE = sys.argv[1]
lock = threading.Lock()
waiting = {}
cancelled = {}
cwds = {}
counter = [0]


def send(message):
    with lock:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()


def request(method, params):
    with lock:
        counter[0] += 1
        number = counter[0]
        slot = waiting[number] = [threading.Event(), None]
    send({"id": number, "method": method, "params": params})
    slot[0].wait()
    return slot[1]


def update(session, body):
    send({"method": "session/update", "params": {"sessionId": session, "update": body}})


def tool_call(session, number, title, path=None):
    call = {"toolCallId": f"call_{number}", "title": title, "kind": "edit", "status": "pending"}
    if path:
        call["locations"] = [{"path": path}]
    update(session, {"sessionUpdate": "tool_call", **call})
    return call


def ask(session, call):
    options = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
               {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
    answer = request("session/request_permission", {"sessionId": session, "toolCall": call, "options": options})
    outcome = (answer.get("result") or {}).get("outcome") or {}
    if outcome.get("outcome") == "selected":
        return outcome.get("optionId")
    return "cancelled"


def write(session, path):
    request("fs/write_text_file", {"sessionId": session, "path": path, "content": "hello\n"})


def hello(session):
    path = os.path.join(cwds[session], "out", "hello.txt")
    answer = ask(session, tool_call(session, 1, "Write out/hello.txt", path))
    if answer == "cancelled":
        if MODE == "ignores-pending":  # it goes on as if nothing was cancelled, then says it was
            end, number = time.monotonic() + 1.5, 1
            while time.monotonic() < end:
                number += 1
                call = tool_call(session, number, "Write out/hello.txt", path)
                write(session, path)
                ask(session, call)
                time.sleep(0.1)
        return "cancelled"
    if answer != "allow":
        return "end_turn"
    write(session, path)
    update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": "completed"})
    return "end_turn"


def work(session):
    end, number, stop_at = time.monotonic() + 30, 100, None
    while time.monotonic() < end:
        number += 1
        update(session, {"sessionUpdate": "tool_call", "toolCallId": f"call_{number}", "title": f"step {number}",
                         "kind": "think", "status": "completed"})
        if MODE in ("honours", "ignores-pending"):
            if cancelled[session].wait(0.2):
                return "cancelled"
            continue
        time.sleep(0.2)
        if MODE == "late-running" and cancelled[session].is_set():
            stop_at = stop_at or time.monotonic() + 1.5
            if time.monotonic() >= stop_at:
                return "cancelled"
    return "end_turn"


def prompt(message):
    params = message["params"]
    session = params["sessionId"]
    text = "".join(block.get("text", "") for block in params["prompt"])
    if "Reply with one short sentence" in text:
        update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ready"}})
        reason = "end_turn"
    elif "out/hello.txt" in text:
        reason = hello(session)
    else:
        reason = work(session)
    send({"id": message["id"], "result": {"stopReason": reason}})


for line in sys.stdin:
    message = json.loads(line)
    method, params = message.get("method"), message.get("params") or {}
    if method is None:
        slot = waiting.pop(message["id"])
        slot[1] = message
        slot[0].set()
    elif method == "initialize":
        send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
    elif method == "session/new":
        session = f"sess_{len(cwds) + 1}"
        cwds[session] = params["cwd"]
        cancelled[session] = threading.Event()
        send({"id": message["id"], "result": {"sessionId": session}})
    elif method == "session/prompt":
        cancelled[params["sessionId"]].clear()
        threading.Thread(target=prompt, args=(message,), daemon=True).start()
    elif method == "session/cancel":
        cancelled[params["sessionId"]].set()
    elif "id" in message:
        send({"id": message["id"], "error": {"code": -32601, "message": "Method not found"}})
os._exit(0)  # stdin closed: whatever it was doing ends with it
"""


def check(tmp_path, mode: str, *options: str) -> tuple[int, dict, str, float]:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    argv = [sys.executable, "-m", "harness", "check", "--json", "--sessions", "4", "--keep", str(tmp_path / "evidence"),
            *options, "--", sys.executable, str(agent), mode]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr, time.monotonic() - started


def cancel_check(report: dict) -> dict:
    return next(c for c in report["checks"] if c["check"] == "cancel-honoured")


@LOOP_SLOW
def test_an_agent_that_honours_both_cancels_passes(tmp_path):
    code, report, stderr, _ = check(tmp_path, "honours")
    assert code == 0, stderr
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses == {**dict.fromkeys(statuses, "pass"), "session-close": "not exercised"}  # not advertised
    cancel, running = cancel_check(report)["evidence"].split("; ")
    assert cancel.startswith("cancel: answered cancelled") and "(sent on its permission request)" in cancel
    assert running.startswith("cancel-running: answered cancelled") and "no request of it pending" in running


@LOOP_SLOW
def test_going_on_after_a_cancelled_permission_fails_the_cancel_probe(tmp_path):
    """Its permission answered `cancelled`, it writes, starts tool calls and asks again for 1.5 s, then answers
    `cancelled` within the grace: the answer is right, the work after the cancel is not."""
    code, report, stderr, _ = check(tmp_path, "ignores-pending")
    assert code == 1, stderr
    result = cancel_check(report)
    assert result["status"] == "fail", result
    assert result["evidence"].startswith("cancel: kept working after session/cancel (sent on its permission "
                                         "request): "), result  # fmt: skip
    assert "fs/write_text_file" in result["evidence"] and "session/request_permission" in result["evidence"]
    assert [p.rsplit("/", 1)[-1] for p in result["transcripts"]] == ["cancel.jsonl"]
    testing.assert_transcript_valid(tmp_path / "evidence" / "transcripts" / "cancel.jsonl")


@LOOP_SLOW
@pytest.mark.parametrize("grace", [None, "2"])
def test_working_on_for_30_s_after_a_cancel_mid_turn_fails_within_the_grace(tmp_path, grace):
    """It honours a cancel that answers its permission request, but not one that comes while it works, where
    it goes on for 30 s: killed after the grace (the default 5 s, or --cancel-grace), not waited out."""
    code, report, stderr, seconds = check(tmp_path, "ignores-running", *(["--cancel-grace", grace] if grace else []))
    assert code == 1, stderr
    result = cancel_check(report)
    assert result["status"] == "fail", result
    bound = f"{float(grace or 5):g} s"
    assert result["evidence"].startswith("cancel-running: no answer to session/cancel (sent 1 s after its first "
                                         f"session/update, no request of it pending) within {bound}: killed; it "
                                         "went on: "), result  # fmt: skip
    assert "tool call 'step " in result["evidence"]
    assert [p.rsplit("/", 1)[-1] for p in result["transcripts"]] == ["cancel-running.jsonl"]
    assert seconds < 28, f"the check took {seconds:.1f} s: it waited on the agent's 30 s"


@LOOP_SLOW
def test_stopping_1_5_s_after_a_cancel_mid_turn_fails_the_cancel_running_probe(tmp_path):
    """Mid-turn it answers `cancelled` within the grace, but only after 1.5 s more of tool calls."""
    code, report, stderr, _ = check(tmp_path, "late-running")
    assert code == 1, stderr
    result = cancel_check(report)
    assert result["status"] == "fail", result
    assert result["evidence"].startswith("cancel-running: kept working after session/cancel (sent 1 s after its "
                                         "first session/update, no request of it pending): "), result  # fmt: skip
    assert "tool call 'step " in result["evidence"]
    assert [p.rsplit("/", 1)[-1] for p in result["transcripts"]] == ["cancel-running.jsonl"]
