"""`loop-harness bench kernel --outside`: the kernel's overhead over a bare SDK client, timed from outside.

Issue 15's measurement. Both sides are whole processes started by this one:

- the kernel: `python -m harness run CONFIG --json`, the real command line with everything on (policy,
  preconditions at every boundary, the transcript, the sandbox, the progress lines on stderr), draining a
  memory queue;
- the bare client: `python -m harness.bench._outside_sdk client`, the same protocol work on the ACP SDK alone
  (session/new, prompt, the permission allowed, the read served, session/close) and nothing else.

Both drive the same foreign agent, written on the official SDK only (`harness.bench._outside_sdk`): per task
one tool call, one permission request and one `fs/read_text_file`. The steady-state rate is
(N - warm) / (t(N) - t(warm)), where t(k) is when this process *reads* the side's line saying its k-th task
ended (the kernel's progress line on stderr, the bare client's on stdout): start-up (interpreter, imports,
config, agent spawn) cancels out inside one run, with none of the noise two separate runs' start-ups add.
Sides alternate, `rounds` runs each. The ratio is the issue's: each side's best rate, interleaved runs (on a
shared machine a neighbour only ever slows a run down, so a side's best run is the nearest to a quiet
machine's); the median of the rounds' own ratios (each round's two runs back to back) is shown beside it.
Figures, not asserts.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..testing import OUT_RULES, loop_config, make_workspace, write_yaml
from ._outside_sdk import AGENT_MODULE

__all__ = ["bench_outside"]

KERNEL, BARE = "kernel", "bare"
DONE = "  ✓ ".encode()  # how the kernel's progress line for a completed task starts


def bench_outside(
    *, tasks: int = 400, warm: int = 20, rounds: int = 3, as_json: bool = False, workdir: Path | None = None
) -> int:
    """Drain `tasks` tasks on each side, alternating, `rounds` times; report the steady-state rates and ratio.
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
    config = write_yaml(root / "loop.yaml", loop_config(
        workspace, agent=agent, tasks=[{"id": f"T{i}", "title": f"bench task {i}"} for i in range(1, tasks + 1)],
        rules=OUT_RULES, transcripts=str(root / "runs")))  # fmt: skip
    runs: list[dict[str, Any]] = []
    transcript: dict[str, Any] = {}
    for r in range(rounds):
        for side in (KERNEL, BARE) if r % 2 == 0 else (BARE, KERNEL):
            if side == KERNEL:
                marks, transcript = _run_kernel(config, tasks)
            else:
                marks = _run_bare(workspace.path, tasks)
            rate = (tasks - warm) / (marks[-1] - marks[warm - 1])
            runs.append({"round": r + 1, "side": side, "t_warm_s": round(marks[warm - 1], 3),
                         "t_all_s": round(marks[-1], 3), "tasks_per_s": round(rate, 1)})  # fmt: skip
    best = {side: max(r["tasks_per_s"] for r in runs if r["side"] == side) for side in (KERNEL, BARE)}
    ratios = [_rate(runs, r, KERNEL) / _rate(runs, r, BARE) for r in range(1, rounds + 1)]
    kernel, bare = best[KERNEL], best[BARE]
    figures: dict[str, Any] = {
        "tasks": tasks,
        "warm": warm,
        "rounds": rounds,
        "runs": runs,
        "kernel_tasks_per_s": kernel,
        "bare_sdk_tasks_per_s": bare,
        "ratio": round(kernel / bare, 3),
        "median_round_ratio": round(statistics.median(ratios), 3),
        "ratios": [round(x, 3) for x in ratios],
        "kernel_ms_per_task": round(1000 / kernel, 3),
        "bare_sdk_ms_per_task": round(1000 / bare, 3),
        "kernel_adds_ms_per_task": round(1000 / kernel - 1000 / bare, 3),
        "transcript_records_per_task": round(transcript["records"] / tasks, 1),
        "transcript_bytes_per_task": transcript["bytes"] // tasks,
        "transcript": transcript["path"],
    }
    if as_json:
        print(json.dumps(figures))
        return 0
    print(f"steady state: (N - {warm}) / (t(N) - t({warm})), N = {tasks}; t(k): when this process read the side's"
          f" line for its k-th task; {rounds} rounds, sides alternating")  # fmt: skip
    for run in runs:
        print(f"  round {run['round']} {run['side']:<6} t({warm}) {run['t_warm_s']:>7.3f} s"
              f"  t({tasks}) {run['t_all_s']:>7.3f} s  {run['tasks_per_s']:>7} tasks/s")  # fmt: skip
    print(f"kernel (`python -m harness run`, everything on): {kernel} tasks/s (best of {rounds})")
    print(f"bare SDK client (protocol work only):            {bare} tasks/s (best of {rounds})")
    print(f"ratio kernel / bare:   {figures['ratio']} (best against best; the rounds' own ratios "
          f"{', '.join(map(str, figures['ratios']))}, median {figures['median_round_ratio']})")  # fmt: skip
    print(f"per task: kernel {figures['kernel_ms_per_task']} ms, bare {figures['bare_sdk_ms_per_task']} ms,"
          f" the kernel adds {figures['kernel_adds_ms_per_task']} ms")  # fmt: skip
    print(f"transcript: {figures['transcript_records_per_task']} records, "
          f"{figures['transcript_bytes_per_task']} bytes per task (complete, checked after every run)")  # fmt: skip
    return 0


def _rate(runs: list[dict[str, Any]], round_: int, side: str) -> float:
    return float(next(r["tasks_per_s"] for r in runs if r["round"] == round_ and r["side"] == side))


def _marks(process: subprocess.Popen[bytes], stream: IO[bytes], is_mark: Callable[[bytes], bool]) -> list[float]:
    """When each task-ended line was read, in seconds from the spawn; the rest of the output is kept."""
    start, marks = time.perf_counter(), []
    for line in stream:
        if is_mark(line):
            marks.append(time.perf_counter() - start)
    process.wait()
    return marks


def _run_kernel(config: Path, tasks: int) -> tuple[list[float], dict[str, Any]]:
    """`python -m harness run CONFIG --json`, its progress lines (`  ✓ T7 Completed ...`) read as they come;
    then its result and its transcript are checked (outside the timing)."""
    with tempfile.TemporaryFile() as stdout:  # the result line is long: a pipe nobody reads would block the run
        process = subprocess.Popen([sys.executable, "-m", "harness", "run", str(config), "--json"],
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE)  # fmt: skip
        assert process.stderr is not None
        tail: list[bytes] = []  # the other lines: the error report, should it fail

        def is_mark(line: bytes) -> bool:
            if line.startswith(DONE):
                return True
            tail.append(line)
            return False

        marks = _marks(process, process.stderr, is_mark)
        process.stderr.close()
        stdout.seek(0)
        out = stdout.read()
    try:
        result = json.loads(out.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        result = {}
    completed = [t for t in result.get("tasks", ()) if t.get("terminal") == "Completed" and t.get("iterations")]
    if process.returncode != 0 or result.get("terminal") != "Idle" or len(completed) != tasks or len(marks) != tasks:
        raise RuntimeError(f"the kernel side did not drain {tasks} tasks (exit {process.returncode}, {len(marks)} "
                           f"lines): {result}\n{b''.join(tail[-20:]).decode(errors='replace')}")  # fmt: skip
    return marks, _check_transcript(Path(result["transcript"]), tasks)


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


def _run_bare(workspace: Path, tasks: int) -> list[float]:
    """The bare SDK client, its `done K` lines read as they come."""
    with tempfile.TemporaryFile() as stderr:  # read after the run: a full pipe would block it
        process = subprocess.Popen([sys.executable, "-m", AGENT_MODULE, "client", str(workspace), str(tasks)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)  # fmt: skip
        assert process.stdout is not None
        marks = _marks(process, process.stdout, lambda line: line.startswith(b"done "))
        process.stdout.close()
        stderr.seek(0)
        error = stderr.read().decode(errors="replace")[-2000:]
    if process.returncode != 0 or len(marks) != tasks:
        raise RuntimeError(f"the bare side did not drain {tasks} tasks (exit {process.returncode}): {error}")
    return marks
