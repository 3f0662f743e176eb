"""`loop-harness soak`'s command line: what it refuses before a single task runs, and the options that shape
the checks (the soaks themselves are LoopSoak's, in tests/soak)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from soak import Bounds, SoakRunner

pytestmark = LOOP_SCRIPTED


@LOOP_SLOW
def test_a_soak_too_short_to_check_anything_is_refused_before_it_starts(tmp_path):
    with pytest.raises(ValueError, match="drain at least 70 tasks"):
        SoakRunner(tasks=20)
    with pytest.raises(ValueError, match="a warm-up of at least 1 task"):
        SoakRunner(tasks=100, bounds=Bounds(warmup=0))
    command = [sys.executable, "-m", "harness", "soak", "--report", str(tmp_path / "report")]
    for args, said in [
        (["--tasks", "20"], "20 tasks check nothing: the first 50 are the warm-up"),
        (["--tasks", "0"], "must be at least 1"),
        (["--tasks", "60", "--warmup", "10", "--window", "30"], "drain at least 70 tasks"),
        (["--tasks", "60", "--warmup", "10", "--window", "1"], "a window of 1 task has no slope"),
    ]:
        done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr
        assert "soak passed" not in done.stdout
    assert not (tmp_path / "report").exists(), "nothing ran, nothing was written"


@LOOP_SLOW
def test_the_window_is_settable_from_the_command_line():
    command = [sys.executable, "-m", "harness", "soak", "--tasks", "40", "--warmup", "10", "--window", "15", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["bounds"]["window"] == 15
    assert len(summary["figures"]["kernel_rss"]["window_slopes"]) == 2  # tasks 11-25 and 26-40


def test_a_report_without_matplotlib_is_refused_before_the_soak(tmp_path):
    # An environment without the [soak] extra: a finder that hides matplotlib, installed at start-up.
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'matplotlib':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "harness", "soak", "--tasks", "500", "--report", str(tmp_path / "report")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'loop-harness[soak]'" in done.stderr
    assert "soak passed" not in done.stdout and not (tmp_path / "report").exists()


def _agent(tmp_path, *leaks: str) -> str:
    """Any agent, to the soak: the scripted one writing the file the soak asks every agent for."""
    from harness.testing import scripted_agent_command, write_yaml
    from scripted_agents.presets import turn, write_turn

    steps = [*write_turn("out/result.txt", "result\n")["steps"], *({"leak": leak} for leak in leaks)]
    scenario = write_yaml(tmp_path / "agent.yaml", {"tasks": [{"turns": [turn(*steps)]}]})
    return " ".join(scripted_agent_command(scenario))


@LOOP_SLOW
@pytest.mark.parametrize("leak", [None, "fd"], ids=["steady", "agent-leaks-an-fd"])
def test_any_agent_command_is_soaked_with_its_counters_bounded(tmp_path, leak):
    command = [sys.executable, "-m", "harness", "soak", "--tasks", "40", "--warmup", "10", "--window", "15",
               "--json", "--agent-command", _agent(tmp_path, *([leak] if leak else []))]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if leak is None:
        assert done.returncode == 0, done.stdout + done.stderr
        assert summary["agent"] == "command" and summary["tasks_sampled"] == 40
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert summary["error"]["resource"] == "agent fds", summary["error"]
        assert "after task 20, baseline" in summary["error"]["message"]
        assert "broken bound: agent fds" in done.stderr


@LOOP_SLOW
def test_the_python_api_soaks_a_command_too(tmp_path):
    # In-process, the kernel is this pytest worker, whose peak (every module the suite loaded) is not the soak's.
    bounds = Bounds(warmup=10, window=15, kernel_peak_ceiling=float(1 << 40))
    result = SoakRunner(tasks=40, agent=_agent(tmp_path).split(), bounds=bounds).run()
    assert result.passed, result.error
    assert (result.agent, result.terminals) == ("command", {"Completed": 40})
    with pytest.raises(ValueError, match="command line is empty"):
        SoakRunner(tasks=100, agent=[])
