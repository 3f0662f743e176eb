"""Crashed, hung and garbled agents get a clear terminal, never a hang, and lose nothing:
the transcript is complete and valid after each (checked by the run_loop fixture)."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED


def agent_pid(result):
    return next(r["pid"] for r in read_transcript(result.transcript) if r["type"] == "agent_start")


def alive(pid, settle=5.0):
    """Still running `settle` seconds on, as opposed to gone or a zombie (killed orphans wait for
    init to reap them; a killed process closes its pipes a moment before it is a zombie)."""
    deadline = time.monotonic() + settle
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)


def assert_agent_gone(result):
    assert not alive(agent_pid(result)), "the agent process outlived the run"


def run_one(scripted_scenario, harness_config, run_loop, *turns, top=None, **config):
    path = scripted_scenario(scenario({"T1": list(turns)}, **(top or {})))
    return run_loop(harness_config(path, **config))


def test_a_crash_is_failed_with_exit_status_and_stderr_tail(scripted_scenario, harness_config, run_loop):
    crash = turn({"message": "about to fall over"}, {"crash": {"exit_code": 3, "stderr": "boom: disk on fire\n"}})
    result = run_one(scripted_scenario, harness_config, run_loop, crash)

    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "agent_exited"
    assert result.reason["exit_status"] == 3
    assert result.reason["stderr_tail"].endswith("boom: disk on fire\n")
    assert_agent_gone(result)


def test_a_crash_before_initialize(scripted_scenario, harness_config, run_loop):
    result = run_one(
        scripted_scenario,
        harness_config,
        run_loop,
        turn(),
        top={"startup": [{"crash": {"exit_code": 7, "stderr": "no\n"}}]},
    )
    assert result.terminal is Terminal.FAILED
    assert (result.reason["kind"], result.reason["exit_status"]) == ("agent_exited", 7)
    assert result.tasks == []


@pytest.mark.parametrize(
    ("garbage", "error"),
    [
        ({"text": "Loading model weights... done"}, "stdout line is not JSON"),
        ({"text": "progress 50%", "newline": False}, "stdout line is not JSON"),  # glued onto the next frame
        ({"text": '{"hello": "world"}'}, "stdout line is not a JSON-RPC 2.0 object"),
        ({"text": '{"jsonrpc": "2.0"}'}, "JSON-RPC object has neither a method nor an id"),
    ],
    ids=["text-line", "text-without-newline", "json-not-rpc", "rpc-without-method-or-id"],
)
def test_garbage_on_stdout_is_failed_naming_the_framing_error(
    scripted_scenario, harness_config, run_loop, garbage, error
):
    result = run_one(scripted_scenario, harness_config, run_loop, turn({"garbage": garbage}, {"message": "after"}))

    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "framing_error"
    assert result.reason["error"].startswith(error)
    assert result.reason["line_head"].startswith(garbage["text"][:10])
    framing = [r for r in read_transcript(result.transcript) if r["type"] == "framing_error"]
    assert len(framing) == 1
    assert_agent_gone(result)


def test_garbage_before_initialize(scripted_scenario, harness_config, run_loop):
    result = run_one(
        scripted_scenario, harness_config, run_loop, turn(), top={"startup": [{"garbage": {"text": "banner v1.0"}}]}
    )
    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "framing_error"
    assert result.reason["line_head"] == "banner v1.0\n"


def test_an_agent_ignoring_cancel_is_killed_after_the_grace(scripted_scenario, harness_config, run_loop):
    stuck = turn({"message": "working forever"}, {"hang": True}, ignore_cancel=True)
    result = run_one(
        scripted_scenario, harness_config, run_loop, stuck, limits={"turn_timeout_s": 0.5, "cancel_grace_s": 0.3}
    )

    assert result.terminal is Terminal.FAILED
    assert result.reason == {"kind": "turn_timeout", "timeout_s": 0.5, "agent_stop_reason": None, "killed": True}
    sent = [
        r["msg"].get("method") for r in read_transcript(result.transcript) if r["type"] == "rpc" and r["dir"] == "out"
    ]
    assert "session/cancel" in sent
    assert "session/close" not in sent  # a killed agent is not asked for anything more
    assert_agent_gone(result)


def test_a_turn_timeout_the_agent_honours(scripted_scenario, harness_config, run_loop):
    stuck = turn({"hang": True})
    result = run_one(scripted_scenario, harness_config, run_loop, stuck, limits={"turn_timeout_s": 0.3})

    assert result.terminal is Terminal.FAILED
    assert result.reason == {
        "kind": "turn_timeout",
        "timeout_s": 0.3,
        "agent_stop_reason": "cancelled",
        "killed": False,
    }


def test_a_user_cancel_kills_an_agent_that_ignores_it(scripted_scenario, harness_config, run_loop):
    stuck = turn({"message": "busy"}, {"hang": True}, ignore_cancel=True)
    kernel = {}
    path = scripted_scenario(scenario({"T1": [stuck]}))
    result = run_loop(
        harness_config(path, limits={"cancel_grace_s": 0.3}),
        setup=lambda k: kernel.setdefault("k", k),
        observer=lambda r: r["type"] == "rpc" and "busy" in str(r["msg"]) and kernel["k"].cancel(),
    )
    assert result.terminal is Terminal.CANCELLED
    assert result.reason == {"kind": "user_cancel", "during": "turn", "agent_stop_reason": None, "killed": True}
    assert_agent_gone(result)


def test_a_cancel_answered_with_the_wrong_stop_reason(scripted_scenario, harness_config, run_loop):
    sloppy = turn({"message": "busy"}, {"hang": True}, cancel_stop_reason="end_turn")
    kernel = {}
    path = scripted_scenario(scenario({"T1": [sloppy]}))
    result = run_loop(
        harness_config(path),
        setup=lambda k: kernel.setdefault("k", k),
        observer=lambda r: r["type"] == "rpc" and "busy" in str(r["msg"]) and kernel["k"].cancel(),
    )
    # the kernel keeps its own cancel flag: end_turn after a cancel is still Cancelled
    assert result.terminal is Terminal.CANCELLED
    assert result.reason == {"kind": "user_cancel", "during": "turn", "agent_stop_reason": "end_turn", "killed": False}


def test_a_stderr_flood_does_not_deadlock(scripted_scenario, harness_config, run_loop):
    flood = write_turn("src/a.txt", "a\n", commit="T1")
    flood["steps"].insert(0, {"stderr_flood": 4 << 20})
    result = run_one(scripted_scenario, harness_config, run_loop, flood, commit={"message": "{id}"})

    assert result.terminal is Terminal.IDLE
    exit_record = next(r for r in read_transcript(result.transcript) if r["type"] == "agent_exit")
    assert exit_record["stderr_bytes"] >= 4 << 20


def test_the_stderr_tail_of_a_crash_after_a_flood_is_bounded(scripted_scenario, harness_config, run_loop):
    crash = turn({"stderr_flood": 1 << 20}, {"crash": {"exit_code": 9, "stderr": "\nfinal words\n"}})
    result = run_one(scripted_scenario, harness_config, run_loop, crash)

    assert result.terminal is Terminal.FAILED
    assert len(result.reason["stderr_tail"]) <= 2000
    assert result.reason["stderr_tail"].endswith("final words\n")


def test_a_20_mb_line_is_read_and_its_record_bounded(scripted_scenario, harness_config, run_loop):
    big = write_turn("src/a.txt", "a\n", commit="T1")
    big["steps"].insert(0, {"big_message": 20_000_000})
    result = run_one(scripted_scenario, harness_config, run_loop, big, commit={"message": "{id}"})

    assert result.terminal is Terminal.IDLE
    assert result.tasks[0].terminal is Terminal.COMPLETED
    assert result.transcript.stat().st_size < 1_000_000
    chunk = next(r for r in read_transcript(result.transcript) if "truncated 1" in str(r.get("msg", "")))
    assert chunk["msg"]["params"]["update"]["content"]["text"].endswith("chars]")


def test_an_agent_that_cannot_start(harness_config, run_loop, tmp_path):
    config = harness_config(tmp_path / "unused.yaml")
    config.write_text(config.read_text().replace("- -m\n  - scripted_agents", "- -m\n  - no_such_module_here"))
    result = run_loop(config)
    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "agent_exited"
    assert "No module named no_such_module_here" in result.reason["stderr_tail"]


def test_a_missing_agent_binary(harness_config, run_loop, tmp_path):
    config = harness_config(tmp_path / "unused.yaml")
    text = config.read_text()
    config.write_text(text.replace(text.split("command:\n  - ")[1].split("\n")[0], "/nonexistent/agent", 1))
    result = run_loop(config)
    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "agent_start_failed"
    assert "/nonexistent/agent" in result.reason["error"]


@LOOP_SLOW
def test_an_agent_that_never_answers_initialize(scripted_scenario, harness_config, run_loop):
    result = run_one(
        scripted_scenario,
        harness_config,
        run_loop,
        turn(),
        top={"startup": [{"sleep": 30}]},
        limits={"init_timeout_s": 0.5},
    )
    assert result.terminal is Terminal.FAILED
    assert result.reason == {"kind": "agent_timeout", "request": "initialize", "timeout_s": 0.5}
    assert_agent_gone(result)


def test_an_agent_speaking_another_protocol_version(scripted_scenario, harness_config, run_loop):
    result = run_one(scripted_scenario, harness_config, run_loop, turn(), top={"agent": {"protocol_version": 2}})
    assert result.terminal is Terminal.FAILED
    assert result.reason == {"kind": "protocol_version", "expected": 1, "got": 2}


def test_an_error_answer_to_a_prompt(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario({"tasks": [{"id": "OTHER", "turns": [turn()]}]})  # nothing matches T1
    result = run_loop(harness_config(path))
    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "agent_error"
    assert result.reason["request"] == "session/prompt"
    assert result.reason["code"] == -32603


def child_pid(result):
    text = next(r for r in read_transcript(result.transcript) if "child pid" in str(r.get("msg", "")))
    return int(str(text["msg"]).split("child pid ")[1].split("'")[0])


def test_a_crash_with_a_grandchild_holding_the_pipes(scripted_scenario, harness_config, run_loop):
    # The agent dies but its child keeps stdout open: no EOF ever comes.
    crash = turn({"spawn_child": {"seconds": 300}}, {"crash": {"exit_code": 5, "stderr": "gone\n"}})
    # the child's pid as the agent sees it is the host's only without the sandbox's pid namespace
    result = run_one(scripted_scenario, harness_config, run_loop, crash, sandbox={"mode": "off"})

    assert result.terminal is Terminal.FAILED
    assert (result.reason["kind"], result.reason["exit_status"]) == ("agent_exited", 5)
    assert not alive(child_pid(result)), "the process group was not killed"


def test_a_killed_agent_takes_its_children_with_it(scripted_scenario, harness_config, run_loop):
    stuck = turn({"spawn_child": {"seconds": 300}}, {"hang": True}, ignore_cancel=True)
    result = run_one(
        scripted_scenario,
        harness_config,
        run_loop,
        stuck,
        limits={"turn_timeout_s": 0.5, "cancel_grace_s": 0.2},
        sandbox={"mode": "off"},  # pids as the agent reports them: the host's without a pid namespace
    )
    assert result.reason["killed"] is True
    assert not alive(child_pid(result))
    assert_agent_gone(result)


def test_json_nested_too_deeply_is_a_framing_error(scripted_scenario, harness_config, run_loop):
    nested = '{"jsonrpc":"2.0","method":"x","params":' + '{"a":' * 5000 + "1" + "}" * 5001
    result = run_one(scripted_scenario, harness_config, run_loop, turn({"garbage": {"text": nested}}))
    assert result.terminal is Terminal.FAILED
    assert result.reason["kind"] == "framing_error"
    assert "nested too deeply" in result.reason["error"]


def test_a_record_of_many_short_strings_is_still_bounded(tmp_path):
    from harness import Transcript

    transcript = Transcript(tmp_path / "t.jsonl", max_string=1024)
    transcript.record("rpc", dir="in", msg={"params": ["ab"] * 200_000})
    transcript.close()
    (record,) = read_transcript(tmp_path / "t.jsonl")
    assert record["truncated"] is True and record["bytes"] > 1_000_000
    assert (tmp_path / "t.jsonl").stat().st_size < 1024


UPDATE = '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":' \
         '"agent_message_chunk","content":{"type":"text","text":"TEXT"}}}}'  # fmt: skip


@pytest.mark.parametrize(
    "line",
    [
        UPDATE.replace("TEXT", "\\ud800 a lone surrogate"),
        UPDATE.replace(',"method"', ',\r"method"'),
        UPDATE.replace('"text":"TEXT"', '"text":"shown first","text":"the one read"'),
    ],
    ids=["escaped-lone-surrogate", "carriage-return-between-tokens", "duplicate-key"],
)
def test_odd_but_valid_json_keeps_the_transcript_line_for_line(scripted_scenario, harness_config, run_loop, line):
    """JSON the parser takes that a transcript line must not carry as is: a lone surrogate (not UTF-8 once
    decoded) and a carriage return (a reader's universal newlines would split the line there); and a duplicate
    key, kept as the agent wrote it, which a reader must read as the kernel did (the last one)."""
    result = run_one(scripted_scenario, harness_config, run_loop, turn({"garbage": {"text": line}},
                                                                        {"message": "after"}))  # fmt: skip
    records = read_transcript(result.transcript)  # every line one whole record
    assert result.reason["kind"] != "kernel_error", result.reason
    said = [r["msg"]["params"]["update"]["content"]["text"] for r in records if r["type"] == "rpc"
            and r["msg"].get("method") == "session/update" and r["msg"]["params"]["sessionId"] == "s"]  # fmt: skip
    assert said and set(said) == {json.loads(line)["params"]["update"]["content"]["text"]}  # (once a turn)
    assert "after" in json.dumps(records)  # the agent's next message was read and recorded too


def test_a_lone_surrogate_the_kernel_copies_into_its_own_records_and_answers_keeps_them_valid(
    scripted_scenario, harness_config, run_loop
):
    """Strings the agent sent that the kernel encodes itself (a tool title in a policy record, a path in a
    refusal) cannot be UTF-8: they are written as their escape, and the run goes on to its refusal."""
    # raw lines (YAML, the scenario's format, cannot carry a lone surrogate); the task's session is sess_1
    ask = ('{"jsonrpc":"2.0","id":901,"method":"session/request_permission","params":{"sessionId":"sess_1",'
           '"toolCall":{"toolCallId":"c1","kind":"read","title":"Read \\ud800","locations":[{"path":"README.md"}]},'
           '"options":[{"optionId":"a","name":"Allow","kind":"allow_once"}]}}')  # fmt: skip
    read = '{"jsonrpc":"2.0","id":902,"method":"fs/read_text_file","params":{"sessionId":"sess_1","path":"/\\ud800"}}'
    steps = turn({"garbage": {"text": ask}}, {"sleep": 0.3}, {"garbage": {"text": read}}, {"sleep": 0.3},
                 {"message": "after"})  # fmt: skip
    result = run_one(scripted_scenario, harness_config, run_loop, steps)
    assert result.terminal is Terminal.BLOCKED_POLICY, result.reason
    records = read_transcript(result.transcript)  # every line one whole record
    policy = [(r["source"], r["decision"], r.get("tool"), r.get("path")) for r in records if r["type"] == "policy"]
    assert policy == [
        ("session/request_permission", "allow", "Read \ud800", None),
        ("fs/read_text_file", "refuse", None, "/\ud800"),
    ]
    answers = [r["msg"] for r in records if r["type"] == "rpc" and r["dir"] == "out" and "error" in r["msg"]]
    assert [a["error"]["data"]["kind"] for a in answers] == ["unparseable"]  # a name no file system takes


def test_a_line_that_is_not_utf8_is_a_framing_error(scripted_scenario, harness_config, run_loop):
    """ACP is UTF-8 JSON: a surrogate encoded as bytes (which `json.loads(bytes)` would take) is refused."""
    line = UPDATE.replace("TEXT", "@").encode().replace(b"@", bytes.fromhex("eda080")).hex()
    result = run_one(scripted_scenario, harness_config, run_loop, turn({"garbage": {"hex": line}}))
    assert (result.terminal, result.reason["kind"]) == (Terminal.FAILED, "framing_error")
    assert "utf-8" in result.reason["error"]
    read_transcript(result.transcript)


def test_an_agent_that_exits_before_answering_initialize_with_a_child_holding_its_stdout(harness_config, run_loop):
    """No EOF ever comes and every write goes through (a background child keeps both pipes): the agent's
    exit alone must end the wait for its answer, typed, long before the init timeout. (Without that, the
    wait sometimes ends early anyway, on a pipe the shell's exit closed first: it catches a removal often,
    not always.)"""
    script = "sleep 30 <&0 & echo 'about to go' >&2; exit 7"  # the child keeps stdin open too
    result = run_loop(
        harness_config(agent=["sh", "-c", script], sandbox={"mode": "off"}, limits={"init_timeout_s": 20})
    )
    assert result.terminal is Terminal.FAILED
    assert (result.reason["kind"], result.reason["exit_status"]) == ("agent_exited", 7)
    assert "about to go" in result.reason["stderr_tail"]
    records = read_transcript(result.transcript)
    assert not [r for r in records if r["type"] == "rpc" and r["dir"] == "in"]  # never answered
    assert records[-1]["t"] < 20, "the wait ran to the init timeout: the exit did not end it"
