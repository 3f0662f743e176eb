"""The pytest plugin (entry point `pytest11`): markers and fixtures for loop tests.

Markers, registered with strict markers in mind:
    loop-scripted   fast, deterministic: the kernel against the scripted agent
    LoopInference   the kernel against the real local model (CPU llama.cpp)
    LoopSoak        hundreds of tasks with bounded resources (slow): deselected unless `-m` selects it

Test modules mark themselves with `pytestmark = LOOP_SCRIPTED` (the hyphen
keeps `pytest.mark.loop-scripted` from being valid Python). Fixtures are
thin wrappers over `harness.testing`, which works without pytest too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import testing
from ._results import RunResult

__all__ = ["LOOP_INFERENCE", "LOOP_SCRIPTED", "LOOP_SOAK", "MARKERS"]

MARKERS = {
    "loop-scripted": "fast loop tests against the scripted ACP agent (every loop branch)",
    "LoopInference": "the kernel against the real local model on the CPU (pinned GGUF)",
    "LoopSoak": "hundreds of tasks asserting bounded memory, handles, threads and transcript size",
}
LOOP_SCRIPTED = getattr(pytest.mark, "loop-scripted")
LOOP_INFERENCE = pytest.mark.LoopInference
LOOP_SOAK = pytest.mark.LoopSoak


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LoopSoak runs only when a -m expression names it: a plain `pytest`, or `-m "not LoopInference"`,
    leaves the minutes-long soaks out; `-m LoopSoak` (or any expression naming it) decides for itself."""
    if "LoopSoak" in (config.option.markexpr or ""):
        return
    soak = [item for item in items if item.get_closest_marker("LoopSoak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("LoopSoak") is None]


@pytest.fixture(name="harness_model", scope="session")
def harness_model_fixture() -> Path:
    """The default pinned model, resolved and verified once per session (xdist-safe: a file lock).

    A model that cannot be resolved fails the test with the resolver's message: it is never a skip.
    """
    from .models import ModelHashMismatch, ModelUnavailable, resolve_model

    try:
        return resolve_model()
    except (ModelUnavailable, ModelHashMismatch) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(name="harness_workspace")
def harness_workspace_fixture(tmp_path: Path) -> testing.Workspace:
    """A git worktree on `main`, pushed to a bare `origin` with its upstream set."""
    return testing.make_workspace(tmp_path / "ws")


@pytest.fixture(name="scripted_scenario")
def scripted_scenario_fixture(tmp_path: Path) -> Callable[..., Path]:
    """Write a scenario (a dict) for the scripted agent; returns its path."""

    def write(data: dict[str, Any], name: str = "scenario.yaml") -> Path:
        return testing.write_yaml(tmp_path / name, data)

    return write


@pytest.fixture(name="scripted_agent")
def scripted_agent_fixture(scripted_scenario: Callable[..., Path]) -> Callable[..., list[str]]:
    """The command line of a scripted agent playing a scenario (a dict), for any ACP client."""

    def command(data: dict[str, Any], name: str = "agent-scenario.yaml") -> list[str]:
        return testing.scripted_agent_command(scripted_scenario(data, name))

    return command


@pytest.fixture(name="harness_config")
def harness_config_fixture(tmp_path: Path, harness_workspace: testing.Workspace) -> Callable[..., Path]:
    """Write a run config for the scripted agent on `scenario`; keywords as `testing.loop_config`."""

    def write(scenario: Path, name: str = "loop.yaml", **options: Any) -> Path:
        options.setdefault("transcripts", str(tmp_path / "transcripts"))
        return testing.write_yaml(tmp_path / name, testing.loop_config(harness_workspace, scenario, **options))

    return write


@pytest.fixture(name="run_loop")
def run_loop_fixture() -> Callable[..., RunResult]:
    """Run a config through the kernel; every run's transcript is checked complete and valid."""

    def run(config: Path, **options: Any) -> RunResult:
        result = testing.run_loop(config, **options)
        testing.assert_transcript_complete(result)
        return result

    return run
