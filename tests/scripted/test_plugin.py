"""The pytest plugin's categories: what a plain run, and a -m expression, select."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED

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
    pytester.makepyfile(test_categories=CATEGORIES)
    result = pytester.runpytest("--collect-only", "-q", *args)  # the plugin loads by its entry point
    collected = [line.split("::")[-1] for line in result.outlines if "::" in line]
    assert collected == selected
