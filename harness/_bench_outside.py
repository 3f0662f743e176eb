"""`loop-harness bench kernel --outside`: the kernel's overhead over a bare SDK client, timed from outside.

Issue 15's measurement. Both sides are whole processes started by this one and timed from spawn to exit:

- the kernel: `python -m harness run CONFIG --json`, the real command line with everything on (policy,
  preconditions at every boundary, the transcript, the sandbox, the progress lines on stderr), draining a
  memory queue;
- the bare client: `python -m harness._bench_outside_sdk client`, the same protocol work on the ACP SDK alone
  (session/new, prompt, the permission allowed, the read served, session/close) and nothing else.

Both drive the same foreign agent, written on the official SDK only (`harness._bench_outside_sdk`): per task
one tool call, one permission request and one `fs/read_text_file`. Each side runs `warm` tasks and `tasks`
tasks; the steady-state rate (tasks - warm) / (t(tasks) - t(warm)) cancels start-up (interpreter, imports,
config, agent spawn). Sides alternate run by run; each side's best (shortest) t(warm) and t(tasks) over the
rounds give its rate (per-round rates are printed too). Figures, not asserts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._bench_outside_sdk import AGENT_MODULE
from .testing import OUT_RULES, loop_config, make_workspace, write_yaml

__all__ = ["bench_outside"]

KERNEL, BARE = "kernel", "bare"


def bench_outside(
    *, tasks: int = 400, warm: int = 20, rounds: int = 2, as_json: bool = False, workdir: Path | None = None
) -> int:
    """Time both sides at `warm` and at `tasks` tasks, alternating, `rounds` times; report the best rates.
    `workdir` keeps the workspace and the kernel's transcripts there (default: a temporary directory)."""
    if tasks <= warm:
        print(f"--tasks must exceed the {warm} warm-up tasks", file=sys.stderr)
        return 2
    if workdir is not None:
        return _bench(workdir, tasks=tasks, warm=warm, rounds=rounds, as_json=as_json)
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-outside-") as tmp:
        return _bench(Path(tmp), tasks=tasks, warm=warm, rounds=rounds, as_json=as_json)


def _bench(root: Path, *, tasks: int, warm: int, rounds: int, as_json: bool) -> int:
    root = root.resolve()
    workspace = make_workspace(root / "ws", ignore=["out/"])
    agent = [sys.executable, "-m", AGENT_MODULE, "agent"]
    configs = {
        n: write_yaml(
            root / f"loop-{n}.yaml",
            loop_config(
                workspace,
                agent=agent,
                tasks=[{"id": f"T{i}", "title": f"bench task {i}"} for i in range(n)],
                rules=OUT_RULES,
                transcripts=str(root / "runs"),
            ),
        )
        for n in (warm, tasks)
    }
    runs: list[dict[str, Any]] = []
    transcript: dict[str, Any] = {}
    for r in range(rounds):
        order = (KERNEL, BARE) if r % 2 == 0 else (BARE, KERNEL)
        times: dict[str, dict[int, float]] = {KERNEL: {}, BARE: {}}
        for n in (warm, tasks):
            for side in order:
                if side == KERNEL:
                    times[side][n], transcript = _run_kernel(configs[n], n, root / "kernel-stderr.txt")
                else:
                    times[side][n] = _run_bare(workspace.path, n)
        for side in (KERNEL, BARE):
            t_warm, t_all = times[side][warm], times[side][tasks]
            rate = (tasks - warm) / (t_all - t_warm) if t_all > t_warm else None
            runs.append({"round": r + 1, "side": side, "t_warm_s": round(t_warm, 3), "t_all_s": round(t_all, 3),
                         "tasks_per_s": None if rate is None else round(rate, 1)})  # fmt: skip
    best = {side: _best(runs, side, tasks - warm) for side in (KERNEL, BARE)}
    kernel, bare = best[KERNEL], best[BARE]
    figures: dict[str, Any] = {
        "tasks": tasks,
        "warm": warm,
        "rounds": rounds,
        "runs": runs,
        "kernel_tasks_per_s": kernel,
        "bare_sdk_tasks_per_s": bare,
        "ratio": round(kernel / bare, 3) if kernel and bare else None,
        "kernel_ms_per_task": round(1000 / kernel, 3) if kernel else None,
        "bare_sdk_ms_per_task": round(1000 / bare, 3) if bare else None,
        "kernel_adds_ms_per_task": round(1000 / kernel - 1000 / bare, 3) if kernel and bare else None,
        "transcript_records_per_task": round(transcript["records"] / tasks, 1),
        "transcript_bytes_per_task": transcript["bytes"] // tasks,
        "transcript": transcript["path"],
    }
    if as_json:
        print(json.dumps(figures))
        return 0
    print(f"steady state: (N - {warm}) / (t(N) - t({warm})), N = {tasks}, whole processes timed from outside;"
          f" best t of {rounds} each, sides alternating")  # fmt: skip
    for run in runs:
        shown = "n/a (t(N) <= t(warm))" if run["tasks_per_s"] is None else f"{run['tasks_per_s']:>7} tasks/s"
        print(f"  round {run['round']} {run['side']:<6} t({warm}) {run['t_warm_s']:>7.3f} s"
              f"  t({tasks}) {run['t_all_s']:>7.3f} s  {shown}")  # fmt: skip
    print(f"kernel (`python -m harness run`, everything on): {_shown(kernel)} tasks/s")
    print(f"bare SDK client (protocol work only):            {_shown(bare)} tasks/s")
    print(f"ratio kernel / bare:   {_shown(figures['ratio'])}")
    if figures["kernel_adds_ms_per_task"] is not None:
        print(f"per task: kernel {figures['kernel_ms_per_task']} ms, bare {figures['bare_sdk_ms_per_task']} ms,"
              f" the kernel adds {figures['kernel_adds_ms_per_task']} ms")  # fmt: skip
    print(f"transcript: {figures['transcript_records_per_task']} records, "
          f"{figures['transcript_bytes_per_task']} bytes per task (complete, checked after every run)")  # fmt: skip
    return 0


def _best(runs: list[dict[str, Any]], side: str, steady: int) -> float | None:
    """The steady-state rate from the side's best (shortest) t(warm) and best t(N): a start-up slowed by a
    neighbour in one round and not in the other would otherwise swing a rate, not just slow it."""
    mine = [r for r in runs if r["side"] == side]
    t_warm, t_all = min(r["t_warm_s"] for r in mine), min(r["t_all_s"] for r in mine)
    return round(steady / (t_all - t_warm), 1) if t_all > t_warm else None


def _shown(value: float | None) -> str:
    return "n/a" if value is None else str(value)


def _run_kernel(config: Path, tasks: int, stderr_path: Path) -> tuple[float, dict[str, Any]]:
    """`python -m harness run CONFIG --json` from spawn to exit (progress lines on, to a file); then its
    result and its transcript are checked (outside the timing)."""
    with stderr_path.open("wb") as stderr:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "harness", "run", str(config), "--json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            check=False,
        )
        elapsed = time.perf_counter() - start
    try:
        result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {}
    completed = [t for t in result.get("tasks", ()) if t.get("terminal") == "Completed" and t.get("iterations")]
    if done.returncode != 0 or result.get("terminal") != "Idle" or len(completed) != tasks:
        tail = stderr_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the kernel side did not drain {tasks} tasks (exit {done.returncode}): {result}\n{tail}")
    return elapsed, _check_transcript(Path(result["transcript"]), tasks)


def _check_transcript(path: Path, tasks: int) -> dict[str, Any]:
    """Every line JSON, numbered without gaps, from `run_start` to an `Idle` terminal, a `task_end` per task."""
    data = path.read_bytes()
    records = [json.loads(line) for line in data.splitlines()]
    problems = []
    if not records or records[0].get("type") != "run_start":
        problems.append("it does not begin with run_start")
    if not records or records[-1].get("type") != "terminal" or records[-1].get("terminal") != "Idle":
        problems.append("it does not end with an Idle terminal")
    if [r.get("seq") for r in records] != list(range(1, len(records) + 1)):
        problems.append("records are missing or out of order")
    ends = sum(1 for r in records if r.get("type") == "task_end")
    if ends != tasks:
        problems.append(f"{ends} task_end records for {tasks} tasks")
    if problems:
        raise RuntimeError(f"the kernel's transcript {path} is not complete: {'; '.join(problems)}")
    return {"path": str(path), "records": len(records), "bytes": len(data)}


def _run_bare(workspace: Path, tasks: int) -> float:
    """The bare SDK client from spawn to exit."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", AGENT_MODULE, "client", str(workspace), str(tasks)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or done.stdout.decode().split() != ["completed", str(tasks)]:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"the bare side did not drain {tasks} tasks (exit {done.returncode}): {tail}")
    return elapsed
