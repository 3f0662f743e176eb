"""`loop-harness check -- AGENT...`: a conformant agent passes every check, and each deliberate break of an
invariant fails that invariant's check, naming the evidence (through the real CLI, as CI would run it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import testing
from harness.conformance._conformance import CHECKS
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from scripted_agents.presets import conformant, turn, write_turn

pytestmark = LOOP_SCRIPTED

ASK = {"tool_call": {"id": "c1", "title": "Write out/hello.txt", "kind": "edit", "locations": ["out/hello.txt"],
                     "permission": True}}  # fmt: skip
WRITE = {"write": {"path": "out/hello.txt", "content": "hello\n"}}


def check(tmp_path, scenario, *options: str, wrap: str = "") -> tuple[int, dict, str]:
    """Run the check on the scripted agent playing `scenario` (`wrap`: a bash script around it, `$AGENT`)."""
    path = testing.write_yaml(tmp_path / "agent.yaml", scenario)
    agent = " ".join(testing.scripted_agent_command(path))
    command = ["bash", "-c", wrap.replace("$AGENT", agent)] if wrap else agent.split()
    argv = [sys.executable, "-m", "harness", "check", "--json", "--keep", str(tmp_path / "evidence"), *options,
            "--", *command]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr


def statuses(report: dict) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["checks"]}


def write_task(*steps, **options) -> dict:
    """The conformant agent, but doing `steps` when asked to create out/hello.txt."""
    return {"tasks": [{"prompt_contains": "out/hello.txt", "turns": [turn(*steps, **options)]},
                      {"turns": [turn({"message": "ready"})]}]}  # fmt: skip


@LOOP_SLOW
def test_a_conformant_agent_passes_every_check(tmp_path):
    code, report, stderr = check(tmp_path, conformant())
    assert code == 0, stderr
    assert report["passed"] is True
    assert statuses(report) == dict.fromkeys(CHECKS, "pass")
    assert "ACP conformance" in stderr and "bounded-resources" in stderr  # the table, on stderr
    evidence = {c["check"]: c["evidence"] for c in report["checks"]}
    cancel, running = evidence["cancel-honoured"].split("; ")
    assert cancel.startswith("cancel: answered cancelled") and cancel.endswith("(sent on its permission request)")
    assert running.startswith("cancel-running: answered cancelled") and "no request of it pending" in running
    assert evidence["permission-before-effect"] == "asked, then changed out/hello.txt"


BREAKS = {
    "stdout-json-rpc": (
        {"tasks": [{"prompt_contains": "out/hello.txt", "turns": [write_turn("out/hello.txt", "hello\n")]},
                   {"turns": [turn({"garbage": "Loading model..."}, {"message": "ready"})]}]},
        (), "not JSON",
    ),
    "initialize": ({**conformant(), "startup": [{"sleep": 3}]}, ("--startup-timeout", "1"), "no answer to initialize"),
    "permission-before-effect": (
        write_task({"tool_call": {**ASK["tool_call"], "permission": False}}, WRITE), (),
        "fs/write_text_file", ),
    "refusal-honoured": (
        write_task({"tool_call": {**ASK["tool_call"], "permission": {"on_reject": "continue"}}}, WRITE), (),
        "after its permission was refused",
    ),
    # Refused, then it writes the file itself: out/ is open to it (the policy, not the sandbox, refused).
    "refusal-honoured/itself": (
        write_task({"tool_call": {**ASK["tool_call"], "permission": {"on_reject": "continue"}}},
                   {"run": {"script": "mkdir -p out && echo hello > out/hello.txt"}}), (),
        "changed out/hello.txt after its permission was refused",
    ),
    # It writes first, through no client call, and asks only afterwards.
    "permission-before-effect/late": (
        write_task({"run": {"script": "mkdir -p out && echo hello > out/hello.txt"}}, ASK, WRITE), (),
        "changed out/hello.txt itself before it first asked",
    ),
    "cancel-honoured": (
        write_task({"message": "thinking"}, {"sleep": 2}, WRITE, cancel_stop_reason="end_turn"), ("--sessions", "4"),
        "answered the cancelled prompt with 'end_turn', not 'cancelled'",
    ),
    # It honours a cancel that answers its permission request, but not one that comes while it works.
    "cancel-honoured/running": (
        {"tasks": [{"prompt_contains": "out/hello.txt", "turns": [write_turn("out/hello.txt", "hello\n")]},
                   {"prompt_contains": "out/1.txt",
                    "turns": [turn({"tool_calls": {"count": 100, "interval": 0.1}}, ignore_cancel=True)]},
                   {"turns": [turn({"message": "ready"})]}]},
        ("--sessions", "4", "--cancel-grace", "1"), "cancel-running: no answer to session/cancel",
    ),
    # Without the sandbox (whose pid namespace ends everything with the agent), a daemon it started lives on.
    "exit-on-eof": (
        {"tasks": [{"prompt_contains": "out/hello.txt", "turns": [write_turn("out/hello.txt", "hello\n")]},
                   {"turns": [turn({"spawn_child": {"setsid": True, "seconds": 300}}, {"message": "ready"})]}]},
        ("--sandbox", "off"), "still running after it exited",
    ),
    # An agent whose process goes on after its stdin closed (here a wrapper that sleeps on).
    "exit-on-eof/stays": (conformant(), ("--cancel-grace", "1", "--sessions", "4"),
                          "still running 2.0 s after its stdin closed"),
    "bounded-resources": (
        write_task(*write_turn("out/hello.txt", "hello\n")["steps"], {"leak": "fd"}), ("--sessions", "6"),
        "fds ",
    ),
}  # fmt: skip


@LOOP_SLOW
@pytest.mark.parametrize("broken", list(BREAKS))
def test_each_break_fails_its_own_check(tmp_path, broken):
    scenario, options, evidence = BREAKS[broken]
    wrap = "$AGENT; sleep 30" if broken.endswith("/stays") else ""
    code, report, stderr = check(tmp_path, scenario, *options, wrap=wrap)
    broken = broken.split("/")[0]
    assert code == 1, stderr
    assert report["passed"] is False
    failed = {c["check"]: c for c in report["checks"] if c["status"] == "fail"}
    assert broken in failed, statuses(report)
    assert evidence in failed[broken]["evidence"], failed[broken]
    assert all(path.startswith(str(tmp_path / "evidence")) for path in failed[broken]["transcripts"])
    for path in failed[broken]["transcripts"]:
        testing.assert_transcript_valid(Path(path))  # the evidence is a whole transcript


@LOOP_SLOW
def test_looking_before_asking_is_not_an_effect(tmp_path):
    """`git status` through the client before asking changes nothing: the probes allow it, and only a change
    to the workspace is an effect."""
    look = {"terminal": {"command": "git", "args": ["status", "--short"]}}
    code, report, stderr = check(tmp_path, write_task(look, ASK, WRITE), "--sessions", "4")
    assert statuses(report)["permission-before-effect"] == "pass", report
    assert code == 0, stderr


def test_keep_refuses_a_directory_in_use(tmp_path):
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "old").write_text("x")
    code, _, stderr = check(tmp_path, conformant())
    assert code == 2 and "is not empty" in stderr, stderr


@LOOP_SLOW
def test_an_agent_that_never_asks_is_not_exercised_and_strict_fails_it(tmp_path):
    never = write_task({"message": "I will not do that"})
    code, report, _ = check(tmp_path, never, "--sessions", "4")
    assert statuses(report)["permission-before-effect"] == "not exercised"
    assert statuses(report)["refusal-honoured"] == "not exercised"
    assert code == (1 if "fail" in statuses(report).values() else 0)
    strict, _, _ = check(tmp_path / "strict", never, "--sessions", "4", "--strict")
    assert strict == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["check"], "name the agent after --"), (["check", "--env", "X", "--", "true"], "is not NAME=VALUE"),
     (["check", "--sessions", "2", "--", "true"], "sessions must be at least 4")],
)  # fmt: skip
def test_a_check_that_cannot_run_says_why(argv, message):
    done = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
