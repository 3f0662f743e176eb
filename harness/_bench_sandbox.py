"""`loop-harness bench kernel --sandbox`: what the OS sandbox costs, as ratios measured in one run.

1. The kernel bench's queue (a session, a permission, a write and a read per task) drained with the sandbox
   on and off, alternating rounds: the agent starts once per run inside it, so the ratio is mostly the
   sandbox's start-up spread over the queue.
2. `terminal/create` → `wait_for_exit` → `release` of `true`, inside the sandbox and outside: every command
   the kernel runs for the agent starts its own bwrap.
Figures, not asserts: read the ratios.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from ._bench import BENCH_RULES, BENCH_SCENARIO, _time_kernel
from ._config import RuleConfig, SandboxConfig
from ._exec import ExecHost
from ._sandbox import Sandbox, find_bwrap, plan_sandbox, sandbox_unavailable
from ._transport import agent_environment
from .testing import loop_config, make_workspace, write_yaml

__all__ = ["bench_sandbox"]


def bench_sandbox(*, tasks: int = 300, rounds: int = 3, commands: int = 50, as_json: bool = False) -> int:
    bwrap = find_bwrap(None)
    cause = sandbox_unavailable(bwrap)
    if cause is not None or bwrap is None:
        print(f"no sandbox here: {cause}")
        return 1
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-") as tmp:
        root = Path(tmp)
        workspace = make_workspace(root / "ws", ignore=["out/"])
        scenario = write_yaml(root / "scenario.yaml", BENCH_SCENARIO)
        queue = [{"id": f"T{i}", "title": f"bench task {i}"} for i in range(tasks)]
        configs = {
            mode: write_yaml(root / f"{mode}.yaml", loop_config(workspace, scenario, tasks=queue, rules=BENCH_RULES,
                                                               transcripts=str(root / mode), sandbox={"mode": mode}))
            for mode in ("workspace-write", "off")
        }  # fmt: skip
        times: dict[str, list[float]] = {"workspace-write": [], "off": []}
        for _ in range(rounds):
            for mode, config in configs.items():
                times[mode].append(asyncio.run(_time_kernel(config, tasks))[0])
        (root / "run").mkdir()
        sandbox = plan_sandbox(SandboxConfig(), bwrap=bwrap, worktree=workspace.path,
                               rules=[RuleConfig.model_validate(r) for r in BENCH_RULES], protected_globs=(".git",),
                               protected_files=[], git_dirs=[], run_dir=root / "run", agent_env={})  # fmt: skip
        inside = asyncio.run(_terminal_ms(sandbox, str(workspace.path), commands))
        outside = asyncio.run(_terminal_ms(None, str(workspace.path), commands))
    on, off = statistics.median(times["workspace-write"]), statistics.median(times["off"])
    figures = {
        "tasks": tasks,
        "rounds": rounds,
        "sandbox_on_tasks_per_s": round(tasks / on, 1),
        "sandbox_off_tasks_per_s": round(tasks / off, 1),
        "ratio_on_off": round(off / on, 3),
        "terminal_ms_inside": round(inside, 2),
        "terminal_ms_outside": round(outside, 2),
        "terminal_ratio_outside_inside": round(outside / inside, 3),
    }
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"tasks per side and round: {tasks}, rounds: {rounds} (medians below)")
        print(f"kernel, sandbox on (workspace-write): {figures['sandbox_on_tasks_per_s']:>8} tasks/s")
        print(f"kernel, sandbox off:                  {figures['sandbox_off_tasks_per_s']:>8} tasks/s")
        print(f"ratio on / off:        {figures['ratio_on_off']}")
        print(f"terminal/create..release of `true` (median of {commands}): inside {figures['terminal_ms_inside']} ms,"
              f" outside {figures['terminal_ms_outside']} ms, ratio outside / inside "
              f"{figures['terminal_ratio_outside_inside']}")  # fmt: skip
    return 0


async def _terminal_ms(sandbox: Sandbox | None, cwd: str, commands: int) -> float:
    host = ExecHost(agent_environment(), sandbox=sandbox)
    times = []
    for _ in range(commands):
        start = time.perf_counter()
        terminal = await host.create("bench", ["true"], cwd=cwd)
        status = await host.wait_for_exit(terminal)
        await host.release(terminal)
        times.append((time.perf_counter() - start) * 1000)
        if status.get("exitCode") != 0:
            raise RuntimeError(f"`true` exited {status} {'inside' if sandbox else 'outside'} the sandbox")
    return statistics.median(times)
