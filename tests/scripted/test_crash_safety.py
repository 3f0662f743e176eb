"""Crashes lose nothing: the kernel is killed (SIGKILL) at the named points, then a second run
recovers, through the CLI as a user would run it. Also: bad configs, tracebacks, forged markers."""

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
from harness.testing import DEFAULT_RULES
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="harness_config")
def unsandboxed_config(harness_config):
    """Crash safety of runs without the OS sandbox: what a killed kernel leaves behind and recovery ends.
    With the sandbox on, its pid namespace ends everything at once (tests/scripted/test_sandbox.py)."""

    def write(*args, **options):
        options.setdefault("sandbox", {"mode": "off"})
        return harness_config(*args, **options)

    return write


CLI = str(Path(sys.executable).parent / "loop-harness")


def cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def records(path: Path) -> list[dict]:
    return read_transcript(path) if path.exists() else []


def start(config: Path, transcript: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([CLI, "run", str(config), "--transcript", str(transcript)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def kill_kernel(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)  # no teardown, no terminal line
    process.wait()
    assert process.stderr is not None
    process.stderr.close()


def gone(pid: int, settle: float = 5.0) -> bool:
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def said(path: Path) -> list[str]:
    return [r["msg"]["params"]["update"]["content"]["text"] for r in records(path)
            if r["type"] == "rpc" and r["msg"].get("method") == "session/update"
            and r["msg"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]  # fmt: skip


def recover(harness_config, scripted_scenario, workspace=None) -> subprocess.CompletedProcess[str]:
    """A second run with the same transcripts directory: it recovers the first. (`workspace`: another
    worktree, for a first run that is still alive and holds its own.)"""
    quick = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}), name="quick.yaml")
    done = cli("run", harness_config(quick, name="quick-loop.yaml", workspace=workspace), "--json")
    assert done.returncode == 0, done.stderr
    return done


def assert_ended_restarted(transcript: Path) -> dict:
    lines = transcript.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the transcript ends with a whole line"
    parsed = read_transcript(transcript)  # valid JSONL throughout
    last = parsed[-1]
    assert (last["type"], last["terminal"], last["reason"]["kind"]) == ("terminal", "Failed", "restarted")
    assert last["seq"] == parsed[-2]["seq"] + 1
    return last


@LOOP_SLOW
def test_killed_between_spawn_and_initialize(scripted_scenario, harness_config, tmp_path):
    slow = scripted_scenario({"startup": [{"sleep": 60}], "tasks": [{"turns": [turn()]}]}, name="slow.yaml")
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(harness_config(slow, name="slow-loop.yaml"), first)
    wait_for(lambda: any(r["type"] == "agent_start" for r in records(first)), "the agent to start")
    agent = next(r["pid"] for r in records(first) if r["type"] == "agent_start")
    assert not any(r["type"] == "rpc" and r["dir"] == "in" for r in records(first)), "initialize was answered"
    kill_kernel(process)
    assert not gone(agent, settle=0.5), "the agent outlives its kernel until recovery"

    recover(harness_config, scripted_scenario)

    assert gone(agent), "recovery ended the agent started before its initialize answer"
    assert assert_ended_restarted(first)["reason"]["agent_killed"] is True


@LOOP_SLOW
@pytest.mark.parametrize(
    "command",
    [["sleep", "300"], ["setsid", "sleep", "300"], ["bash", "-c", "sleep 300 & echo started"]],
    ids=["own-session", "setsid-grandchild", "backgrounded"],
)
def test_killed_while_a_terminal_runs(scripted_scenario, harness_config, tmp_path, command):
    rules = [*DEFAULT_RULES, {"id": "run", "kind": "execute", "commands": ["sleep *", "setsid *", "echo *"],
                              "decision": "allow"}]  # fmt: skip
    steps = [{"terminal": {"command": command[0], "args": command[1:], "wait": False}}, {"hang": True}]
    busy = scripted_scenario(scenario({"T1": [turn(*steps)]}), name="busy.yaml")
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(harness_config(busy, name="busy-loop.yaml", rules=rules), first)
    token = _token(first)
    wait_for(lambda: _sleepers(token), "the terminal's command")
    sleepers = _sleepers(token)
    kill_kernel(process)
    assert all(not gone(pid, settle=0.3) for pid in sleepers), "the command outlives its kernel until recovery"

    recover(harness_config, scripted_scenario)

    assert all(gone(pid) for pid in sleepers), "recovery ended every process the dead run started"
    ended = assert_ended_restarted(first)["reason"]["processes_ended"]
    assert {e["pid"] for e in ended} >= set(sleepers)


def _token(transcript: Path) -> str:
    """The run's token, from its marker (every process the run starts carries it)."""
    marker = transcript.parent / ".active" / f"{transcript.name}.json"
    wait_for(marker.exists, "the run's marker")
    return json.loads(marker.read_text())["token"]


def _sleepers(token: str) -> list[int]:
    """The `sleep 300` processes the run with this token started."""
    found = []
    for process in psutil.process_iter(["name"]):
        try:
            if process.info["name"] == "sleep" and process.environ().get("LOOP_HARNESS_RUN_TOKEN") == token:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


@LOOP_SLOW
def test_a_torn_last_line_is_cut_and_kept(scripted_scenario, harness_config, tmp_path):
    steps = [{"message": "working"}, {"hang": True}]
    busy = scripted_scenario(scenario({"T1": [turn(*steps)]}), name="busy.yaml")
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(harness_config(busy, name="busy-loop.yaml"), first)
    wait_for(lambda: "working" in "".join(said(first)), "the agent to work")
    kill_kernel(process)
    torn = b'{"seq": 99, "t": 1.5, "type": "rpc", "dir": "in", "msg": {"jsonrpc": "2.0", "meth'
    with first.open("ab") as f:  # what a crash in the middle of a write leaves
        f.write(torn)

    recover(harness_config, scripted_scenario)

    last = assert_ended_restarted(first)
    assert last["reason"]["torn_tail"] == {"bytes": len(torn), "text": torn.decode()}


@LOOP_SLOW
def test_completed_tasks_are_not_run_again_after_a_kill(scripted_scenario, harness_config, harness_workspace, tmp_path):
    tasks = [{"id": "T1", "title": "one"}, {"id": "T2", "title": "two"}]
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")],
                                       "T2": [turn({"message": "stuck"}, {"hang": True})]}))  # fmt: skip
    config = harness_config(path, tasks=tasks)
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(config, first)
    wait_for(lambda: "stuck" in "".join(said(first)), "T2 to start")
    kill_kernel(process)
    scripted_scenario(scenario({"T1": [turn({"crash": {}})], "T2": [write_turn("src/b.txt", "b\n", commit="T2")]}))

    done = cli("run", config, "--json")

    assert done.returncode == 0, done.stderr
    report = last_json(done.stdout)
    assert report["reason"] == {"kind": "queue_empty", "completed": 1, "skipped_completed_earlier": 1}
    t1, t2 = report["tasks"]
    assert (t1["id"], t1["terminal"], t1["reason"]["kind"]) == ("T1", "Completed", "completed_earlier")
    assert t1["reason"]["transcript"] == str(first)
    assert (t2["id"], t2["terminal"]) == ("T2", "Completed")
    assert harness_workspace.pushed_log()[:2] == ["T2", "T1"]  # T1 was not done twice


# --- configs, tracebacks ------------------------------------------------------------------------


def test_a_config_that_is_not_utf8_exits_2_naming_the_file(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("workspace: /tmp\nagent: {command: [caf\xe9]}\n".encode("latin-1"))
    done = cli("run", config, "--json")
    assert done.returncode == 2
    assert str(config) in done.stderr and "not UTF-8" in done.stderr
    assert "Traceback" not in done.stderr
    assert last_json(done.stdout)["error"]["kind"] == "config"


@LOOP_SLOW
def test_an_agent_killed_with_a_permission_pending_leaves_no_traceback(scripted_scenario, harness_config):
    ask = {"jsonrpc": "2.0", "id": 900, "method": "session/request_permission",
           "params": {"sessionId": "sess_1", "toolCall": {"toolCallId": "c1", "title": "Read", "kind": "read",
                                                           "locations": [{"path": "README.md"}]},
                      "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}]}}  # fmt: skip
    dying = turn({"tool_call": {"title": "x", "kind": "read"}}, {"garbage": {"text": json.dumps(ask)}}, {"crash": {}})
    done = cli("run", harness_config(scripted_scenario(scenario({"T1": [dying]}))), "--json")
    assert done.returncode == 1
    assert last_json(done.stdout)["reason"]["kind"] == "agent_exited"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


@LOOP_SLOW
def test_a_setsid_grandchild_ends_with_the_run_and_leaves_no_traceback(scripted_scenario, harness_config):
    steps = [{"spawn_child": {"seconds": 300, "setsid": True}}, *write_turn("src/a.txt", "a\n", commit="T1")["steps"]]
    done = cli("run", harness_config(scripted_scenario(scenario({"T1": [turn(*steps)]}))), "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    transcript = Path(last_json(done.stdout)["transcript"])
    child = int(next(t for t in said(transcript) if t.startswith("child pid ")).split()[-1])
    assert gone(child), "a grandchild in a session of its own ended with the run"


# --- forged markers -----------------------------------------------------------------------------


@LOOP_SLOW
@pytest.mark.parametrize("forgery", ["outside-path", "other-name", "symlink-marker", "symlink-transcript",
                                     "not-json", "foreign-pid", "no-run-start"])  # fmt: skip
def test_a_forged_marker_is_followed_nowhere(scripted_scenario, harness_config, tmp_path, forgery):
    transcripts = tmp_path / "transcripts"
    active = transcripts / ".active"
    active.mkdir(parents=True)
    victim_file = tmp_path / "victim.jsonl"
    victim_file.write_text('{"seq": 1, "type": "run_start"}\n')
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not started by any kernel
    dead_kernel = {"pid": 999999, "started": 1.0}
    marker = {"transcript": "run-x.jsonl", "token": "0" * 32, "started": 0.0, "kernel": dead_kernel,
              "agent": {"pid": victim.pid, "started": psutil.Process(victim.pid).create_time()}}  # fmt: skip
    name = "run-x.jsonl.json"
    if forgery == "outside-path":
        marker["transcript"] = str(victim_file)
    elif forgery == "other-name":
        marker["transcript"] = "run-y.jsonl"
        (transcripts / "run-y.jsonl").write_text('{"seq": 1, "type": "run_start"}\n')
    elif forgery == "symlink-marker":
        (tmp_path / "real-marker.json").write_text(json.dumps(marker))
        os.symlink(tmp_path / "real-marker.json", active / name)
    elif forgery == "symlink-transcript":
        os.symlink(victim_file, transcripts / "run-x.jsonl")
    elif forgery == "not-json":
        (active / name).write_text("{not json")
    elif forgery == "foreign-pid":
        (transcripts / "run-x.jsonl").write_text('{"seq": 1, "type": "run_start"}\n')
    elif forgery == "no-run-start":
        (transcripts / "run-x.jsonl").write_text('{"seq": 1, "type": "rpc"}\n')
    if not os.path.lexists(active / name):
        (active / name).write_text(json.dumps(marker))
    before = {p: p.read_bytes() for p in (victim_file, transcripts / "run-y.jsonl", transcripts / "run-x.jsonl")
              if p.exists() and not p.is_symlink()}  # fmt: skip
    try:
        recover(harness_config, scripted_scenario)
        assert not gone(victim.pid, settle=0.3), "a process no kernel started was killed"
        assert victim_file.read_bytes() == before[victim_file]
        for path, content in before.items():
            if path.name != "run-x.jsonl" or forgery != "foreign-pid":
                assert path.read_bytes() == content, path
        assert not os.path.lexists(active / name), "the marker is dealt with once"
    finally:
        victim.kill()
        victim.wait()


@LOOP_SLOW
def test_a_torn_line_longer_than_a_read_block_is_cut_whole(scripted_scenario, harness_config, tmp_path):
    busy = scripted_scenario(scenario({"T1": [turn({"message": "working"}, {"hang": True})]}), name="busy.yaml")
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(harness_config(busy, name="busy-loop.yaml"), first)
    wait_for(lambda: "working" in "".join(said(first)), "the agent to work")
    kill_kernel(process)
    torn = b'{"seq": 99, "type": "rpc", "msg": "' + "é".encode() * (3 << 20)  # 6 MiB, no newline
    with first.open("ab") as f:
        f.write(torn)

    recover(harness_config, scripted_scenario)

    last = assert_ended_restarted(first)
    assert last["reason"]["torn_tail"]["bytes"] == len(torn)


@LOOP_SLOW
def test_a_live_runs_marker_rewritten_to_name_a_dead_kernel_is_not_trusted(
    scripted_scenario, harness_config, tmp_path, make_harness_workspace
):
    busy = scripted_scenario(scenario({"T1": [turn({"message": "working"}, {"hang": True})]}), name="busy.yaml")
    first = tmp_path / "transcripts" / "first.jsonl"
    process = start(harness_config(busy, name="busy-loop.yaml"), first)
    try:
        wait_for(lambda: "working" in "".join(said(first)), "the agent to work")
        marker = first.parent / ".active" / f"{first.name}.json"
        forged = {**json.loads(marker.read_text()), "kernel": {"pid": 999999, "started": 1.0}}
        marker.write_text(json.dumps(forged))
        agent = next(r["pid"] for r in records(first) if r["type"] == "agent_start")

        second = recover(harness_config, scripted_scenario, make_harness_workspace("second"))

        assert not gone(agent, settle=0.3), "a live run's agent was killed"
        assert records(first)[-1]["type"] != "terminal"
        recovered = [
            r for r in read_transcript(Path(last_json(second.stdout)["transcript"])) if r["type"] == "recovered"
        ]
        assert "run_start" in recovered[0]["refused"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()
    assert records(first)[-1]["terminal"] == "Cancelled"


@LOOP_SLOW
@pytest.mark.parametrize("what", ["active-symlink", "active-entry-directory", "completed-symlink"])
def test_what_an_agent_plants_in_the_transcripts_directory_is_followed_nowhere(
    scripted_scenario, harness_config, tmp_path, what
):
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.docx").write_text("years of work\n")
    if what == "active-symlink":
        os.symlink(victim, transcripts / ".active")
    elif what == "active-entry-directory":
        (transcripts / ".active" / "run-x.jsonl.json").mkdir(parents=True)
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")],
                                       "T2": [turn({"crash": {}})]}))  # fmt: skip
    config = harness_config(path, tasks=[{"id": "T1", "title": "one"}, {"id": "T2", "title": "two"}])
    if what == "completed-symlink":
        os.symlink(victim, transcripts / ".completed")

    done = cli("run", config, "--json")

    assert last_json(done.stdout)["tasks"][0]["terminal"] == "Completed", done.stderr  # it ran
    assert sorted(p.name for p in victim.iterdir()) == ["thesis.docx"]
    assert (victim / "thesis.docx").read_text() == "years of work\n"


@pytest.mark.parametrize("where", ["inside", "through-a-symlink"])
def test_a_completions_file_the_agent_could_write_is_refused_before_the_run(
    scripted_scenario, harness_config, harness_workspace, tmp_path, where
):
    """The caller's completions file (the server's) names tasks the kernel skips as done: inside the worktree the
    agent could write ids there and have work skipped, so it is refused like a transcript there."""
    import asyncio

    from harness import ConfigError, Kernel, load_config

    config = load_config(harness_config(scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n")]}))))
    if where == "inside":
        completions = harness_workspace.path / "out" / "done.jsonl"
    else:
        (tmp_path / "looks-outside").symlink_to(harness_workspace.path, target_is_directory=True)
        completions = tmp_path / "looks-outside" / "done.jsonl"
    with pytest.raises(ConfigError) as refused:
        asyncio.run(Kernel(config, completions=completions).run())
    assert refused.value.key == "completions"
    assert not (harness_workspace.path / "out" / "done.jsonl").exists()
    assert not (harness_workspace.path / "done.jsonl").exists()
    transcripts = tmp_path / "transcripts"
    assert not transcripts.exists() or not list(transcripts.glob("*.jsonl"))  # refused before anything is written
