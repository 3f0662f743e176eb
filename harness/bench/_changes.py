"""`loop-harness bench changes`: what a budget's change measure costs at a tool-call boundary.

Two ways to know the files and lines changed since a task started, on the same worktree in one run:
`ChangeMeter.measure()` (git status and the changed paths' sizes and times; it diffs only when those
moved) against diffing the task's starting tree at every boundary. Each boundary alternates a boundary
where nothing changed with one where the agent appended a line, as a working agent does.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from ..budget._changes import ChangeMeter
from ..testing import make_workspace

__all__ = ["bench_changes"]


def bench_changes(*, files: int = 2000, boundaries: int = 400, rounds: int = 3, as_json: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-changes-") as tmp:
        tree = {f"src/pkg{i % 40}/mod{i}.py": "".join(f"line {j}\n" for j in range(30)) for i in range(files)}
        workspace = make_workspace(Path(tmp) / "ws", files=tree, ignore=["build/"])
        time.sleep(1.1)  # then git status refreshes the index: files no longer as new as it ("racy")
        workspace.git("status", "--porcelain")
        target = workspace.path / "src" / "pkg0" / "mod0.py"
        meter = ChangeMeter(workspace.path, workspace.path / ".git")
        measured: list[float] = []
        diffed: list[float] = []
        for _ in range(rounds):
            for way, times in ((meter.measure, measured), (meter.diff_now, diffed)):
                meter.start()
                start = time.perf_counter()
                for boundary in range(boundaries):
                    if boundary % 2:
                        with target.open("a") as file:
                            file.write(f"appended {boundary}\n")
                    way()
                times.append((time.perf_counter() - start) / boundaries)
                if meter.measure() != meter.diff_now():  # the two ways must agree, or the ratio means nothing
                    raise RuntimeError(f"measure {meter.measure()} != diff {meter.diff_now()}")
                workspace.git("checkout", "--", ".")
                workspace.git("status", "--porcelain")
    figures = {
        "files": files,
        "boundaries": boundaries,
        "rounds": rounds,
        "measure_ms": round(statistics.median(measured) * 1000, 3),
        "diff_every_time_ms": round(statistics.median(diffed) * 1000, 3),
        "ratio": round(statistics.median(diffed) / statistics.median(measured), 2),
    }
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"a worktree of {files} files, {boundaries} boundaries (every other one after a change), {rounds} rounds")
        print(f"ChangeMeter.measure (status first):   {figures['measure_ms']:>8} ms per boundary")
        print(f"a diff of the starting tree each time: {figures['diff_every_time_ms']:>8} ms per boundary")
        print(f"ratio diff / measure: {figures['ratio']}")
    return 0
