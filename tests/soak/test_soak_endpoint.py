"""The soak's loops on a real model server (issue 33): `loop-harness soak --agent inference --endpoint
llama-cpp-server --loops 2` starts llama-cpp-python's OpenAI-compatible server on the pinned GGUF, drains its
tasks with two kernel loops at once against it, and reports each loop's and the aggregate tasks/s and
completion tokens/s (the server's `usage`, as the agent reports it per task).

A LoopInference case (it needs the pinned model and minutes of CPU), beside the soak it exercises. A few tasks
are too few to judge a bound, so the run counts only (`--count-only`); the bounds per loop are proven on a
scripted server in tests/scripted/test_soak_loops.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.pytest_plugin import LOOP_INFERENCE

pytestmark = LOOP_INFERENCE


def test_two_loops_on_llama_cpp_server_report_each_loop_and_the_aggregate(request, tmp_path):
    # the model-server pass of the tier (`make test-endpoint`), not the in-process one: minutes of a server's CPU
    if not request.config.getoption("--loop-endpoint"):
        pytest.skip("runs with --loop-endpoint (make test-endpoint), the pass that tests model servers")
    request.getfixturevalue("harness_model")
    command = [sys.executable, "-m", "harness", "soak", "--agent", "inference", "--endpoint", "llama-cpp-server",
               "--loops", "2", "--tasks", "4", "--count-only", "--json", "--report", str(tmp_path / "report"),
               # one thread: two spin against any other busy process (a request took 10-50 times as long); a
               # request through llama-cpp-python's server takes seconds here: two model steps a turn
               "--threads", "1", "--endpoint-args=--max-steps 2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "report/report.json").read_text())["per_loop"] == summary["per_loop"]
    assert (tmp_path / "report/llama-cpp-server.log").exists()  # the server's log, beside the report

    # every task ended and was counted, whatever its terminal: through this server the pinned model often ends
    # a task MaxIterations (counting only, its loop goes on in a new run)
    assert summary["loops"] == 2 and sum(summary["terminals"].values()) == 4, summary["terminals"]
    assert summary["endpoint"]["url"].startswith("http://127.0.0.1:") and summary["endpoint"]["model"] == "local"
    loops, total = summary["per_loop"], summary["throughput"]
    assert [(loop["loop"], loop["tasks"], loop["done"]) for loop in loops] == [(1, 2, 2), (2, 2, 2)]
    for loop in loops:  # every task's completion tokens, as the server reported them
        assert loop["output_tokens"] > 0 and loop["tokens_per_second"] > 0 and loop["tasks_per_second"] > 0
    assert total["output_tokens"] == sum(loop["output_tokens"] for loop in loops)
    assert total["tasks_with_tokens"] == 4 and total["done"] == 4
    assert total["seconds"] == max(loop["seconds"] for loop in loops)
    assert total["tasks_per_second"] == pytest.approx(4 / total["seconds"], rel=0.01)
    assert "2 loop(s) at once on `http://127.0.0.1:" in (tmp_path / "report/summary.md").read_text()
