"""The pytest plugin's categories: what a plain run, and a -m expression, select."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW

pytestmark = LOOP_SCRIPTED
pytest_plugins = ["pytester"]

CATEGORIES = """
import pytest

@pytest.mark.LoopSoak
def test_soak(): pass

@pytest.mark.LoopInference
def test_inference(): pass

@pytest.mark.__getattr__("loop-scripted")
def test_scripted(): pass
"""


@pytest.mark.parametrize(
    ("args", "selected"),
    [
        ((), ["test_inference", "test_scripted"]),
        (("-m", "not LoopInference"), ["test_scripted"]),
        (("-m", "LoopSoak"), ["test_soak"]),
        (("-m", "LoopSoak or LoopInference"), ["test_soak", "test_inference"]),
        (("-m", "not LoopSoak"), ["test_inference", "test_scripted"]),
    ],
    ids=["plain", "not-inference", "soak", "soak-or-inference", "not-soak"],
)
def test_soak_runs_only_when_an_expression_names_it(pytester, args, selected):
    collected = selected_by(pytester, CATEGORIES, *args)
    assert collected == selected


def selected_by(pytester, source: str, *args: str) -> list[str]:
    """The tests of `source` a run with `args` collects (the plugin loads by its entry point)."""
    pytester.makepyfile(test_categories=source)
    result = pytester.runpytest("--collect-only", "-q", *args)
    return [line.split("::")[-1] for line in result.outlines if "::" in line]


SCRIPTED_TIERS = """
import pytest

pytestmark = pytest.mark.__getattr__("loop-scripted")

def test_fast(): pass

@pytest.mark.__getattr__("loop-slow")
def test_slow(): pass
"""


@pytest.mark.parametrize(
    ("args", "selected"),
    [
        ((), ["test_fast", "test_slow"]),
        (("-m", "loop-scripted"), ["test_fast"]),
        (("-m", "loop-slow"), ["test_slow"]),
        (("-m", "loop-scripted or loop-slow"), ["test_fast", "test_slow"]),
        (("-m", "not LoopInference"), ["test_fast", "test_slow"]),
    ],
    ids=["plain", "scripted", "slow", "both", "not-inference"],
)
def test_the_fast_tier_leaves_the_slow_scripted_cases_to_a_plain_run(pytester, args, selected):
    assert selected_by(pytester, SCRIPTED_TIERS, *args) == selected


MY_AGENT_TESTS = """
import pytest
from harness import Terminal

pytestmark = pytest.mark.LoopAgent


@pytest.mark.loop_workspace(files={"src/app.py": "print('hi')\\n"}, ignore=["out/"])
def test_my_agent(harness_config, harness_workspace, run_loop):
    assert (harness_workspace.path / "src" / "app.py").read_text() == "print('hi')\\n"
    assert (harness_workspace.path / ".gitignore").read_text() == "out/\\n"
    # the kernel commits what the task did (issue 30: a run never ends Idle with work left behind)
    result = run_loop(harness_config(tasks=[{"id": "T1", "title": "Write a greeting"}], commit={"message": "{id}"}))
    assert result.terminal is Terminal.IDLE, result.reason
    assert (harness_workspace.path / "src" / "hello.txt").read_text() == "hello\\n"
"""


def _agent_scenario(pytester) -> str:
    """A scripted agent that writes src/hello.txt (after asking) and commits it: any agent, to the fixtures."""
    from harness import testing
    from scripted_agents.presets import scenario, write_turn

    path = testing.write_yaml(pytester.path / "agent.yaml", scenario({"T1": [write_turn("src/hello.txt", "hello\n",
                                                                                          commit="T1")]}))  # fmt: skip
    return " ".join(testing.scripted_agent_command(path))


@LOOP_SLOW
@pytest.mark.parametrize("where", ["option", "ini"])
def test_the_fixtures_run_the_agent_that_loop_agent_names(pytester, where):
    pytester.makepyfile(test_mine=MY_AGENT_TESTS)
    command = _agent_scenario(pytester)
    if where == "ini":
        pytester.makeini(f"[pytest]\nloop_agent = {command}\n")
        result = pytester.runpytest_subprocess("-m", "LoopAgent", "-p", "no:cacheprovider")
    else:
        result = pytester.runpytest_subprocess("-m", "LoopAgent", "--loop-agent", command, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@LOOP_SLOW
def test_a_test_of_your_agent_fails_when_no_agent_is_named(pytester):
    pytester.makepyfile(test_mine=MY_AGENT_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)  # never a skip or a pass
    result.stdout.fnmatch_lines(["*no agent to test: pass --loop-agent*"])


@LOOP_SLOW
def test_loop_workspace_refuses_what_it_does_not_know(pytester):
    pytester.makepyfile(
        test_bad="""
import pytest

@pytest.mark.loop_workspace(file={"a": "b"})
def test_it(harness_workspace): pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*loop_workspace takes files= and ignore= only*"])


def test_loading_the_plugin_does_not_import_the_kernel(pytester):
    """An unrelated test in a project that installs loop-harness does not pay for the ACP SDK's import."""
    pytester.makepyfile(
        test_plain="""
import sys

def test_plain():
    assert "harness.pytest_plugin" in sys.modules
    assert "acp" not in sys.modules and "harness.kernel._kernel" not in sys.modules, sorted(sys.modules)
"""
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_ini_key_takes_the_command_as_a_shell_line(pytester):
    """`loop_agent = python -m my_agent --flag "two words"` is split as a shell would."""
    pytester.makeini('[pytest]\nloop_agent = python -m my_agent --flag "two words"\n')
    pytester.makepyfile(
        test_ini="""
def test_it(loop_agent_command):
    assert loop_agent_command == ["python", "-m", "my_agent", "--flag", "two words"]
"""
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_an_agent_given_as_one_string_is_refused(tmp_path):
    from harness import testing

    with pytest.raises(TypeError, match="as a list"):
        testing.loop_config(tmp_path, agent="python -m my_agent")


def test_harness_model_fails_cleanly_on_a_lock_it_cannot_use(pytester, monkeypatch):
    """A broken models.lock is the test's failure with the lock's message, not a LockError traceback."""
    lock = pytester.path / "broken.lock"
    lock.write_text("default = [not toml")
    monkeypatch.setenv("LOOP_HARNESS_MODELS_LOCK", str(lock))
    pytester.makepyfile(test_model="def test_it(harness_model): pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*cannot read {lock}*"])
    assert "LockError" not in result.stdout.str() and "Traceback" not in result.stdout.str()


def test_the_wheel_ships_the_lock_the_repository_pins():
    """models.lock is package data (a link to the root file here), so an installed copy finds one."""
    from pathlib import Path

    from harness.models import _lock as lock_module
    from harness.models import find_lock_file

    shipped = Path(lock_module.__file__).with_name("models.lock")
    assert shipped.read_bytes() == (Path(__file__).parents[2] / "models.lock").read_bytes()
    assert find_lock_file().read_bytes() == shipped.read_bytes()
