"""Shared test wiring: the harness's pytest plugin is loaded through its entry point.

`--judging-only` keeps the tests that judge requests in-process (no agent, no kernel run): the
fast set `make mutation` runs against each mutant of the policy and the shell parser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import testing

#: Fixtures that start a workspace, an agent or the kernel: the tests that use one are not judging-only.
_RUNS_THE_KERNEL = frozenset({"run_loop", "harness_workspace", "make_harness_workspace", "scripted_scenario",
                              "scripted_agent", "harness_config", "loop_agent_command"})  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--judging-only",
        action="store_true",
        help="only the tests that judge requests in-process: no agent, no kernel run (mutation testing)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--judging-only"):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if _RUNS_THE_KERNEL & set(getattr(item, "fixturenames", ())) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _every_transcript_validates(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, every transcript it left under its tmp_path validates against the shipped schema
    (the kernel's, the CLI's, the soak's, and the ones recovery ended), whichever way it was written."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if not isinstance(tmp_path, Path):
        return
    for path in tmp_path.rglob("*.jsonl"):
        if _starts_a_run(path):
            testing.assert_transcript_valid(path)


def _starts_a_run(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("type") == "run_start" and "kernel_version" in first
