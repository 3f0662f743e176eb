"""`loop-harness bench kernel`: the kernel's overhead over a bare ACP SDK client.

Both sides drain the same scripted queue against the same scripted agent
(one process per side): per task a session, a tool call with a permission
request, an `fs/write_text_file` and an `fs/read_text_file`. The kernel side
has the policy, preconditions (a `git status` per task boundary) and the
transcript on; the bare side answers everything "allow" and writes the file.
Both timings include spawning the agent. Figures, not asserts: a shared
2-core machine is noisy, so read the ratio.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    FileSystemCapabilities,
    ReadTextFileResponse,
    RequestPermissionResponse,
    WriteTextFileResponse,
)

from ..config._config import load_config
from ..kernel._kernel import Kernel
from ..link._transport import agent_environment
from ..record._terminals import Terminal
from ..testing import OUT_RULES, loop_config, make_workspace, write_yaml

__all__ = ["bench_kernel"]

BENCH_SCENARIO = {
    "tasks": [
        {
            "turns": [
                {
                    "steps": [
                        {
                            "tool_call": {
                                "title": "Write out/result.txt",
                                "kind": "edit",
                                "locations": ["out/result.txt"],
                                "permission": True,
                            }
                        },
                        {"write": {"path": "out/result.txt", "content": "result\n"}},
                        {"read": {"path": "out/result.txt", "expect": "result\n"}},
                    ]
                }
            ]
        }
    ]
}
BENCH_RULES = OUT_RULES


def bench_kernel(*, tasks: int = 300, rounds: int = 3, as_json: bool = False) -> int:
    """Drain `tasks` tasks through each side, alternating, `rounds` times; report the medians."""
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-") as tmp:
        root = Path(tmp)
        # out/ is ignored by git, so the tree stays clean between tasks and no task commits.
        workspace = make_workspace(root / "ws", ignore=["out/"])
        scenario = write_yaml(root / "scenario.yaml", BENCH_SCENARIO)
        queue = [{"id": f"T{i}", "title": f"bench task {i}"} for i in range(tasks)]
        config_path = write_yaml(
            root / "loop.yaml",
            loop_config(workspace, scenario, tasks=queue, rules=BENCH_RULES, transcripts=str(root / "runs")),
        )
        start_ms = _agent_start_ms(scenario, runs=21)
        kernel_times, bare_times = [], []
        for _ in range(rounds):
            kernel_s, transcript_bytes = asyncio.run(_time_kernel(config_path, tasks))
            kernel_times.append(kernel_s)
            bare_times.append(asyncio.run(_time_bare(scenario, workspace.path, tasks)))
    kernel_s = statistics.median(kernel_times)
    bare_s = statistics.median(bare_times)
    figures = {
        "tasks": tasks,
        "rounds": rounds,
        "kernel_tasks_per_s": round(tasks / kernel_s, 1),
        "bare_sdk_tasks_per_s": round(tasks / bare_s, 1),
        "ratio": round(bare_s / kernel_s, 3),
        "kernel_ms_per_task": round(kernel_s / tasks * 1000, 2),
        "bare_sdk_ms_per_task": round(bare_s / tasks * 1000, 2),
        "transcript_bytes_per_task": transcript_bytes // tasks,
        "scripted_agent_start_ms_median": round(start_ms, 1),
    }
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"tasks per side and round: {tasks}, rounds: {rounds} (medians below)")
        print(f"kernel (policy, preconditions, transcript): {figures['kernel_tasks_per_s']:>8} tasks/s")
        print(f"bare SDK client (none of them):             {figures['bare_sdk_tasks_per_s']:>8} tasks/s")
        print(f"ratio kernel / bare:   {figures['ratio']}")
        print(f"transcript:            {figures['transcript_bytes_per_task']} bytes/task")
        print(f"scripted agent spawn + initialize: {figures['scripted_agent_start_ms_median']} ms (median of 21)")
    return 0


def _agent_start_ms(scenario: Path, *, runs: int) -> float:
    """Median wall time from spawning the scripted agent to its `initialize` answer."""
    request = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "scripted_agents", str(scenario)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=agent_environment(),
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(request.encode() + b"\n")
        process.stdin.flush()
        answer = json.loads(process.stdout.readline())
        times.append((time.perf_counter() - start) * 1000)
        process.stdin.close()
        process.wait()
        if answer.get("result", {}).get("protocolVersion") != 1:
            raise RuntimeError(f"unexpected initialize answer: {answer}")
    return statistics.median(times)


async def _time_kernel(config_path: Path, tasks: int) -> tuple[float, int]:
    kernel = Kernel(load_config(config_path))
    start = time.perf_counter()
    result = await kernel.run()
    elapsed = time.perf_counter() - start
    done = [t for t in result.tasks if t.terminal is Terminal.COMPLETED and t.iterations > 0]  # run, not skipped
    if result.terminal is not Terminal.IDLE or len(done) != tasks:
        raise RuntimeError(f"the kernel side did not drain the queue: {result.to_json()}")
    return elapsed, result.transcript.stat().st_size


class _AllowAll:
    """The bare client: every permission allowed, files written and read directly."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kwargs: Any) -> Any:
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id))

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> Any:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
        return WriteTextFileResponse()

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> Any:
        return ReadTextFileResponse(content=Path(path).read_text())

    def on_connect(self, conn: Any) -> None:
        return None


async def _time_bare(scenario: Path, workspace: Path, tasks: int) -> float:
    start = time.perf_counter()
    async with spawn_agent_process(
        _AllowAll(),  # type: ignore[arg-type]
        sys.executable,
        "-m",
        "scripted_agents",
        str(scenario),
        env=agent_environment(),
        transport_kwargs={"stderr": subprocess.DEVNULL},
    ) as (conn, _process):
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=True, write_text_file=True)
            ),
        )
        for i in range(tasks):
            session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
            response = await conn.prompt(session_id=session.session_id, prompt=[text_block(f"bench task {i}")])
            if response.stop_reason != "end_turn":
                raise RuntimeError(f"the bare side's task {i} ended {response.stop_reason}")
            await conn.close_session(session_id=session.session_id)  # as the kernel does, per task
    return time.perf_counter() - start
