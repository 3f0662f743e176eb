"""`loop-harness bench server`: loops at once in one control server vs one loop alone, and the API's latency.

A real `loop-harness serve` on a loopback port; N workspaces, each with the scripted agent writing a file
per task under out/. First one loop drains its queue alone, then N loops drain theirs at once; the figure is
the aggregate tasks/s of N against one (the ratio), with `GET .../loop` and `POST .../loop/steering` timed
from a client the whole time (median and 95th percentile, idle and under load). Last, the N workspaces are
activated to keep draining (every `every_s`) with nothing left to do: the server's CPU while they wait,
against the same server with no loop, and the queue listings (host calls) they make per hour.
Figures, not asserts: a shared machine is noisy.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from ..testing import OUT_RULES, make_workspace, write_yaml

__all__ = ["bench_server"]

_SCENARIO = {"tasks": [{"turns": [{"steps": [
    {"tool_call": {"title": "Write out/result.txt", "kind": "edit", "locations": ["out/result.txt"],
                   "permission": True}},
    {"write": {"path": "out/result.txt", "content": "result\n"}},
]}]}]}  # fmt: skip


def bench_server(*, loops: int = 4, tasks: int = 100, as_json: bool = False, every_s: float = 1.0,
                 idle_s: float = 10.0) -> int:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-server-") as tmp:
        root = Path(tmp)
        server = subprocess.Popen([sys.executable, "-m", "harness", "serve", "--port", "0", "--state",
                                   str(root / "state")], stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert server.stderr is not None
            url = re.search(r"(http://\S+)", server.stderr.readline())
            if url is None:
                print("bench server: the server did not start", file=sys.stderr)
                return 1
            token = (root / "state" / "token").read_text().strip()
            with httpx.Client(base_url=url.group(1), headers={"Authorization": f"Bearer {token}"},
                              timeout=30) as client:  # fmt: skip
                scenario = write_yaml(root / "scenario.yaml", _SCENARIO)
                ids = [_workspace(client, root / f"ws{i}", scenario, tasks) for i in range(loops + 1)]
                client.put("/api/autonomy", json={"enabled": True}).raise_for_status()
                idle = _latencies(client, ids[0], seconds=1.0)
                alone = _drain(client, ids[:1])
                probe = threading.Thread(target=lambda: under_load.extend(_latencies(client, ids[1], until=done)))
                steer = threading.Thread(target=lambda: steering.extend(_steering(client, ids[-1], until=done)))
                under_load: list[float] = []
                steering: list[float] = []
                done = threading.Event()
                probe.start()
                steer.start()
                together = _drain(client, ids[1:])
                done.set()
                probe.join()
                steer.join()
                waiting = _idle_cost(client, psutil.Process(server.pid), ids[1:], every_s, idle_s)
        finally:
            server.terminate()
            server.wait(timeout=30)
            if server.stderr is not None:
                server.stderr.close()
    figures = {
        "loops": loops,
        "tasks_per_loop": tasks,
        "one_loop_tasks_per_s": round(tasks / alone, 1),
        "n_loops_tasks_per_s": round(loops * tasks / together, 1),
        "ratio": round((loops * tasks / together) / (tasks / alone), 2),
        "api_ms_idle": _percentiles(idle),
        "api_ms_under_load": _percentiles(under_load),
        "steering_ms_under_load": _percentiles(steering),
        "steering_posts": len(steering),
        **waiting,
    }
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"one loop: {figures['one_loop_tasks_per_s']} tasks/s; {loops} loops at once: "
              f"{figures['n_loops_tasks_per_s']} tasks/s in aggregate (ratio {figures['ratio']})")  # fmt: skip
        print(f"GET /loop: idle {figures['api_ms_idle']} ms, under load {figures['api_ms_under_load']} ms; "
              f"POST /loop/steering under load {figures['steering_ms_under_load']} ms (median, p95)")  # fmt: skip
        print(f"keep draining every {every_s} s, nothing to do: {loops} waiting loops cost the server "
              f"{figures['waiting_cpu_percent']}% CPU against {figures['no_loop_cpu_percent']}% with none "
              f"({figures['waiting_cpu_percent_per_workspace']}% per workspace), "
              f"{figures['host_calls_per_hour_per_workspace']} queue listings an hour per workspace")  # fmt: skip
    return 0


def _workspace(client: httpx.Client, root: Path, scenario: Path, tasks: int) -> str:
    ws = make_workspace(root, ignore=["out/"])
    queue = {"provider": "memory", "tasks": [{"id": f"T{i}", "title": f"task {i}"} for i in range(1, tasks + 1)]}
    made = client.post("/api/workspaces", json={"path": str(ws.path), "host": queue, "policy": {"rules": OUT_RULES}})
    made.raise_for_status()
    workspace_id = str(made.json()["id"])
    client.put(f"/api/workspaces/{workspace_id}/agent/binding",
               json={"module": "scripted", "scenario": str(scenario)}).raise_for_status()  # fmt: skip
    return workspace_id


def _drain(client: httpx.Client, ids: list[str]) -> float:
    started = time.perf_counter()
    for workspace_id in ids:
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True}).raise_for_status()
    for workspace_id in ids:
        while True:
            status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
            if status["state"] == "ended":
                if status["terminal"] != "Idle":
                    raise RuntimeError(f"a loop ended {status['terminal']}: {status['reason']}")
                break
            time.sleep(0.05)
    return time.perf_counter() - started


def _latencies(client: httpx.Client, workspace_id: str, *, seconds: float = 0.0,
               until: threading.Event | None = None) -> list[float]:  # fmt: skip
    times: list[float] = []
    deadline = time.monotonic() + seconds
    while (until is not None and not until.is_set()) or (until is None and time.monotonic() < deadline):
        started = time.perf_counter()
        client.get(f"/api/workspaces/{workspace_id}/loop").raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
        time.sleep(0.02)
    return times


def _steering(client: httpx.Client, workspace_id: str, *, until: threading.Event) -> list[float]:
    """POST steering while the loop drains (a 409 between sessions is timed too: the same work)."""
    times: list[float] = []
    while not until.is_set():
        started = time.perf_counter()
        answer = client.post(f"/api/workspaces/{workspace_id}/loop/steering", json={"text": "mind the tests"})
        if answer.status_code in (202, 409):
            times.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)
    return times


def _idle_cost(client: httpx.Client, server: psutil.Process, ids: list[str], every_s: float,
               seconds: float) -> dict[str, Any]:  # fmt: skip
    """The server's CPU over `seconds` with no loop, then with each workspace kept draining an empty queue."""
    baseline = _cpu_over(server, seconds)
    for workspace_id in ids:
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                   json={"active": True, "keep_draining": {"every_s": every_s}}).raise_for_status()  # fmt: skip
    for workspace_id in ids:  # each first runs a session that skips its completed tasks, then waits
        while client.get(f"/api/workspaces/{workspace_id}/loop").json()["state"] != "waiting":
            time.sleep(0.05)
    before = [client.get(f"/api/workspaces/{w}/loop").json()["checks"] for w in ids]
    waiting = _cpu_over(server, seconds)
    after = [client.get(f"/api/workspaces/{w}/loop").json()["checks"] for w in ids]
    for workspace_id in ids:
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False}).raise_for_status()
    listings = sum(a - b for a, b in zip(after, before, strict=True)) / len(ids)
    return {
        "no_loop_cpu_percent": round(baseline, 2),
        "waiting_cpu_percent": round(waiting, 2),
        "waiting_cpu_percent_per_workspace": round((waiting - baseline) / len(ids), 3),
        "host_calls_per_hour_per_workspace": round(listings / seconds * 3600),
    }


def _cpu_over(process: psutil.Process, seconds: float) -> float:
    """The process's CPU (user + system, its threads) over `seconds`, in percent of one core."""
    start = process.cpu_times()
    time.sleep(seconds)
    end = process.cpu_times()
    return (end.user + end.system - start.user - start.system) / seconds * 100


def _percentiles(values: list[float]) -> list[Any]:
    if len(values) < 2:
        return [round(values[0], 1) if values else None, None]
    return [round(statistics.median(values), 1), round(statistics.quantiles(values, n=20)[-1], 1)]
