"""Under the OS sandbox the agent keeps its process contract (issue 35), through the CLI, sandbox off and on:

- the kernel's SIGTERM at teardown reaches the agent itself (its handler runs), then the grace, then SIGKILL;
- the exit status recorded (`agent_exit.status`, `Failed {kind: agent_exited}`'s `exit_status`) is the agent's
  own, bwrap's beside it where it differs;
- an agent that closes its stdout and stays alive ends the run at once, not at the turn timeout.

The agents are `tests/helpers/process_agent.py`; before issue 35, each case with the sandbox on failed (status
-15 for a trapped SIGTERM, 1 for a SIGKILL, `turn_timeout` for a closed stdout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.sandbox._status import SandboxStatus, from_shell_status
from harness.testing import assert_transcript_valid

pytestmark = LOOP_SCRIPTED

AGENT = Path(__file__).resolve().parents[1] / "helpers" / "process_agent.py"
CLI = str(Path(sys.executable).parent / "loop-harness")
#: the sandbox off, on as it is by default (a copy-on-write worktree), and on with the worktree bound
SANDBOXES = {"off": {"mode": "off"}, "overlay": {"worktree": "overlay"}, "bind": {"worktree": "bind"}}
TURN_TIMEOUT = 60.0


@pytest.fixture(params=list(SANDBOXES), name="sandbox")
def sandbox_fixture(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["off", "overlay"], name="off_or_on")
def off_or_on_fixture(request: pytest.FixtureRequest) -> str:
    """For the cases around the issue's three: the sandbox off, and on as it is by default."""
    return str(request.param)


def config(harness_config, mode: str, sandbox: str) -> Path:
    return harness_config(agent=[sys.executable, str(AGENT), mode], sandbox=SANDBOXES[sandbox],
                          limits={"turn_timeout_s": TURN_TIMEOUT, "cancel_grace_s": 1})  # fmt: skip


def run(path: Path) -> tuple[dict, list[dict], float]:
    """`loop-harness run PATH --json --prompt go`: its report, its transcript and how long it took."""
    start = time.monotonic()
    done = subprocess.run([CLI, "run", str(path), "--json", "--prompt", "go"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    took = time.monotonic() - start
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert_transcript_valid(Path(report["transcript"]))
    return report, read_transcript(Path(report["transcript"])), took


def agent_exit(records: list[dict]) -> dict:
    (record,) = [r for r in records if r["type"] == "agent_exit"]
    return record


@LOOP_SLOW
def test_the_teardowns_sigterm_reaches_the_agent(harness_config, sandbox):
    """The agent outlives its stdin's EOF: after the grace the kernel's SIGTERM reaches it, and its handler's
    exit status (42) is what is recorded (under the sandbox before issue 35: -15, bwrap's, the agent killed)."""
    report, records, _ = run(config(harness_config, "trap-term", sandbox))

    assert report["terminal"] == "EndTurn", report
    exited = agent_exit(records)
    assert (exited["status"], exited["on_eof"]) == (42, False), exited
    assert "sandbox_status" not in exited  # bwrap ended as the agent did
    assert exited["stderr_bytes"] == len(b"trapped SIGTERM\n")


@LOOP_SLOW
def test_a_user_cancel_then_the_sigterm_reaches_the_agent(harness_config, off_or_on, tmp_path):
    """SIGINT to the CLI cancels the turn (the agent answers `cancelled`); the teardown's SIGTERM then reaches the
    agent's handler, in the sandbox too."""
    path = config(harness_config, "trap-term-hang", off_or_on)
    cli = subprocess.Popen([CLI, "run", str(path), "--json", "--prompt", "go"], stdout=subprocess.PIPE, text=True)
    try:
        prompted(tmp_path / "transcripts")
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=60)
    finally:
        cli.kill()
        cli.wait()
    report = json.loads(out.strip().splitlines()[-1])
    records = read_transcript(Path(report["transcript"]))

    assert (report["terminal"], report["reason"]["kind"]) == ("Cancelled", "user_cancel"), report
    assert report["reason"]["agent_stop_reason"] == "cancelled"
    assert agent_exit(records)["status"] == 42


def prompted(transcripts: Path, timeout: float = 30.0) -> None:
    """Until the kernel has sent its `session/prompt` (the transcript says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any('"session/prompt"' in p.read_text(errors="replace") for p in transcripts.glob("*.jsonl")):
            return
        time.sleep(0.05)
    raise AssertionError("the kernel never prompted the agent")


@LOOP_SLOW
def test_an_agent_ignoring_sigterm_is_killed_after_the_grace(harness_config, off_or_on):
    """SIGKILL stays the last step: the agent ignores SIGTERM, and the kernel kills it 2 s on."""
    report, records, _ = run(config(harness_config, "ignore-term", off_or_on))

    assert report["terminal"] == "EndTurn", report
    exited = agent_exit(records)
    assert (exited["status"], exited["on_eof"]) == (-signal.SIGKILL, False), exited
    started = next(r["pid"] for r in records if r["type"] == "agent_start")  # bwrap, under the sandbox
    assert not psutil.pid_exists(started) or psutil.Process(started).status() == psutil.STATUS_ZOMBIE


@LOOP_SLOW
def test_an_agent_killed_by_sigkill_mid_request_reads_minus_nine(harness_config, sandbox):
    """Its own status, -9 (under the sandbox before issue 35: 1), with bwrap's 137 beside it."""
    report, records, _ = run(config(harness_config, "kill-self", sandbox))

    reason = report["reason"]
    assert (report["terminal"], reason["kind"], reason["exit_status"]) == ("Failed", "agent_exited", -9), report
    exited = agent_exit(records)
    assert exited["status"] == -signal.SIGKILL, exited
    if sandbox == "off":
        assert "sandbox_exit_status" not in reason and "sandbox_status" not in exited
    else:
        assert (reason["sandbox_exit_status"], exited["sandbox_status"]) == (137, 137), (reason, exited)


@LOOP_SLOW
@pytest.mark.parametrize("code", [3, 137])
def test_an_agent_exit_status_is_its_own(harness_config, off_or_on, code):
    """`exit(3)` reads 3; `exit(137)` by the agent itself reads 137, not a SIGKILL, and bwrap agrees."""
    report, records, _ = run(config(harness_config, f"exit-{code}", off_or_on))

    reason = report["reason"]
    assert (reason["kind"], reason["exit_status"]) == ("agent_exited", code), report
    assert "sandbox_exit_status" not in reason
    assert agent_exit(records)["status"] == code


@LOOP_SLOW
def test_a_closed_stdout_is_seen_at_once(harness_config, sandbox):
    """The agent closes its stdout and sleeps: the run ends with it at once, not at the turn timeout (under the
    sandbox before issue 35: `Failed turn_timeout`, a copy of the agent's stdout held by the sandbox). The
    teardown's SIGTERM then ends it (its default action: -15)."""
    report, records, took = run(config(harness_config, "close-stdout", sandbox))

    reason = report["reason"]
    assert (report["terminal"], reason["kind"]) == ("Failed", "agent_exited"), report
    assert reason["detail"] == "the agent closed stdout but kept running"
    assert took < TURN_TIMEOUT / 2, took  # about 3 s to see it is still running, 2 s grace, the CLI's start
    assert agent_exit(records)["status"] == -signal.SIGTERM


# --- the status read back, without a sandbox -----------------------------------------------------------------


@pytest.mark.parametrize(("code", "read"), [(0, 0), (3, 3), (128, 128), (129, -1), (137, -9), (143, -15), (192, -64),
                                            (193, 193), (255, 255)])  # fmt: skip
def test_bwraps_exit_code_reads_as_python_says_a_signal(code, read):
    assert from_shell_status(code) == read


def status_of(said: bytes, reported: bytes) -> SandboxStatus:
    """A SandboxStatus over pipes that hold what bwrap (`said`) and the bridge (`reported`) wrote, then ended."""
    fds = []
    for data in (said, reported):
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        fds.append(read)
    return SandboxStatus(*fds)


@pytest.mark.parametrize(
    ("said", "reported", "sandbox", "agent"),
    [
        (b'{"exit-code": 137}\n', b"137\n", 137, 137),  # the agent's own exit(137): the bridge's word wins
        (b'{"exit-code": 137}\n', b"-9\n", 137, -9),  # killed by SIGKILL
        (b'{"exit-code": 137}\n', b"", 137, -9),  # the bridge killed with it: bwrap's word, read back
        (b"", b"", -9, -9),  # bwrap killed: everything in its pid namespace died of SIGKILL
        (b'{"exit-code": 1}\n', b"", 1, 1),  # bwrap could not set the sandbox up
        (b"", b"", 1, 1),
    ],
)
def test_the_agents_status_is_the_bridges_word_then_bwraps(said, reported, sandbox, agent):
    status = status_of(b'{ "child-pid": 999999999, "pid-namespace": 1 }\n' + said, reported)
    try:
        assert status.agent_status(sandbox) == agent
        assert status.init_pid == 999999999
        assert not status.signal(signal.SIGTERM)  # no such process: no group to signal, nothing sent
    finally:
        status.close()
