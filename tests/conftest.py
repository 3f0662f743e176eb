"""Shared test wiring: the harness's pytest plugin is loaded through its entry point.

`--judging-only` keeps the tests that judge requests in-process (no agent, no kernel run): the
fast set `make mutation` runs against each mutant of the policy and the shell parser."""

from __future__ import annotations

import pytest

#: Fixtures that start a workspace, an agent or the kernel: the tests that use one are not judging-only.
_RUNS_THE_KERNEL = frozenset({"run_loop", "harness_workspace", "scripted_scenario", "scripted_agent", "harness_config"})


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
