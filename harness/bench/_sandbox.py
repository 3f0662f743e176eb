"""`loop-harness bench kernel --sandbox`: what the OS sandbox costs, as ratios measured in one run.

1. The kernel bench's queue (a session, a permission, a write and a read per task) drained with the sandbox's
   copy-on-write worktree (`overlay`, the default: each boundary reads, judges and applies the upper layer),
   with directory binds (`bind`: the change set read from git) and with the sandbox off, alternating rounds.
2. `terminal/create` → `wait_for_exit` → `release` of `true`: joining the running agent sandbox (overlay), in a
   bwrap of its own (bind), and outside.
Figures, not asserts: read the ratios.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from ..config._config import RuleConfig, SandboxConfig
from ..link._transport import agent_environment
from ..sandbox._exec import ExecHost
from ..sandbox._sandbox import Sandbox, find_bwrap, plan_sandbox, sandbox_unavailable
from ..testing import loop_config, make_workspace, write_yaml
from ._kernel import BENCH_RULES, BENCH_SCENARIO, _time_kernel

__all__ = ["bench_sandbox"]


MODES = {"overlay": {"mode": "workspace-write", "worktree": "overlay"},
         "bind": {"mode": "workspace-write", "worktree": "bind"}, "off": {"mode": "off"}}  # fmt: skip


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
                                                               transcripts=str(root / mode), sandbox=settings))
            for mode, settings in MODES.items()
        }  # fmt: skip
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(rounds):
            for mode, config in configs.items():
                times[mode].append(asyncio.run(_time_kernel(config, tasks))[0])
        terminal = {mode: asyncio.run(_terminal_ms(bwrap, root, workspace.path, mode, commands)) for mode in MODES}
    seconds = {mode: statistics.median(times[mode]) for mode in MODES}
    figures: dict[str, object] = {"tasks": tasks, "rounds": rounds}
    figures |= {f"{mode}_tasks_per_s": round(tasks / seconds[mode], 1) for mode in MODES}
    figures |= {"ratio_overlay_bind": round(seconds["bind"] / seconds["overlay"], 3),
                "ratio_on_off": round(seconds["off"] / seconds["overlay"], 3)}  # fmt: skip
    figures |= {f"terminal_ms_{mode}": round(terminal[mode], 2) for mode in MODES}
    figures["terminal_ratio_enter_bwrap"] = round(terminal["bind"] / terminal["overlay"], 3)
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"tasks per side and round: {tasks}, rounds: {rounds} (medians below)")
        for mode in MODES:
            print(f"kernel, sandbox {mode + ':':<9} {figures[f'{mode}_tasks_per_s']:>8} tasks/s")
        print(f"ratio overlay / bind:  {figures['ratio_overlay_bind']}   (the copy-on-write worktree's boundary)")
        print(f"ratio overlay / off:   {figures['ratio_on_off']}")
        print(
            f"terminal/create..release of `true` (median of {commands}): joining the agent's sandbox"
            f" {figures['terminal_ms_overlay']} ms, a bwrap of its own {figures['terminal_ms_bind']} ms, outside"
            f" {figures['terminal_ms_off']} ms; ratio bwrap / joining {figures['terminal_ratio_enter_bwrap']}"
        )
    return 0


async def _terminal_ms(bwrap: str, root: Path, worktree: Path, mode: str, commands: int) -> float:
    """The median time of `true` through the kernel's terminal calls: outside (off), in a bwrap of its own
    (bind), or joining a running agent sandbox (overlay: one is started for it, as the agent would be)."""
    if mode == "off":
        return await _time_terminals(None, str(worktree), commands)
    run_dir = root / f"run-{mode}"
    run_dir.mkdir()
    sandbox = plan_sandbox(SandboxConfig.model_validate(MODES[mode]), bwrap=bwrap, worktree=worktree,
                           rules=[RuleConfig.model_validate(r) for r in BENCH_RULES], protected_globs=(".git",),
                           protected_files=[], git_dirs=[], run_dir=run_dir, agent_env={})  # fmt: skip
    if sandbox.overlay is None:
        return await _time_terminals(sandbox, str(worktree), commands)
    argv, env, fds = sandbox.wrap(["sleep", "600"], cwd=str(worktree), env=agent_environment(), tools=True)
    try:
        agent = await asyncio.create_subprocess_exec(*argv, env=env, pass_fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    try:
        await sandbox.overlay.attach()
        return await _time_terminals(sandbox, str(worktree), commands)
    finally:
        agent.kill()
        await agent.wait()
        sandbox.overlay.close()


async def _time_terminals(sandbox: Sandbox | None, cwd: str, commands: int) -> float:
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
