"""The soak runner: drain N tasks through the real kernel and fail when a resource keeps growing.

Two modes: `shared` (one long-lived agent process serves every task, one
kernel run) and `per-task` (a kernel run, so an agent process, per task).
After each task it samples the kernel process (RSS, USS, fds, threads, child
processes, tracemalloc), the agent process (RSS, fds, threads) and the
transcript bytes written, and applies the bounds in `_checks.py`: counters at
quiet points (with a settle loop), memory and transcript at the end of every
window, so a broken bound stops the soak early with an error that names it.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from harness import Kernel, Task, Terminal, parse_config
from harness.conformance._process_tree import what_the_agent_holds
from harness.testing import (
    DEMO_TASKS,
    OUT_RULES,
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
    UnclosedResourceError,
    check_memory,
    check_transcript,
    window_slices,
)
from ._inject import Injector
from ._sampler import (
    AgentCounters,
    Counters,
    ExactCounters,
    Sample,
    SampleTable,
    agent_counters,
    kernel_counters,
    take_sample,
)

__all__ = ["SoakResult", "SoakRunner"]

_C = TypeVar("_C", bound=ExactCounters)

SCRIPTED_TASK = "Write out/result.txt and read it back."
#: What any other agent is asked each task: a file under out/, which git ignores and the policy lets it write.
COMMAND_TASK = "Create the file out/result.txt containing the word result."
RULES = [*OUT_RULES, {"id": "git-status", "kind": "execute", "commands": ["git status*"], "decision": "allow"}]
INFERENCE_RULES = [*RULES, {"id": "write-any", "kind": "write", "paths": ["**"], "decision": "allow"}]


def scripted_turn(grow: bool, leaks: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per task: a tool call with a permission request, an fs write and read, a terminal command; `leaks`
    (`fd`, `thread`) the agent leaks on purpose each task."""
    steps: list[dict[str, Any]] = [
        {"tool_call": {"title": "Write out/result.txt", "kind": "edit", "locations": ["out/result.txt"],
                       "permission": True}},
        {"write": {"path": "out/result.txt", "content": "result\n"}},
        {"read": {"path": "out/result.txt", "expect": "result\n"}},
        {"terminal": {"command": "git", "args": ["status", "--short"]}},
        {"message": "done"},
    ]  # fmt: skip
    if grow:
        steps.append({"growing_message": 200})
    steps.extend({"leak": what} for what in leaks)
    return {"steps": steps}


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

    @property
    def passed(self) -> bool:
        return self.error is None and len(self.samples) == self.tasks

    @property
    def tasks_per_second(self) -> float:
        return round(len(self.samples) / self.seconds, 1) if self.seconds else 0.0


class SoakRunner:
    """`SoakRunner(tasks=500).run()` -> SoakResult; `inject=("fd",)` leaks on purpose.

    `agent` is `scripted`, `inference`, or any ACP agent's command line (a list): `SoakRunner(agent=["python",
    "my_agent.py"])`. Every task asks for the same file under `out/` (ignored by git), which the policy lets
    the agent write; `agent_env` is passed to it."""

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
    ) -> None:
        if mode not in ("shared", "per-task"):
            raise ValueError(f"mode must be 'shared' or 'per-task' (got {mode!r})")
        if isinstance(agent, str) and agent not in ("scripted", "inference"):
            raise ValueError(f"agent must be 'scripted', 'inference' or a command line as a list (got {agent!r})")
        if not isinstance(agent, str) and not agent:
            raise ValueError("the agent's command line is empty")
        self.tasks = tasks
        self.mode = mode
        self.agent_command = None if isinstance(agent, str) else [str(part) for part in agent]
        self.agent_kind = agent if isinstance(agent, str) else "command"
        self.agent_env = dict(agent_env or {})
        bounds = bounds or Bounds()
        # The window is fixed by the planned run, not by how far it has got: a check half-way through
        # must judge the same windows as the last one (a 10-task window turned one set resize into a leak).
        self.bounds = bounds if bounds.window else bounds.with_overrides(window=bounds.window_for(tasks))
        short = bounds.too_short(tasks)
        if short is not None:
            raise ValueError(short)
        self.injector = Injector(inject)
        if self.injector.agent_leaks and (agent != "scripted" or mode != "shared"):
            raise ValueError("the agent-side leaks are the scripted agent's, in shared mode")
        self.workdir = workdir
        self.progress = progress
        self.threads = threads
        self.table = SampleTable(tasks)
        self.figures: dict[str, Any] = {}
        self.error: SoakError | None = None
        self.terminals: dict[str, int] = {}
        self._baseline: Counters | None = None
        self._agent_baseline: AgentCounters | None = None  # shared mode: the one agent's, after the warm-up
        self._snapshot: tracemalloc.Snapshot | None = None
        self._agent: psutil.Process | None = None
        self._transcript_total = 0
        self._started = 0.0
        self._kernel: Kernel | None = None  # the shared-mode kernel, whose transcript size is sampled

    def run(self) -> SoakResult:
        started_tracing = not tracemalloc.is_tracing()
        if started_tracing:
            tracemalloc.start()
        try:
            with tempfile.TemporaryDirectory(prefix="loop-harness-soak-") as tmp:
                asyncio.run(self._soak(self.workdir or Path(tmp)))
        finally:
            gc.unfreeze()
            self.injector.release()
            if started_tracing:
                tracemalloc.stop()
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
        )

    # --- driving the kernel --------------------------------------------------------------------

    async def _soak(self, root: Path) -> None:
        # The inference soak measures the agent's memory, not the small model's aim: every untracked file is
        # ignored and writes go anywhere, so a wrong file name does not end the run before its 30 tasks.
        everything_but_ours = ["/*", "!/README.md", "!/.gitignore"]
        workspace = make_workspace(
            root / "ws", ignore=everything_but_ours if self.agent_kind == "inference" else ["out/"]
        )
        grow = "transcript" in self.injector.kinds
        self._started = time.monotonic()
        if self.mode == "shared":
            kernel = Kernel(self._config(root, workspace.path, grow, 0), provider=_SoakQueue(self, self.tasks),
                            observer=self._observe, on_task_boundary=self._shared_boundary)  # fmt: skip
            self._kernel = kernel
            result = await kernel.run()
            self._ended(result)
            return
        for index in range(self.tasks):
            config = self._config(root, workspace.path, grow, index)
            kernel = Kernel(config, provider=_SoakQueue(self, 1, first=index), observer=self._observe)
            result = await kernel.run()
            self._transcript_total += kernel.transcript_bytes
            if result.terminal is not Terminal.IDLE:
                self._ended(result)
                return
            if not await self.boundary(index + 1):
                return
        self._finish()

    def _config(self, root: Path, workspace: Path, grow: bool, index: int) -> Any:
        if self.agent_command is not None:
            agent = {"command": self.agent_command, "supports_permission_requests": True, "env": self.agent_env}
        elif self.agent_kind == "scripted":
            turn = scripted_turn(grow, self.injector.agent_leaks)
            scenario = write_yaml(root / "scenario.yaml", {"tasks": [{"turns": [turn]}]})
            agent = {"command": scripted_agent_command(scenario), "supports_permission_requests": True}
        else:
            command = inference_agent_command(threads=self.threads)
            agent = {"command": command, "supports_permission_requests": True, "env": inference_agent_env()}
        data = {
            "workspace": str(workspace),
            "agent": agent,
            "policy": {"rules": INFERENCE_RULES if self.agent_kind == "inference" else RULES},
            "limits": {"max_iterations": 4, "turn_timeout_s": 300, "cancel_grace_s": 30},
            "transcripts": str(root / "transcripts"),
        }
        return parse_config(data, base_dir=root)

    def task(self, index: int) -> Task:
        if self.agent_kind == "inference":
            demo = DEMO_TASKS[index % len(DEMO_TASKS)]  # the ones the pinned model completes
            return Task(f"T{index + 1}", demo["title"], demo["body"])
        return Task(f"T{index + 1}", f"soak task {index + 1}", COMMAND_TASK if self.agent_command else SCRIPTED_TASK)

    def _observe(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "agent_start":
            self._agent = psutil.Process(record["pid"])
        elif kind == "task_end":
            self.terminals[record["terminal"]] = self.terminals.get(record["terminal"], 0) + 1

    def _ended(self, result: Any) -> None:
        """The kernel run ended: a soak must drain every task, so anything short of that fails."""
        if self.error is None and len(self.table) < self.tasks:
            self.error = SoakError(
                "run",
                f"the run ended {result.terminal.value} after {len(self.table)} of {self.tasks} tasks: {result.reason}",
                baseline=self.tasks,
                final=len(self.table),
            )
        if self.error is None:
            self._finish()

    # --- at each task boundary -----------------------------------------------------------------

    async def _shared_boundary(self, done: int) -> None:
        if self.error is None:  # after a bound broke the queue lists nothing more: the run ends Idle
            await self.boundary(done)

    async def boundary(self, done: int) -> bool:
        """Sample and check after task `done`; False stops the soak (a bound broke)."""
        self.injector.leak()
        gc.collect()  # garbage waiting for a collection is not a leak (cheap: see the freeze below)
        shared = self._kernel if self.mode == "shared" else None
        transcript = shared.transcript_bytes if shared is not None else self._transcript_total
        agent = self._agent if self.mode == "shared" else None
        self.table.append(take_sample(done, self._started, agent, transcript))
        if self.progress is not None:
            self.progress(done, self.tasks)
        try:
            if done == self.bounds.warmup:
                self._baseline = await self._settled(kernel_counters)
                if agent is not None:
                    self._agent_baseline = await self._settled(lambda: agent_counters(agent))
                # Everything alive now moves to a permanent generation, so the collection before each
                # sample only walks what was allocated since (18 ms -> well under 1 ms per task).
                gc.freeze()
                self._snapshot = tracemalloc.take_snapshot()
            elif self._baseline is not None and done % self.bounds.quiet_every == 0:
                await self._check_exact("kernel", kernel_counters, self._baseline, done, _what_is_open)
                if agent is not None and self._agent_baseline is not None:
                    await self._check_exact("agent", lambda: agent_counters(agent), self._agent_baseline, done,
                                            lambda resource: what_the_agent_holds(agent, resource))  # fmt: skip
            if done > self.bounds.warmup and (done - self.bounds.warmup) % self.bounds.window_for(done) == 0:
                self._check_memory_and_transcript()
        except SoakError as error:
            self.error = error
            return False
        return True

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

    def _check_memory_and_transcript(self) -> None:
        b = self.bounds
        checks = [  # tracemalloc counts Python's blocks exactly: no allocator steps to allow for
            ("kernel_rss", b.kernel_rss_slope, b.kernel_growth_ceiling, b.kernel_peak_ceiling, b.memory_floor),
            ("kernel_uss", b.kernel_uss_slope, b.kernel_growth_ceiling, None, b.memory_floor),
            ("tracemalloc_current", b.tracemalloc_slope, b.kernel_growth_ceiling, None, 0.0),
            ("agent_rss", b.agent_rss_slope, b.agent_growth_ceiling, None, b.memory_floor),
        ]
        for metric, limit, ceiling, peak, floor in checks:
            try:
                self.figures[metric] = check_memory(self.table, b, metric=metric, limit=limit, ceiling=ceiling,
                                                    peak=peak, floor=floor)  # fmt: skip
            except MemoryGrowthError as error:
                allocations = self._top_allocations()
                top = "\n".join(f"    {line}" for line in allocations[:5])
                raise MemoryGrowthError(
                    error.resource,
                    f"{error.message}\n  top tracemalloc growth since the warm-up:\n{top}",
                    baseline=error.baseline,
                    final=error.final,
                    extras={**(error.extras or {}), "tracemalloc_top": allocations},
                ) from None
        self.figures["transcript_bytes"] = check_transcript(self.table, b)

    def _finish(self) -> None:
        """The last checks, over every complete window."""
        if self.error is None and window_slices(len(self.table), self.bounds):
            try:
                self._check_memory_and_transcript()
            except SoakError as error:
                self.error = error

    def _top_allocations(self) -> list[str]:
        if self._snapshot is None or not tracemalloc.is_tracing():
            return []
        stats = tracemalloc.take_snapshot().compare_to(self._snapshot, "lineno")
        return [str(stat) for stat in stats[:10]]


class _SoakQueue:
    """The soak's host: hands out the tasks until they are done or a bound broke."""

    name = "soak"

    def __init__(self, runner: SoakRunner, count: int, *, first: int = 0) -> None:
        self.runner = runner
        self.open = [runner.task(first + i) for i in range(count)]

    async def check_authorized(self) -> None:
        return None

    async def list_tasks(self) -> list[Task]:
        return [] if self.runner.error is not None else list(self.open)  # a broken bound ends the run Idle

    async def mark_done(self, task: Task) -> None:
        self.open = [t for t in self.open if t.id != task.id]

    async def aclose(self) -> None:
        return None


def _what_is_open(resource: str) -> list[str]:
    """The psleak-style extras: what is open now, so the leak can be found."""
    me = psutil.Process()
    if resource == "fds":
        return [f"fd {f.fd}: {f.path}" for f in me.open_files()] + [
            f"socket {c.fd}: {c.laddr} -> {c.raddr}" for c in me.net_connections("all")
        ]
    if resource in ("threads", "python_threads"):
        return [t.name for t in threading.enumerate()]
    if resource == "children":
        return [" ".join(c.cmdline()) for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    return []
