"""The soak runner: drain N tasks through the real kernel and fail when a resource keeps growing.

Two modes: `shared` (one long-lived agent process serves every task, one
kernel run) and `per-task` (a kernel run, so an agent process, per task).
After each task it samples the kernel process (RSS, USS, fds, threads, child
processes, tracemalloc), the agent process (RSS, fds, threads) and the
transcript bytes written, and applies the bounds in `_checks.py`: counters at
quiet points (with a settle loop), memory and transcript at the end of every
window, so a broken bound stops the soak early with an error that names it.

`loops=N` runs N kernel loops at once in this process (one event loop), each with its own workspace, queue
(its share of the tasks) and agent; `endpoint=` puts the inference agent on an OpenAI-compatible server, which
all the loops share. Each loop is judged on its own tasks where the thing judged is its own: its agent's
counters at its quiet points, its agent's RSS and its transcript over its windows. The kernel process is the
loops' together: its memory is judged over every task in the order they ended (the warm-up and the windows
`loops` times a loop's), and since no moment between two tasks is quiet for all loops at once, its fds,
threads and children must be back where they were before the loops started once they have all ended. (The
sum of the loops' transcripts is not judged: between two samples it grows by whatever the other loops' tasks
in flight wrote, and each loop's own is.) Per loop and in aggregate it counts tasks and completion tokens/s
(`_throughput.py`).
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from harness import Kernel, Task, Terminal, parse_config
from harness.conformance._process_tree import what_the_agent_holds
from harness.testing import (
    DEMO_TASKS,
    OUT_RULES,
    Endpoint,
    inference_agent_command,
    inference_agent_env,
    make_workspace,
    scripted_agent_command,
    write_yaml,
)

from ._checks import (
    Bounds,
    MemoryGrowthError,
    SoakError,
    TranscriptGrowthError,
    UnclosedResourceError,
    check_memory,
    check_transcript,
    window_slices,
)
from ._inject import Injector
from ._sampler import (
    FIELDS,
    AgentCounters,
    Counters,
    ExactCounters,
    Sample,
    SampleTable,
    agent_counters,
    kernel_counters,
    take_sample,
)
from ._throughput import LoopCount, aggregate, rate
from ._work import SoakQueue, scripted_turn, what_is_open

__all__ = ["SoakResult", "SoakRunner"]

_C = TypeVar("_C", bound=ExactCounters)

SCRIPTED_TASK = "Write out/result.txt and read it back."
#: What any other agent is asked each task: a file under out/, which git ignores and the policy lets it write.
COMMAND_TASK = "Create the file out/result.txt containing the word result."
RULES = [*OUT_RULES, {"id": "git-status", "kind": "execute", "commands": ["git status*"], "decision": "allow"}]
INFERENCE_RULES = [*RULES, {"id": "write-any", "kind": "write", "paths": ["**"], "decision": "allow"}]


@dataclass
class SoakResult:
    mode: str
    agent: str
    tasks: int
    samples: list[Sample]
    figures: dict[str, Any]
    bounds: Bounds
    seconds: float
    error: SoakError | None = None
    terminals: dict[str, int] = field(default_factory=dict)
    loops: int = 1
    #: all the loops together: tasks, completion tokens and their rates (`_throughput.aggregate`)
    throughput: dict[str, Any] = field(default_factory=dict)
    #: each loop's throughput, and with several loops the figures of the bounds judged on it alone
    per_loop: list[dict[str, Any]] = field(default_factory=list)
    endpoint: dict[str, Any] | None = None  # the model server the inference agent used: {url, model}
    judged: bool = True  # False: drained and counted only (no bound judged)

    @property
    def passed(self) -> bool:
        """Every bound held over every task; counting only, every task ended, whatever its terminal."""
        if not self.judged:
            return self.error is None and self.throughput.get("done") == self.tasks
        return self.error is None and len(self.samples) == self.tasks

    @property
    def done(self) -> int:
        """Tasks drained: judged, those sampled (completed, every bound checked after each); counting only, every
        task that ended, whatever its terminal."""
        return len(self.samples) if self.judged else int(self.throughput.get("done") or 0)

    @property
    def tasks_per_second(self) -> float:
        return rate(self.done, self.seconds) or 0.0


class _Loop:
    """One of the soak's kernel loops: its share of the tasks, its agent, its samples and its count."""

    def __init__(self, index: int, first: int, tasks: int) -> None:
        self.index = index  # from 0; named `loop {index + 1}`
        self.first = first  # the soak's index of its first task
        self.tasks = tasks
        self.table = SampleTable(tasks)  # with several loops: its agent and transcript, sampled at its boundaries
        self.kernel: Kernel | None = None  # shared mode: its one kernel, whose transcript size is sampled
        self.queue: SoakQueue | None = None  # its tasks still to run
        self.agent: psutil.Process | None = None
        self.agent_baseline: AgentCounters | None = None  # shared mode: its agent's, after its warm-up
        self.transcript_total = 0  # per-task mode: the bytes of its finished runs' transcripts
        self.count = LoopCount(index + 1, tasks)
        self.figures: dict[str, Any] = {}

    def transcript_bytes(self) -> int:
        """Its transcripts' bytes: the finished runs', and the running kernel's."""
        return self.transcript_total + (self.kernel.transcript_bytes if self.kernel is not None else 0)


class SoakRunner:
    """`SoakRunner(tasks=500).run()` -> SoakResult; `inject=("fd",)` leaks on purpose.

    `agent` is `scripted`, `inference`, or any ACP agent's command line (a list): `SoakRunner(agent=["python",
    "my_agent.py"])`. Every task asks for the same file under `out/` (ignored by git), which the policy lets
    the agent write; `agent_env` is passed to it. `endpoint` runs the inference agent on that OpenAI-compatible
    server (a network rule lets it through the sandbox's proxy); `loops` drains the tasks with that many kernel
    loops at once, the first `tasks % loops` loops taking one more. `judge=False` only drains and counts (a
    bench's throughput): no bound is judged, so no run is too short, nothing is traced or collected, and a task
    that stops its run (`MaxIterations`, `BlockedPolicy`: a small model's usual ends) is counted with its
    terminal while its loop goes on in a new run (a new agent) with the tasks left."""

    def __init__(
        self,
        *,
        tasks: int = 500,
        mode: str = "shared",
        agent: str | Sequence[str] = "scripted",
        agent_env: Mapping[str, str] | None = None,
        bounds: Bounds | None = None,
        inject: tuple[str, ...] = (),
        workdir: Path | None = None,
        progress: Callable[[int, int], None] | None = None,
        threads: int = 2,
        loops: int = 1,
        endpoint: Endpoint | None = None,
        judge: bool = True,
    ) -> None:
        if mode not in ("shared", "per-task"):
            raise ValueError(f"mode must be 'shared' or 'per-task' (got {mode!r})")
        if isinstance(agent, str) and agent not in ("scripted", "inference"):
            raise ValueError(f"agent must be 'scripted', 'inference' or a command line as a list (got {agent!r})")
        if not isinstance(agent, str) and not agent:
            raise ValueError("the agent's command line is empty")
        if endpoint is not None and agent != "inference":
            raise ValueError("an endpoint is the inference agent's model server: give agent='inference'")
        if loops < 1 or tasks < loops:
            raise ValueError(f"{loops} loops need at least 1 task each (got {tasks} tasks)")
        self.tasks = tasks
        self.mode = mode
        self.agent_command = None if isinstance(agent, str) else [str(part) for part in agent]
        self.agent_kind = agent if isinstance(agent, str) else "command"
        self.agent_env = dict(agent_env or {})
        self.endpoint = endpoint
        shares = [tasks // loops + (1 if i < tasks % loops else 0) for i in range(loops)]
        self.loops = [_Loop(i, sum(shares[:i]), share) for i, share in enumerate(shares)]
        bounds = bounds or Bounds()
        # The window is fixed by the planned run, not by how far it has got: a check half-way through
        # must judge the same windows as the last one (a 10-task window turned one set resize into a leak).
        # It counts a loop's own tasks; the kernel process's bounds count every loop's (`for_loops`).
        self.bounds = bounds if bounds.window else bounds.with_overrides(window=bounds.window_for(min(shares)))
        self.kernel_bounds = self.bounds.for_loops(loops)
        short = bounds.too_short(tasks, loops)
        if short is not None and judge:
            raise ValueError(short)
        self.judge = judge
        self.injector = Injector(inject)
        if inject and not judge:
            raise ValueError("a leak is injected to prove a check fails: with judge=False none runs")
        if self.injector.agent_leaks and (agent != "scripted" or mode != "shared"):
            raise ValueError("the agent-side leaks are the scripted agent's, in shared mode")
        self.workdir = workdir
        self.progress = progress
        self.threads = threads
        self.table = SampleTable(tasks)  # the kernel process, at every loop's boundaries (one loop: its agent too)
        self.figures: dict[str, Any] = {}
        self.error: SoakError | None = None
        self.terminals: dict[str, int] = {}
        self._baseline: Counters | None = None
        self._snapshot: tracemalloc.Snapshot | None = None
        self._started = 0.0

    def _loop_figures(self, loop: _Loop) -> dict[str, Any]:
        # alone, the loop's bounds are the soak's own figures
        return loop.count.figures() if self.alone else {**loop.count.figures(), "figures": loop.figures}

    @property
    def alone(self) -> bool:
        return len(self.loops) == 1

    def run(self) -> SoakResult:
        started_tracing = self.judge and not tracemalloc.is_tracing()
        if started_tracing:
            tracemalloc.start()
        # several loops: the kernel's counters before any of them started, and after all have ended
        before = None if self.alone or not self.judge else self._settled_now()
        try:
            with tempfile.TemporaryDirectory(prefix="loop-harness-soak-") as tmp:
                asyncio.run(self._soak(self.workdir or Path(tmp)))
            if before is not None and self.error is None:
                self._check_kernel_after_loops(before)  # before the injected leaks are released
        finally:
            gc.unfreeze()
            self.injector.release()
            if started_tracing:
                tracemalloc.stop()
        counts = [loop.count for loop in self.loops]
        return SoakResult(
            mode=self.mode,
            agent=self.agent_kind,
            tasks=self.tasks,
            samples=self.table.rows(),
            figures=self.figures,
            bounds=self.bounds,
            seconds=time.monotonic() - self._started,
            error=self.error,
            terminals=self.terminals,
            loops=len(self.loops),
            throughput=aggregate(counts, max(c.seconds for c in counts)),
            per_loop=[self._loop_figures(loop) for loop in self.loops],
            endpoint=None if self.endpoint is None else {"url": self.endpoint.url, "model": self.endpoint.model},
            judged=self.judge,
        )

    # --- driving the kernel --------------------------------------------------------------------

    async def _soak(self, root: Path) -> None:
        # The inference soak measures the agent's memory, not the small model's aim: every untracked file is
        # ignored and writes go anywhere, so a wrong file name does not end the run before its 30 tasks.
        everything_but_ours = ["/*", "!/README.md", "!/.gitignore"]
        ignore = everything_but_ours if self.agent_kind == "inference" else ["out/"]
        places = [root] if self.alone else [root / f"loop{loop.index + 1}" for loop in self.loops]
        workspaces = [make_workspace(place / "ws", ignore=ignore).path for place in places]
        self._started = time.monotonic()
        await asyncio.gather(
            *(self._drain(loop, place, ws) for loop, place, ws in zip(self.loops, places, workspaces, strict=True))
        )
        self._finish()

    async def _drain(self, loop: _Loop, root: Path, workspace: Path) -> None:
        """One loop drains its share: one kernel run (shared mode), or a run per task."""
        grow = "transcript" in self.injector.kinds
        observe = self._observer(loop)
        if self.mode == "shared":
            loop.queue = SoakQueue(self, loop.tasks, first=loop.first)
            while True:
                loop.kernel = Kernel(self._config(root, workspace, grow), provider=loop.queue, observer=observe,
                                     on_task_boundary=lambda done: self._shared_boundary(loop, done))  # fmt: skip
                result = await loop.kernel.run()
                # counting only: the task that stopped the run was counted (and dropped); the rest go on
                if self.judge or result.terminal is Terminal.IDLE or not loop.queue.open:
                    break
                loop.transcript_total += loop.kernel.transcript_bytes
                loop.kernel = None
            self._ended(loop, result)
            return
        for index in range(loop.tasks):
            if self.error is not None:  # another loop broke a bound: its queue would list nothing
                return
            config = self._config(root, workspace, grow)
            loop.queue = SoakQueue(self, 1, first=loop.first + index)
            kernel = Kernel(config, provider=loop.queue, observer=observe)
            result = await kernel.run()
            loop.transcript_total += kernel.transcript_bytes
            if result.terminal is not Terminal.IDLE and self.judge:
                self._ended(loop, result)
                return
            if result.terminal is Terminal.IDLE and not await self.boundary(loop, len(self._table_of(loop)) + 1):
                return

    def _config(self, root: Path, workspace: Path, grow: bool) -> Any:
        rules = INFERENCE_RULES if self.agent_kind == "inference" else RULES
        if self.agent_command is not None:
            agent = {"command": self.agent_command, "supports_permission_requests": True, "env": self.agent_env}
        elif self.agent_kind == "scripted":
            turn = scripted_turn(grow, self.injector.agent_leaks)
            scenario = write_yaml(root / "scenario.yaml", {"tasks": [{"turns": [turn]}]})
            agent = {"command": scripted_agent_command(scenario), "supports_permission_requests": True}
        else:
            command = inference_agent_command(threads=self.threads, endpoint=self.endpoint)
            agent = {"command": command, "supports_permission_requests": True, "env": inference_agent_env()}
            if self.endpoint is not None:  # the agent reaches it through the sandbox's proxy: a rule lets it
                rules = [*rules, self.endpoint.network_rule()]
                if self.endpoint.model:  # run_start records what the server serves under that name
                    agent["endpoint"] = {"url": self.endpoint.url, "model": self.endpoint.model}
        data = {
            "workspace": str(workspace),
            "agent": agent,
            "policy": {"rules": rules},
            "limits": {"max_iterations": 4, "turn_timeout_s": 300, "cancel_grace_s": 30},
            "transcripts": str(root / "transcripts"),
        }
        return parse_config(data, base_dir=root)

    def task(self, index: int) -> Task:
        if self.agent_kind == "inference":
            demo = DEMO_TASKS[index % len(DEMO_TASKS)]  # the ones the pinned model completes
            return Task(f"T{index + 1}", demo["title"], demo["body"])
        return Task(f"T{index + 1}", f"soak task {index + 1}", COMMAND_TASK if self.agent_command else SCRIPTED_TASK)

    def _observer(self, loop: _Loop) -> Callable[[dict[str, Any]], None]:
        def observe(record: dict[str, Any]) -> None:
            kind = record["type"]
            if kind == "agent_start":
                loop.agent = psutil.Process(record["pid"])
            elif kind == "task_end":
                self.terminals[record["terminal"]] = self.terminals.get(record["terminal"], 0) + 1
                loop.count.count(record, time.monotonic() - self._started)
                if not self.judge and loop.queue is not None:  # counted: a task that stopped its run is not retried
                    loop.queue.drop(record["id"])

        return observe

    def _ended(self, loop: _Loop, result: Any) -> None:
        """A loop's kernel run ended: a soak must drain every task, so anything short of that fails."""
        done = len(self._table_of(loop)) if self.judge else loop.count.done
        if self.error is None and done < loop.tasks:
            which = "the run" if self.alone else f"loop {loop.index + 1}'s run"
            self.error = SoakError(
                "run" if self.alone else f"loop {loop.index + 1} run",
                f"{which} ended {result.terminal.value} after {done} of {loop.tasks} tasks: {result.reason}",
                baseline=loop.tasks,
                final=done,
            )

    # --- at each task boundary -----------------------------------------------------------------

    def _table_of(self, loop: _Loop) -> SampleTable:
        """Where a loop's agent and transcript are sampled: alone, with the kernel's; else its own table."""
        return self.table if self.alone else loop.table

    async def _shared_boundary(self, loop: _Loop, done: int) -> None:
        # `done` counts this run's tasks: counting only, a loop may have had runs before
        if self.error is None:  # after a bound broke the queues list nothing more: the runs end Idle
            await self.boundary(loop, len(self._table_of(loop)) + 1)

    async def boundary(self, loop: _Loop, done: int) -> bool:
        """Sample and check after `loop`'s task `done`; False stops the soak (a bound broke)."""
        if self.judge:
            self.injector.leak()
            gc.collect()  # garbage waiting for a collection is not a leak (cheap: see the freeze below)
        agent = loop.agent if self.mode == "shared" else None
        values = take_sample(done, self._started, agent, loop.transcript_bytes())
        if self.alone:
            self.table.append(values)
        else:  # the kernel's row: every loop's tasks and transcripts, no one agent's
            loop.table.append(values)
            total = len(self.table) + 1
            transcript = sum(other.transcript_bytes() for other in self.loops)
            self.table.append(_kernel_row(values, total, transcript))
        if self.progress is not None:
            self.progress(len(self.table), self.tasks)
        if not self.judge:
            return True
        try:
            await self._kernel_checks(len(self.table))
            await self._loop_checks(loop, done, agent)
        except SoakError as error:
            self.error = error
            return False
        return True

    async def _kernel_checks(self, done: int) -> None:
        """The kernel process after its `done`th task (of any loop)."""
        b = self.kernel_bounds
        if done == b.warmup:
            if self.alone:  # several loops: never quiet at once; checked once they have all ended
                self._baseline = await self._settled(kernel_counters)
            # Everything alive now moves to a permanent generation, so the collection before each
            # sample only walks what was allocated since (18 ms -> well under 1 ms per task).
            gc.freeze()
            self._snapshot = tracemalloc.take_snapshot()
        elif self._baseline is not None and done % b.quiet_every == 0:
            await self._check_exact("kernel", kernel_counters, self._baseline, done, what_is_open)
        if done > b.warmup and (done - b.warmup) % b.window_for(done) == 0:
            self._check_kernel_memory()

    async def _loop_checks(self, loop: _Loop, done: int, agent: psutil.Process | None) -> None:
        """`loop`'s agent after its task `done`: its counters at its quiet points, its memory and transcript at
        the end of its windows (alone: the transcript is the kernel's table's, judged there)."""
        b = self.bounds
        whose = "agent" if self.alone else f"loop {loop.index + 1} agent"
        if agent is not None and done == b.warmup:
            loop.agent_baseline = await self._settled(lambda: agent_counters(agent))
        elif agent is not None and loop.agent_baseline is not None and done % b.quiet_every == 0:
            await self._check_exact(whose, lambda: agent_counters(agent), loop.agent_baseline, done,
                                    lambda resource: what_the_agent_holds(agent, resource))  # fmt: skip
        if done > b.warmup and (done - b.warmup) % b.window_for(done) == 0:
            self._check_loop_memory(loop)

    async def _settled(self, read: Callable[[], _C]) -> _C:
        """Counters once two reads agree (after a collection and a short wait)."""
        previous = read()
        for _ in range(self.bounds.settle_retries):
            gc.collect()
            await asyncio.sleep(0.02)
            current = read()
            if current == previous:
                return current
            previous = current
        return previous

    async def _check_exact(
        self, whose: str, read: Callable[[], _C], baseline: _C, done: int, what_is_open: Callable[[str], list[str]]
    ) -> None:
        """`whose` counters back at their baseline, within the settle retries, or UnclosedResourceError."""
        for _ in range(self.bounds.settle_retries):
            diff = read().diff(baseline)
            if not diff:
                return
            gc.collect()
            await asyncio.sleep(0.02)
        resource, (then, now) = next(iter(diff.items()))
        raise UnclosedResourceError(
            f"{whose} {resource}",
            f"{now} after task {done}, baseline {then} (+{now - then}) after "
            f"{self.bounds.settle_retries} settle retries",
            baseline=then,
            final=now,
            extras=what_is_open(resource),
        )

    def _check_kernel_memory(self) -> None:
        b = self.kernel_bounds
        checks = [  # tracemalloc counts Python's blocks exactly: no allocator steps to allow for
            ("kernel_rss", b.kernel_rss_slope, b.kernel_growth_ceiling, b.kernel_peak_ceiling, b.memory_floor),
            ("kernel_uss", b.kernel_uss_slope, b.kernel_growth_ceiling, None, b.memory_floor),
            ("tracemalloc_current", b.tracemalloc_slope, b.kernel_growth_ceiling, None, 0.0),
        ]
        self.figures.update(self._memory(self.table, b, checks, ""))
        if self.alone:  # several loops: the sum's steps mix the loops' tasks in flight; each loop's is judged
            self.figures["transcript_bytes"] = check_transcript(self.table, b)

    def _check_loop_memory(self, loop: _Loop) -> None:
        b = self.bounds
        checks = [("agent_rss", b.agent_rss_slope, b.agent_growth_ceiling, None, b.memory_floor)]
        if self.alone:
            self.figures.update(self._memory(self.table, b, checks, ""))
            return
        named = f"loop {loop.index + 1} "
        loop.figures.update(self._memory(loop.table, b, checks, named))
        try:
            loop.figures["transcript_bytes"] = check_transcript(loop.table, b)
        except TranscriptGrowthError as error:
            raise _renamed(error, named) from None

    def _memory(self, table: SampleTable, b: Bounds, checks: Sequence[tuple[str, float, float, float | None, float]],
                named: str) -> dict[str, Any]:  # fmt: skip
        """Each (metric, slope limit, growth ceiling, peak ceiling, floor) judged over `table`; a broken one
        raises MemoryGrowthError with the top tracemalloc growth, its resource prefixed with `named`."""
        figures = {}
        for metric, limit, ceiling, peak, floor in checks:
            try:
                figures[metric] = check_memory(table, b, metric=metric, limit=limit, ceiling=ceiling, peak=peak,
                                               floor=floor)  # fmt: skip
            except MemoryGrowthError as error:
                allocations = self._top_allocations()
                top = "\n".join(f"    {line}" for line in allocations[:5])
                raise MemoryGrowthError(
                    named + error.resource,
                    f"{error.message}\n  top tracemalloc growth since the warm-up:\n{top}",
                    baseline=error.baseline,
                    final=error.final,
                    extras={**(error.extras or {}), "tracemalloc_top": allocations},
                ) from None
        return figures

    def _finish(self) -> None:
        """The last checks, over every complete window."""
        if not self.judge:
            return
        try:
            if self.error is None and window_slices(len(self.table), self.kernel_bounds):
                self._check_kernel_memory()
            for loop in self.loops:
                if self.error is None and window_slices(len(self._table_of(loop)), self.bounds):
                    self._check_loop_memory(loop)
        except SoakError as error:
            self.error = error

    def _settled_now(self) -> Counters:
        """The kernel's counters once two reads agree, outside any event loop (whose selector holds fds)."""
        previous = kernel_counters()
        for _ in range(self.bounds.settle_retries):
            gc.collect()
            time.sleep(0.02)
            current = kernel_counters()
            if current == previous:
                break
            previous = current
        return previous

    def _check_kernel_after_loops(self, before: Counters) -> None:
        """Several loops: the kernel's fds, threads and children back where they were before the loops started,
        now that all have ended (within the settle retries), or UnclosedResourceError."""
        diff: dict[str, tuple[int, int]] = {}
        for _ in range(self.bounds.settle_retries):
            diff = kernel_counters().diff(before)
            if not diff:
                break
            gc.collect()
            time.sleep(0.02)
        self.figures["kernel_counters"] = {"checked": True, "before": asdict(before),
                                           "after": asdict(kernel_counters())}  # fmt: skip
        if diff:
            resource, (then, now) = next(iter(diff.items()))
            self.error = UnclosedResourceError(
                f"kernel {resource}",
                f"{now} after all {len(self.loops)} loops ended, {then} before they started (+{now - then}) after "
                f"{self.bounds.settle_retries} settle retries",
                baseline=then,
                final=now,
                extras=what_is_open(resource),
            )

    def _top_allocations(self) -> list[str]:
        if self._snapshot is None or not tracemalloc.is_tracing():
            return []
        stats = tracemalloc.take_snapshot().compare_to(self._snapshot, "lineno")
        return [str(stat) for stat in stats[:10]]


def _kernel_row(values: tuple[float | None, ...], task: int, transcript: int) -> tuple[float | None, ...]:
    """A loop's sample as the kernel's table keeps it: numbered among every loop's tasks, with every loop's
    transcript bytes, and no agent's figures (each loop's agent is judged on its own table)."""
    row = list(values)
    row[FIELDS.index("task")] = task
    row[FIELDS.index("transcript_bytes")] = transcript
    for name in ("agent_rss", "agent_fds", "agent_threads"):
        row[FIELDS.index(name)] = None
    return tuple(row)


def _renamed(error: SoakError, named: str) -> SoakError:
    return type(error)(named + error.resource, error.message, baseline=error.baseline, final=error.final,
                       extras=error.extras)  # fmt: skip
