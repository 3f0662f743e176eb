"""The recorded verdicts: each row of tests/helpers/policy_verdicts.jsonl judged again.

The rows are requests at the edges of what each program's record reads, most found by hunting surviving mutants
(tools/hunt_mutants.py), each with its verdict and, for a refusal, the reason a user reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import POLICIES, expect, judge, load_rows, policy_of

pytestmark = LOOP_SCRIPTED

_ROWS = load_rows(Path(__file__).parents[1] / "helpers" / "policy_verdicts.jsonl")


@pytest.fixture(name="policies", scope="module")
def policies_fixture(worktree):
    return {name: policy_of(worktree, rules) for name, rules in POLICIES.items()}


@pytest.mark.parametrize("row", _ROWS, ids=[f"{r['policy']}-{r['how']}-{i}" for i, r in enumerate(_ROWS, 1)])
def test_each_recorded_request_gets_its_verdict(policies, worktree, row):
    """policy_verdicts.jsonl: requests at the edges of what each program's table reads (most found by hunting
    mutants), each with the verdict and, for a refusal, the reason a user reads. A row with `policy_rules` is
    judged by a policy of those rules alone."""
    if "policy_rules" in row:
        policies = {**policies, row["policy"]: policy_of(worktree, row["policy_rules"])}
    verdict = expect(judge(policies, row["policy"], row["how"], row["request"])(), row["outcome"])
    if "why" in row:
        assert verdict.reason["why"] == row["why"]
    if "rules" in row:
        assert list(verdict.rule_ids) == row["rules"]
