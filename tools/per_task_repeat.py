"""Run the per-task soak N times and judge each run's samples twice: by slope alone (before `memory_floor`)
and as the soak judges now. The same samples, two verdicts: how often each would have failed.

    .venv/bin/python tools/per_task_repeat.py --runs 8 [--tasks 120]

Each run drains its tasks with every bound out of reach, so no run stops early; the judging happens after.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

from soak import Bounds, MemoryGrowthError, SoakRunner, check_memory
from soak._sampler import SampleTable

UNREACHABLE = 1 << 40
METRICS = {"kernel_rss": "kernel_rss_slope", "kernel_uss": "kernel_uss_slope", "agent_rss": "agent_rss_slope"}


def verdicts(table: SampleTable, bounds: Bounds) -> dict[str, tuple[str, str]]:
    """{metric: (slope-only verdict, verdict with the floor)}."""
    out = {}
    for metric, limit_name in METRICS.items():
        limit = getattr(bounds, limit_name)
        pair = []
        for floor in (0.0, bounds.memory_floor):
            try:
                check_memory(table, bounds, metric=metric, limit=limit, ceiling=UNREACHABLE, floor=floor)
                pair.append("pass")
            except MemoryGrowthError as error:
                pair.append(f"FAIL ({error.message.split(';')[0]})")
        out[metric] = (pair[0], pair[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=120)
    args = parser.parse_args()
    judged = Bounds(warmup=20, window=25)  # the LoopSoak per-task test's bounds
    reach = dataclasses.replace(judged, **{f.name: UNREACHABLE for f in dataclasses.fields(judged)
                                           if f.name.endswith(("_slope", "_ceiling"))})  # fmt: skip
    failed = {"slope only": 0, "with floor": 0}
    for run in range(1, args.runs + 1):
        result = SoakRunner(tasks=args.tasks, mode="per-task", bounds=reach).run()
        assert result.passed, result.error
        table = SampleTable(len(result.samples))
        for sample in result.samples:
            table.append(dataclasses.astuple(sample))
        found = verdicts(table, judged)
        uss = table.column("kernel_uss")
        growth = (uss[-1] - uss[judged.warmup]) / 2**20
        slopes = check_memory(table, judged, metric="kernel_uss", limit=UNREACHABLE, ceiling=UNREACHABLE)[
            "window_slopes"
        ]
        closest = max(min(a, b) for a, b in itertools.pairwise(slopes)) / 1024
        failed["slope only"] += any(old != "pass" for old, _ in found.values())
        failed["with floor"] += any(new != "pass" for _, new in found.values())
        print(f"run {run}: kernel USS +{growth:.2f} MiB after the warm-up, closest window pair "
              f"{closest:.1f} KiB/task (limit {judged.kernel_uss_slope / 1024:.0f}); "
              + "; ".join(f"{m}: {old} -> {new}" for m, (old, new) in found.items()), flush=True)  # fmt: skip
    print(f"{args.runs} runs of {args.tasks} per-task soak tasks: slope only failed {failed['slope only']}, "
          f"with the {judged.memory_floor / 2**20:.0f} MiB floor failed {failed['with floor']}")  # fmt: skip


if __name__ == "__main__":
    main()
