"""`loop-harness soak --loops N [--agent inference --endpoint URL|llama-cpp-server]`: several kernel loops at
once against one model server, with aggregate and per-loop tasks/s and completion tokens/s (issue 33).

The options are refused before anything runs when they do not fit together; the throughput is counted from
the kernel's own `task_end` records (the agent's ACP usage); and a real two-loop soak of the inference agent on
a chat-completions server (a stateless fake on loopback that reports its usage) adds up to exactly what the
server reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from acp.schema import Usage

from harness._cli import main
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.record._results import TaskResult
from harness.record._terminals import Terminal
from harness.testing import Endpoint
from soak import Bounds, SoakRunner
from soak._report import summary
from soak._throughput import LoopCount, aggregate, output_tokens, rate
from tests.helpers.chat_server import CALL_TOKENS, MESSAGE_TOKENS, MODEL, ChatServer

pytestmark = LOOP_SCRIPTED


# --- the options, refused before anything runs ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--endpoint", "http://127.0.0.1:8080/v1"], "--endpoint is the inference agent's model server: give --agent"),
        (["--agent", "inference", "--model", "m"], "--model and --endpoint-args go with --endpoint"),
        (["--agent", "inference", "--endpoint-args=--no-stream"], "--model and --endpoint-args go with --endpoint"),
        (["--agent", "inference", "--endpoint", "llama-cpp-server", "--model", "m"], "leave --model out"),
        (["--agent", "inference", "--endpoint", "ftp://host/v1"], "a base URL (http://HOST:PORT/v1)"),
        (["--agent", "inference", "--endpoint", "127.0.0.1:8080"], "a base URL (http://HOST:PORT/v1)"),
        (["--loops", "0"], "--loops and --threads must be at least 1"),
        (["--threads", "0"], "--loops and --threads must be at least 1"),
        (["--loops", "3", "--tasks", "200"], "200 tasks over 3 loops (66 a loop) check nothing"),
        (["--loops", "3", "--tasks", "200"], "drain at least 210 tasks"),
        (["--loops", "4", "--tasks", "3", "--warmup", "1", "--window", "2"], "drain at least 20 tasks"),
        (["--count-only", "--warmup", "5"], "--count-only judges no bound"),
        (["--count-only", "--inject", "fd"], "--count-only judges no bound"),
    ],
)
def test_options_that_do_not_fit_together_are_refused_before_anything_runs(capsys, tmp_path, args, said):
    assert main(["soak", *args]) == 2
    out, err = capsys.readouterr()
    assert said in err and out == ""


def test_the_endpoint_options_pass_when_they_fit():
    from soak._cli import _endpoint_options

    assert _endpoint_options("inference", "http://gpu-box:8000/v1", "coder", ["--no-stream"]) is None
    assert _endpoint_options("inference", "llama-cpp-server", None, ["--read-timeout", "600"]) is None
    assert _endpoint_options("scripted", None, None, []) is None


def test_each_loop_is_judged_on_its_share_and_the_kernel_on_them_all():
    bounds = Bounds(warmup=5, window=7)
    assert bounds.shortest() == 19
    assert bounds.too_short(37, 2) is not None and bounds.too_short(37, 1) is None  # 18 and 19: one is short
    assert bounds.too_short(38, 2) is None
    assert bounds.for_loops(1) is bounds
    assert (bounds.for_loops(3).warmup, bounds.for_loops(3).window) == (15, 21)
    runner = SoakRunner(tasks=41, loops=3, bounds=Bounds(warmup=1, window=2))
    assert [(loop.first, loop.tasks) for loop in runner.loops] == [(0, 14), (14, 14), (28, 13)]
    with pytest.raises(ValueError, match="give agent='inference'"):
        SoakRunner(tasks=100, endpoint=Endpoint("http://127.0.0.1:1/v1"))
    with pytest.raises(ValueError, match="3 loops need at least 1 task each"):
        SoakRunner(tasks=2, loops=3, bounds=bounds)


@LOOP_SLOW
def test_a_count_only_soak_of_any_length_drains_and_counts_each_loop(capsys, tmp_path):
    assert main(["soak", "--tasks", "5", "--loops", "2", "--count-only", "--json", "--report", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["passed"], report["judged"], report["terminals"]) == (True, False, {"Completed": 5})
    assert report["figures"] == {}  # nothing judged, not even the kernel's counters at the end
    assert [(loop["loop"], loop["tasks"], loop["done"]) for loop in report["per_loop"]] == [(1, 3, 3), (2, 2, 2)]
    assert report["throughput"]["done"] == 5 and report["throughput"]["output_tokens"] is None  # scripted: no usage
    summary_md = (tmp_path / "summary.md").read_text()
    assert "# Soak: drained, no bound judged" in summary_md and "| 2 | 2 of 2 |" in summary_md


@LOOP_SLOW
def test_counting_only_a_task_that_stops_its_run_is_counted_and_its_loop_goes_on(capsys, tmp_path):
    """T1 goes round until the kernel's iterations run out (MaxIterations stops loop 1's run); counting only,
    loop 1 goes on with T2 in a new run, and every task is counted with its terminal. Judged, it is a failure."""
    from harness.testing import scripted_agent_command, write_yaml
    from scripted_agents.presets import turn, write_turn

    scenario = write_yaml(tmp_path / "agent.yaml", {"tasks": [
        {"id": "T1", "turns": [turn(stop="max_tokens")]},
        {"turns": [write_turn("out/result.txt", "result\n")]},
    ]})  # fmt: skip
    command = ["soak", "--tasks", "4", "--loops", "2", "--json", "--agent-command",
               " ".join(scripted_agent_command(scenario))]  # fmt: skip
    assert main([*command, "--count-only"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["terminals"] == {"MaxIterations": 1, "Completed": 3}
    assert [(loop["done"], loop["terminals"]) for loop in report["per_loop"]] == [
        (2, {"MaxIterations": 1, "Completed": 1}), (2, {"Completed": 2})]  # fmt: skip
    assert main([*command, "--warmup", "1", "--window", "2", "--tasks", "10"]) == 1
    judged = json.loads(capsys.readouterr().out)
    assert judged["error"]["resource"] == "loop 1 run"
    assert "loop 1's run ended MaxIterations after 0 of 5 tasks" in judged["error"]["message"]


# --- the arithmetic, on the records the kernel writes ----------------------------------------------------------


def task_end(tokens: dict[str, Any] | None, terminal: Terminal = Terminal.COMPLETED) -> dict[str, Any]:
    """A `task_end` record as the kernel writes it (`TaskResult.to_json`), with the agent's ACP usage as the
    kernel keeps it (`model_dump(by_alias=True, exclude_none=True)`)."""
    result = TaskResult(id="T1", title="t", terminal=terminal, reason={"kind": "end_turn"}, rule_ids=[],
                        iterations=1, tokens=tokens, seconds=1.0)  # fmt: skip
    return {"type": "task_end", **result.to_json()}


def usage(output: int) -> dict[str, Any]:
    return Usage(input_tokens=300, output_tokens=output, total_tokens=300 + output).model_dump(
        by_alias=True, exclude_none=True
    )


def test_tokens_are_the_agents_reported_completion_tokens_and_none_when_it_reported_none():
    assert output_tokens(task_end(usage(17))) == 17
    assert output_tokens(task_end({"used": 900, "size": 4096})) is None  # a usage_update's context, not tokens
    assert output_tokens(task_end(None)) is None


def test_loops_add_up_over_the_wall_time_not_their_own_rates():
    first, second, silent = LoopCount(1, 3), LoopCount(2, 2), LoopCount(3, 1)
    for tokens, at in [(17, 1.0), (20, 2.0), (23, 4.0)]:
        first.count(task_end(usage(tokens)), at)
    second.count(task_end(usage(30)), 3.0)
    second.count(task_end(usage(10), Terminal.IDLE), 5.0)
    silent.count(task_end({"used": 1, "size": 2}), 0.5)
    assert first.figures() == {"loop": 1, "tasks": 3, "done": 3, "seconds": 4.0, "tasks_per_second": 0.75,
                               "output_tokens": 60, "tokens_per_second": 15.0,
                               "terminals": {"Completed": 3}}  # fmt: skip
    assert second.figures()["tokens_per_second"] == 8.0
    assert second.figures()["terminals"] == {"Completed": 1, "Idle": 1}
    assert silent.figures()["output_tokens"] is None and silent.figures()["tokens_per_second"] is None
    together = aggregate([first, second, silent], 5.0)
    # 6 tasks and 100 tokens in 5 s: not 0.75 + 0.4 + 2 tasks/s, the sum of rates over different spans
    assert together == {"loops": 3, "done": 6, "seconds": 5.0, "tasks_per_second": 1.2, "output_tokens": 100,
                        "tokens_per_second": 20.0, "tasks_with_tokens": 5}  # fmt: skip
    assert aggregate([silent], 0.5)["output_tokens"] is None
    assert rate(2, 3) == 0.667 and rate(4120, 100) == 41.2 and rate(1, 0) is None


# --- a real two-loop soak on one server -------------------------------------------------------------------------


@pytest.fixture(name="chat_server")
def chat_server_fixture() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.close()


@LOOP_SLOW
def test_two_loops_on_one_server_count_what_the_server_reported(chat_server):
    # In-process the kernel is this pytest worker, whose peak (every module the suite loaded) is not the soak's;
    # a 5-task loop's windows are 2 tasks, whose slopes only a leak's steady growth would hold.
    bounds = Bounds(warmup=1, window=2, kernel_peak_ceiling=float(1 << 40), tracemalloc_slope=64 * 1024)
    endpoint = Endpoint(chat_server.url, MODEL)
    result = SoakRunner(tasks=10, loops=2, agent="inference", endpoint=endpoint, bounds=bounds).run()

    assert result.passed, result.error
    assert result.terminals == {"Completed": 10}
    served = chat_server.served
    assert served["requests"] == 20 and served["completion_tokens"] == 10 * (CALL_TOKENS + MESSAGE_TOKENS)
    report = summary(result)
    assert report["loops"] == 2 and report["endpoint"] == {"url": chat_server.url, "model": MODEL}
    loops, total = report["per_loop"], report["throughput"]
    assert [(loop["loop"], loop["tasks"], loop["done"]) for loop in loops] == [(1, 5, 5), (2, 5, 5)]
    assert [loop["output_tokens"] for loop in loops] == [5 * (CALL_TOKENS + MESSAGE_TOKENS)] * 2
    assert total["output_tokens"] == served["completion_tokens"] and total["tasks_with_tokens"] == 10
    assert total["done"] == 10 and total["seconds"] == max(loop["seconds"] for loop in loops)
    # (the figures' seconds are rounded to 10 ms, their rates to 3 significant figures)
    assert total["tasks_per_second"] == pytest.approx(10 / total["seconds"], rel=0.01)
    assert total["tokens_per_second"] == pytest.approx(served["completion_tokens"] / total["seconds"], rel=0.01)
    for loop in loops:
        assert loop["tokens_per_second"] == pytest.approx(loop["output_tokens"] / loop["seconds"], rel=0.01)
        # each loop's own agent and transcript were judged on its own tasks
        assert loop["figures"]["agent_rss"]["checked"] and loop["figures"]["transcript_bytes"]["checked"]
    # the kernel process: its memory over both loops' tasks, its counters back once both had ended
    assert report["figures"]["kernel_rss"]["checked"]
    counters = report["figures"]["kernel_counters"]
    assert counters["checked"] and counters["before"] == counters["after"]
