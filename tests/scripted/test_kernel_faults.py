"""Faults on the kernel's side end typed (issue 29): a hostile agent that fills the disk the transcript is on,
leaves directories it made unremovable, or sends numbers JSON cannot spell. Each is tried through the CLI with
the sandbox on, as the attacker would; the run must end in a terminal with a complete, strictly valid
transcript, and leave nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import DEFAULT_RULES, assert_transcript_valid, loop_config, make_workspace, records, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
SANDBOX = {"mode": "workspace-write"}


def strict_lines(text: str) -> list[Any]:
    """Every line parsed by a reader that takes only JSON (RFC 8259: no NaN, no Infinity)."""

    def refuse(word: str) -> Any:
        raise ValueError(f"{word} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.stdout.strip(), done.stderr
    report: dict[str, Any] = strict_lines(done.stdout.strip().splitlines()[-1])[0]
    return report


def assert_complete(transcript: Path) -> list[dict[str, Any]]:
    """Strict JSON on every line, valid against the schema, numbered without gaps, the terminal last."""
    strict_lines(transcript.read_text(encoding="utf-8"))
    found = assert_transcript_valid(transcript)
    assert [r["seq"] for r in found] == list(range(1, len(found) + 1))
    assert found[0]["type"] == "run_start" and found[-1]["type"] == "terminal", found[-1]
    return found


# --- a full disk -------------------------------------------------------------------------------


def own_disk(tmp_path: Path, size: str) -> list[str]:
    """The argv prefix that runs a shell with a `size` tmpfs of its own mounted (root: a mount namespace;
    an ordinary user: a user namespace too), or a skip where neither can be made."""
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix.insert(1, "--map-root-user")
    probe = tmp_path / "probe"
    probe.mkdir()
    mount = [*prefix, "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(probe)]
    if shutil.which("unshare") is None or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("no mount namespace to give the run a small disk")
    return prefix


@LOOP_SLOW
def test_a_disk_the_agent_filled_ends_the_run_failed_with_a_complete_transcript(tmp_path, short_dir):
    """The worktree, the transcripts and TMPDIR on one 24 MiB disk: the agent fills it through its write rule,
    then keeps talking, so the kernel must go on writing records. Before: the write failed, the kernel died
    with a traceback, no JSON on stdout, no terminal in the transcript."""
    prefix = own_disk(tmp_path, "24m")
    disk, seed, kept = short_dir / "disk", short_dir / "seed", tmp_path / "kept"
    ws = make_workspace(disk / "ws", files={"src/keep.txt": "keep\n"})
    chatter = [{"message": f"still here {i}: " + "x" * 4000} for i in range(100)]
    fill = {"run": {"script": "head -c 100M /dev/zero > src/fill; df -k ."}}
    path = write_yaml(disk / "scenario.yaml", scenario({"T1": [turn(fill, *chatter)]}))
    # directory binds: the agent's writes land on this disk (an overlay's upper layer lives in the run's directory)
    write_yaml(disk / "loop.yaml", loop_config(ws, path, sandbox={**SANDBOX, "worktree": "bind"},
                                               transcripts=str(disk / "transcripts")))  # fmt: skip
    (disk / "tmp").mkdir()
    disk.rename(seed)  # the tree is copied onto the small disk, mounted where it was made
    disk.mkdir()
    script = ('mount -t tmpfs -o size=24m tmpfs "$0" && cp -a "$1"/. "$0"/ || exit 99; '
              '"$2" run "$0/loop.yaml" --json; status=$?; cp -a "$0/transcripts" "$3"; exit $status')  # fmt: skip
    done = subprocess.run([*prefix, "sh", "-c", script, str(disk), str(seed), CLI, str(kept)], capture_output=True,
                          text=True, timeout=180, env={**os.environ, "TMPDIR": str(disk / "tmp")})  # fmt: skip

    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    report = last_json(done)
    assert report["terminal"] == "Failed" and report["reason"]["kind"] == "disk_full", report
    assert report["reason"]["errno"] == "ENOSPC"
    transcript = kept / Path(report["transcript"]).name
    found = assert_complete(transcript)
    assert found[-1]["terminal"] == "Failed" and found[-1]["reason"] == report["reason"]
    assert len([r for r in found if r["type"] == "disk_full"]) == 1
    said = [r for r in found if r["type"] == "rpc" and "still here" in json.dumps(r)]
    assert said, "the agent's messages after the fill are recorded while the reserve lasts"
    fault = next(r["seq"] for r in found if r["type"] == "disk_full")
    ended = next(r for r in found if r["type"] == "task_end")
    assert ended["seq"] > fault and ended["terminal"] == "Failed" and ended["reason"]["kind"] == "disk_full"
    assert any(r["type"] == "turn_cancelled" and r["seq"] > fault for r in found), "the turn went on to its end"


# --- what the agent made unremovable --------------------------------------------------------------


@pytest.fixture(name="short_dir")
def short_dir_fixture() -> Iterator[Path]:
    """A directory with a short path, outside pytest's (a run's proxy socket lives under TMPDIR, and a Unix
    socket's path is at most 107 bytes). Removed after, whatever the modes in it."""
    base = Path(tempfile.mkdtemp(prefix="loop-harness-faults-"))
    try:
        yield base
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def as_ordinary_user(base: Path) -> tuple[list[str], dict[str, str]]:
    """How to run the CLI so that directory modes bind it as they bind an ordinary user: as it is, or under root
    without the capabilities that override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER: another uid
    could not reach a venv under /root). Its HOME and TMPDIR are under `base`."""
    env = {**os.environ, "HOME": str(base / "home"), "TMPDIR": str(base / "tmp"), "XDG_STATE_HOME": str(base / "state")}
    for name in ("home", "tmp"):
        (base / name).mkdir(exist_ok=True)
    if os.geteuid() != 0:
        return [], env
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to run the kernel without the capabilities that override file modes")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"], env


@LOOP_SLOW
def test_teardown_removes_directories_the_agent_made_unremovable(short_dir):
    """chmod 500 and 000 directories, with files in them, in the private HOME and TMP, the kernel an ordinary
    user (root removes them whatever their mode). Before: the sandbox step's rmtree ignored its errors and the
    run's directory outlived the run."""
    ws = make_workspace(short_dir / "ws")
    lock = ("mkdir -p {d}/ro/deep {d}/none/in && touch {d}/ro/f {d}/ro/deep/g {d}/none/f {d}/none/in/g && "
            "chmod 000 {d}/ro/deep {d}/none/in && chmod 500 {d}/ro && chmod 000 {d}/none")  # fmt: skip
    script = f"{lock.format(d='$HOME')} && {lock.format(d='$TMPDIR')} && echo locked"
    steps = ({"tool_call": {"id": "c1", "title": "Lock my dirs", "kind": "think"}}, {"run": {"script": script}})
    path = write_yaml(short_dir / "scenario.yaml", scenario({"T1": [turn(*steps)]}))
    config = write_yaml(short_dir / "loop.yaml", loop_config(ws, path, sandbox=SANDBOX,
                                                            transcripts=str(short_dir / "transcripts")))  # fmt: skip
    prefix, env = as_ordinary_user(short_dir)

    done = subprocess.run([*prefix, CLI, "run", str(config), "--json"], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip

    report = last_json(done)
    assert report["terminal"] == "Idle", (report, done.stderr[-2000:])
    found = assert_complete(Path(report["transcript"]))
    assert any("locked" in json.dumps(r) for r in found if r["type"] == "rpc"), "the agent did not lock its dirs"
    sandbox = next(r for r in found if r["type"] == "sandbox" and "home" in r)
    home, tmp = Path(sandbox["home"]), Path(sandbox["tmp"])
    assert not home.exists(), sorted(str(p) for p in home.parent.rglob("*"))
    assert not tmp.exists()
    assert not home.parent.exists(), "the run's directory outlived the run"
    assert not [r for r in found if r["type"] == "teardown_error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a file no chmod gives back (chattr +i)")
def test_what_teardown_cannot_remove_is_named_in_the_transcript(tmp_path, scripted_scenario, harness_config,
                                                                run_loop):  # fmt: skip
    """An immutable file (planted by root as the run starts: the agent has no capability for it) cannot be
    removed: the `sandbox` step names it rather than ignore it."""
    planted: list[Path] = []

    def plant(record: dict[str, Any]) -> None:
        if record["type"] == "sandbox" and "home" in record and not planted:
            stuck = Path(record["home"]) / "stuck"
            stuck.mkdir()
            (stuck / "f").write_text("x")
            if subprocess.run(["chattr", "+i", str(stuck / "f")], capture_output=True).returncode == 0:
                planted.append(stuck / "f")

    path = scripted_scenario(scenario({"T1": [turn({"message": "hello"})]}))
    try:
        result = run_loop(harness_config(path, sandbox=SANDBOX), observer=plant)
        if not planted:
            pytest.skip("chattr +i does not work on this filesystem")
        errors = records(result, "teardown_error", step="sandbox")
        assert len(errors) == 1, errors
        assert str(planted[0]) in errors[0]["left"] and errors[0]["left_count"] >= 1
        assert "could not be removed" in errors[0]["error"]
    finally:
        for stuck in planted:
            subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)
            shutil.rmtree(stuck.parents[2], ignore_errors=True)  # the run's directory


# --- numbers JSON cannot spell ---------------------------------------------------------------------

NON_FINITE = {"ratio": float("nan"), "high": float("inf"), "low": float("-inf")}


@LOOP_SLOW
def test_non_finite_numbers_an_agent_sends_reach_the_transcript_as_strings(tmp_path):
    """The scripted agent writes its messages with Python's json, which spells NaN and ±Infinity as bare words
    (and the ACP SDK reads them): in a session/update (recorded from the wire) and in host-tool arguments
    (recorded from the parsed call). Before: stored verbatim, so the line was no JSON to a strict reader."""
    ws = make_workspace(tmp_path / "ws")
    steps = [
        {"tool_call": {"id": "c1", "title": "Measure", "kind": "think", "raw_input": NON_FINITE}},
        {"mcp_call": {"tool": "get_issue", "arguments": NON_FINITE}},
        {"message": "NaN is a word here, and so is Infinity"},
    ]
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(*steps)]}, agent={"mcp_http": True}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=DEFAULT_RULES, sandbox=SANDBOX,
                                                            transcripts=str(tmp_path / "transcripts")))  # fmt: skip

    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)

    report = last_json(done)
    transcript = Path(report["transcript"])
    found = assert_complete(transcript)
    assert report["terminal"] == "Idle", report
    spelt = {"ratio": "NaN", "high": "Infinity", "low": "-Infinity"}
    updates = [r["msg"]["params"]["update"] for r in found if r["type"] == "rpc" and r["dir"] == "in"
               and r["msg"].get("method") == "session/update"]  # fmt: skip
    assert {"rawInput": spelt}.items() <= next(u for u in updates if u.get("toolCallId") == "c1").items()
    calls = [r for r in found if r["type"] == "host_tool"]
    assert calls and calls[0]["arguments"] == spelt, calls
    said = [u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
    assert "NaN is a word here, and so is Infinity" in said  # a string that holds the words is kept as it was
    assert read_transcript(transcript) == found
