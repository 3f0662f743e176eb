"""`loop-harness bench boundary`: what judging a task's changes at its boundary costs, by the change's size.

A worktree of 50,000 files (a git repository, every file committed); a task that changes 1, 100 and 10,000 of
them (half edits, half new files). Two ways to judge and land it, on the same tree in one run:

    overlay   the upper layer's walk (`WorktreeOverlay.task_changes`), its judgement (`judge_overlay`) and the
              apply to the worktree: what the kernel does with the default sandbox
    git       the change set from `git status` of the whole tree (`read_change_set`) and its judgement
              (`judge_change_set`), nothing to apply (the agent wrote into the tree): `sandbox.worktree: bind`

The upper layer is written as overlayfs writes it for these changes (a changed or new file is a regular file
at its path): no mount is needed to time what the kernel reads. Figures, not asserts: read the ratios.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pygit2

from ..config._config import RuleConfig
from ..policy._change_set import HEAD_NOW, judge_change_set, judge_overlay, read_change_set
from ..policy._policy import Policy
from ..sandbox._overlay import WorktreeOverlay
from ..testing import READ_ALL, WRITE_SRC, make_workspace

__all__ = ["bench_boundary"]

RULES = [RuleConfig.model_validate(r) for r in (READ_ALL, WRITE_SRC)]


def bench_boundary(*, files: int = 50_000, sizes: tuple[int, ...] = (1, 100, 10_000), rounds: int = 3,
                   as_json: bool = False) -> int:  # fmt: skip
    figures: dict[str, object] = {"tree_files": files, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-boundary-") as tmp:
        root = Path(tmp)
        tree = {f"src/pkg{i % 200}/mod{i}.py": f"value = {i}\n" for i in range(files)}
        workspace = make_workspace(root / "ws", files=tree)
        policy = Policy(RULES, workspace.path)
        repo = pygit2.Repository(str(workspace.path / ".git"))
        for size in sizes:
            overlay_ms, git_ms = [], []
            for round_ in range(rounds):
                paths = _changed_paths(size, files)
                upper = root / f"upper-{size}-{round_}"
                for path in paths:  # what overlayfs keeps for a write: the file whole, at its path
                    (upper / path).parent.mkdir(parents=True, exist_ok=True)
                    (upper / path).write_text(f"changed {round_}\n")
                overlay = WorktreeOverlay(str(workspace.path), root / "unused")
                overlay.upper = upper
                start = time.perf_counter()
                changes = overlay.task_changes()
                judged = judge_overlay(changes, overlay, policy)
                if any(j.refused for j in judged) or len(changes) < size:
                    raise RuntimeError(f"{len(changes)} changes read, {sum(j.refused for j in judged)} refused")
                overlay.apply(changes)
                overlay_ms.append((time.perf_counter() - start) * 1000)
                # the same changes are in the tree now: the git way reads and judges them there
                start = time.perf_counter()
                listed = read_change_set(repo, start_head=HEAD_NOW, ignored_at_start=frozenset())
                refused = [j for j in judge_change_set(listed, policy, frozenset(), str(workspace.path)) if j.refused]
                git_ms.append((time.perf_counter() - start) * 1000)
                if refused or len(listed) != size:
                    raise RuntimeError(f"git listed {len(listed)} changes, {len(refused)} refused")
                workspace.git("checkout", "--quiet", "--", ".")
                workspace.git("clean", "-fdq")
                shutil.rmtree(upper)
            figures[f"overlay_ms_{size}"] = round(statistics.median(overlay_ms), 2)
            figures[f"git_ms_{size}"] = round(statistics.median(git_ms), 2)
            figures[f"ratio_git_overlay_{size}"] = round(statistics.median(git_ms) / statistics.median(overlay_ms), 2)
    if as_json:
        print(json.dumps(figures))
        return 0
    print(f"a worktree of {files} files; medians of {rounds} rounds, in ms (read + judge, and apply for the overlay)")
    print(f"{'files changed':>14} {'overlay':>10} {'git status':>11} {'git / overlay':>14}")
    for size in sizes:
        print(f"{size:>14} {figures[f'overlay_ms_{size}']:>10} {figures[f'git_ms_{size}']:>11}"
              f" {figures[f'ratio_git_overlay_{size}']:>14}")  # fmt: skip
    return 0


def _changed_paths(size: int, files: int) -> list[str]:
    """Half edits of committed files, half new files beside them."""
    edits = [f"src/pkg{i % 200}/mod{i}.py" for i in range(0, files, max(1, files // max(1, size - size // 2)))]
    edits = edits[: size - size // 2]
    return [*edits, *(f"src/pkg{i % 200}/new{i}.py" for i in range(size // 2))]
