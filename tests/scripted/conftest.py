"""Fixtures the policy test files (test_policy*.py) share.

`worktree` is the shared worktree of policy_corpus.build_worktree, one per module, which its tests only judge
against; `careful`, `tools` and `open_policy` are the corpus's policies over it, and `own_worktree` is that worktree
built for one test. `policy` is the careful policy as issue 8's review attacked it (policy_corpus.CAREFUL_WITH_PYTEST)
over a small worktree of its own, `review_worktree`.

A module whose tests need another meaning defines the fixture itself: test_policy.py its `worktree` and `policy`,
test_policy_careful_user.py a `worktree` that is `review_worktree` (the one its `policy` judges), and
test_policy_paths.py an `own_worktree` built directly in tmp_path.
"""

from __future__ import annotations

import pytest

from harness import Policy
from harness.config._config import RuleConfig
from tests.helpers.policy_corpus import CAREFUL, CAREFUL_WITH_PYTEST, OPEN, TOOLS, build_worktree, policy_of


@pytest.fixture(name="worktree", scope="module")
def worktree_fixture(tmp_path_factory):
    """Shared by the module's tests, which only judge: none of them changes it."""
    return build_worktree(tmp_path_factory.mktemp("tables"))


@pytest.fixture(name="careful", scope="module")
def careful_fixture(worktree):
    return policy_of(worktree, CAREFUL)


@pytest.fixture(name="tools", scope="module")
def tools_fixture(worktree):
    return policy_of(worktree, TOOLS)


@pytest.fixture(name="open_policy", scope="module")
def open_policy_fixture(worktree):
    return policy_of(worktree, OPEN)


@pytest.fixture(name="own_worktree")
def own_worktree_fixture(tmp_path):
    """The tables' worktree (src/gitlink -> ../.git, src/secret/key, ...), built for this test. The long name
    above it keeps `/proc/self/root` + its path from slicing, at the worktree path's length, to an absolute
    text: a policy that sliced there would then refuse by luck, and only the name's length would tell."""
    return build_worktree(tmp_path.resolve() / "a-worktree-parent")


@pytest.fixture(name="review_worktree")
def review_worktree_fixture(tmp_path):
    root = tmp_path / "wt"
    for directory in ("src/secret", "src/ls\r", ".git/hooks", "docs"):
        (root / directory).mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "src" / "a.txt").write_text("a\n")
    (root / "src" / "secret" / "key").write_text("key\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return root


@pytest.fixture(name="policy")
def policy_fixture(review_worktree):
    return Policy([RuleConfig.model_validate(r) for r in CAREFUL_WITH_PYTEST], review_worktree)
