"""`loop-harness run CONFIG.yaml [--json]` exactly as the contract says, run as a real process."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "loop-harness")


def cli(*args, timeout=60):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


@LOOP_SLOW
def test_the_demo_runs_as_the_readme_says(tmp_path):
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples)
    subprocess.run(
        ["bash", str(examples / "make-demo-workspace.sh"), str(tmp_path / ".demo")], check=True, capture_output=True
    )

    done = cli("run", examples / "demo.yaml", "--json")

    assert done.returncode == 0, done.stderr
    report = last_json(done.stdout)
    assert report["terminal"] == "Idle"
    assert report["reason"] == {"kind": "queue_empty", "completed": 2}
    assert [(t["id"], t["terminal"]) for t in report["tasks"]] == [("T1", "Completed"), ("T2", "Completed")]
    assert report["tasks"][0]["rule_ids"] == ["write-src", "read-all"]
    assert report["tasks"][1]["iterations"] == 2  # T2 first answers without a tool call
    demo = tmp_path / ".demo"
    pushed = subprocess.run(["git", "log", "--format=%s", "-2", "main"], cwd=demo / "origin.git", text=True,
                            capture_output=True, check=True).stdout.split("\n")[:2]  # fmt: skip
    assert pushed == ["T2: Add a farewell", "T1: Add a greeting"]  # the kernel committed each task
    records = read_transcript(Path(report["transcript"]))
    assert next(r for r in records if r["type"] == "sandbox")["mode"] == "workspace-write"
    assert "→ T1: Add a greeting" in done.stderr
    read_transcript(Path(report["transcript"]))


def test_a_blocked_run_exits_1_with_its_terminal(scripted_scenario, harness_config):
    config = harness_config(scripted_scenario(scenario({"T1": [write_turn("docs/x.md", "x\n")]})))
    done = cli("run", config, "--json")
    assert done.returncode == 1
    report = last_json(done.stdout)
    assert report["terminal"] == "BlockedPolicy"
    assert report["tasks"][0]["terminal"] == "BlockedPolicy"
    assert report["reason"]["refusal"]["kind"] == "unmatched"


@LOOP_SLOW
def test_single_task_and_single_prompt_runs(scripted_scenario, harness_config, tmp_path):
    path = scripted_scenario(
        scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")], None: [turn({"message": "hi"})]})
    )
    # the kernel commits: nothing left behind (issue 30)
    config = harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], commit={"message": "{id}"})

    task = cli("run", config, "--json", "--task", "T1", "--transcript", tmp_path / "one.jsonl")
    assert task.returncode == 0, task.stderr
    assert last_json(task.stdout)["terminal"] == "Completed"
    assert (tmp_path / "one.jsonl").exists()

    prompt = cli("run", config, "--json", "--prompt", "hello")
    assert prompt.returncode == 1  # EndTurn is not Idle or Completed
    assert last_json(prompt.stdout)["terminal"] == "EndTurn"


def test_human_output_without_json(scripted_scenario, harness_config):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    config = harness_config(path, commit={"message": "{id}"})  # the kernel commits: nothing left behind (issue 30)
    done = cli("run", config)
    assert done.returncode == 0
    assert done.stdout.startswith("Idle: queue_empty")
    assert "T1" in done.stdout and "Completed" in done.stdout and "write-src, read-all, git" in done.stdout
    assert "transcript:" in done.stdout


def test_sigint_cancels_the_run_and_closes_the_transcript(scripted_scenario, harness_config, tmp_path):
    config = harness_config(scripted_scenario(scenario({"T1": [turn({"message": "busy"}, {"hang": True})]})))
    transcript = tmp_path / "run.jsonl"
    process = subprocess.Popen(
        [CLI, "run", str(config), "--json", "--transcript", str(transcript)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "busy" not in (transcript.read_text() if transcript.exists() else ""):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 1, stderr
    report = last_json(stdout)
    assert report["terminal"] == "Cancelled"
    assert report["reason"]["kind"] == "user_cancel"
    records = read_transcript(transcript)
    assert records[-1]["type"] == "terminal" and records[-1]["terminal"] == "Cancelled"


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda c: c.replace("queue:", "queu:"), "queu"),
        (lambda c: c.replace("decision: allow", "decision: maybe", 1), "policy.rules.0.decision"),
        (lambda c: c.replace("paths:\n    - '**'", "commands:\n    - '**'", 1), "policy.rules.0"),
        (
            lambda c: (
                c.replace("max_iterations", "max_iterations: 0\n  ignored", 1)
                if "max_iterations" in c
                else c.replace("limits:", "limits:\n  max_iterations: 0", 1)
            ),
            "limits.max_iterations",
        ),
        (lambda c: c.replace("agent:", "agents:", 1), "agent"),
        (lambda c: c.replace("id: write-src", "id: read-all", 1), "policy"),
        (lambda c: c.replace("workspace: ", "workspace: /no/such/dir/", 1), "workspace"),
        (lambda c: c + "\n  - this: [is, broken\n", "not valid YAML"),
        (lambda c: "- just\n- a\n- list\n", "mapping at the top level"),
    ],
    ids=[
        "unknown-key",
        "bad-decision",
        "wrong-target-key",
        "bad-limit",
        "missing-agent",
        "duplicate-rule-id",
        "no-workspace",
        "yaml-syntax",
        "not-a-mapping",
    ],
)
def test_a_malformed_config_exits_2_naming_the_bad_key(scripted_scenario, harness_config, mutate, key):
    config = harness_config(scripted_scenario(scenario({"T1": [turn()]})))
    config.write_text(mutate(config.read_text()))

    done = cli("run", config, "--json")

    assert done.returncode == 2, done.stdout + done.stderr
    assert key in done.stderr
    assert last_json(done.stdout)["error"]["kind"] == "config"


def test_a_missing_config_file_exits_2(tmp_path):
    done = cli("run", tmp_path / "nope.yaml")
    assert done.returncode == 2
    assert "cannot read" in done.stderr


@LOOP_SLOW
def test_a_run_whose_kernel_was_killed_ends_failed_restarted(scripted_scenario, harness_config, tmp_path):
    import psutil

    steps = [{"spawn_child": {"seconds": 300}}, {"message": "still busy"}, {"hang": True}]
    busy = scripted_scenario(scenario({"T1": [turn(*steps)]}), name="busy.yaml")
    config = harness_config(busy, name="busy-loop.yaml", sandbox={"mode": "off"})  # what recovery cleans up
    first = tmp_path / "transcripts" / "first.jsonl"
    process = subprocess.Popen([CLI, "run", str(config), "--transcript", str(first)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "still busy" not in (first.read_text() if first.exists() else ""):
        time.sleep(0.05)
    said = [r["msg"]["params"]["update"]["content"]["text"] for r in read_transcript(first)
            if r["type"] == "rpc" and r["msg"].get("method") == "session/update"
            and r["msg"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]  # fmt: skip
    child = int(next(text for text in said if text.startswith("child pid ")).split()[-1])
    process.kill()  # SIGKILL: no teardown, no terminal line; the agent's child lives on
    process.wait()
    assert read_transcript(first)[-1]["type"] != "terminal"
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE

    quick = harness_config(scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]})),
                           commit={"message": "{id}"})  # fmt: skip
    done = cli("run", quick, "--json")

    assert done.returncode == 0, done.stderr
    last = read_transcript(first)[-1]
    assert (last["type"], last["terminal"], last["reason"]["kind"]) == ("terminal", "Failed", "restarted")
    assert last["reason"]["agent_killed"] is True
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the dead run's agent group was not killed"
        time.sleep(0.02)
    second = read_transcript(Path(last_json(done.stdout)["transcript"]))
    assert [r["transcript"] for r in second if r["type"] == "recovered"] == [str(first)]
    assert not list((tmp_path / "transcripts" / ".active").glob("*.json"))


@LOOP_SLOW
def test_a_yaml_integer_id_is_its_text_and_other_numbers_must_be_quoted(scripted_scenario, harness_config):
    """`id: 7` is what people write; `3.10` (read as 3.1) or `022` (read as 18) would be rewritten."""
    path = scripted_scenario(scenario({"7": [write_turn("src/seven.txt", "7\n", commit="7")]}))
    config = harness_config(path, tasks=[{"id": 7, "title": "Task seven"}], commit={"message": "{id}"})

    done = cli("run", config, "--json")
    assert done.returncode == 0, done.stderr
    assert [(t["id"], t["terminal"]) for t in last_json(done.stdout)["tasks"]] == [("7", "Completed")]

    for value, read_as in (("3.10", "float 3.1"), ("022", "int 18"), ("true", "bool True")):
        config.write_text(config.read_text().replace("agent:\n", f"agent:\n  env:\n    VALUE: {value}\n", 1))
        refused = cli("run", config, "--json")
        assert refused.returncode == 2
        assert f"agent.env.VALUE: Value error, YAML read this as {read_as}: quote it" in refused.stderr
        config.write_text(config.read_text().replace(f"  env:\n    VALUE: {value}\n", "", 1))


def test_the_version_is_the_installed_distributions():
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loop-harness {importlib.metadata.version('loop-harness')}"


def test_a_workspace_written_with_a_tilde_is_under_home(scripted_scenario, harness_config, tmp_path):
    config = harness_config(
        scripted_scenario(scenario({"T1": [write_turn("src/x.py", "x = 1\n")]})), commit={"message": "{id}"}
    )  # the kernel commits: nothing left behind (issue 30)
    data = yaml.safe_load(config.read_text())
    workspace = Path(data["workspace"]["path"])
    data["workspace"]["path"] = f"~/{workspace.name}"  # as a user writes it, HOME being the workspace's parent
    tilde = tmp_path / "tilde.yaml"
    tilde.write_text(yaml.safe_dump(data))

    done = subprocess.run([CLI, "run", str(tilde), "--json"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(workspace.parent)})  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    report = last_json(done.stdout)
    assert (report["terminal"], [t["terminal"] for t in report["tasks"]]) == ("Idle", ["Completed"])
