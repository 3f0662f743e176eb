"""`loop-harness bench endpoint` (issue 33): the inference agent's endpoint backend against a bare client on
one server, and one loop against several. Its options are refused before anything runs when they do not fit;
the agent's trace (what the bench replays) records each request whole; and the bench runs end to end against
a scripted chat-completions server, streaming and not (the real server's figures: docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from harness._cli import main
from harness.inference._endpoint import EndpointModel
from harness.inference._prompting import TOOLS
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from tests.helpers.chat_server import CALL_TOKENS, MESSAGE_TOKENS, MODEL, ChatServer

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="chat_server")
def chat_server_fixture() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.close()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["kernel", "--endpoint", "http://127.0.0.1:8080/v1"], "are the endpoint bench's"),
        (["server", "--no-stream"], "are the endpoint bench's"),
        (["endpoint", "--model", "m"], "--model and --no-stream go with --endpoint"),
        (["endpoint", "--no-stream"], "--model and --no-stream go with --endpoint"),
        (["endpoint", "--loops", "0"], "must be at least 1"),
        (["endpoint", "--tasks", "0"], "must be at least 1"),
    ],
)
def test_options_that_do_not_fit_are_refused(capsys, args, said):
    assert main(["bench", *args]) == 2
    assert said in capsys.readouterr().err


def test_a_server_that_is_not_there_is_said_before_anything_runs(capsys):
    assert main(["bench", "endpoint", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert "bench endpoint:" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [True, False])
def test_the_agent_traces_each_request_whole(chat_server, tmp_path, stream):
    """What the bench posts again from a bare client: the body as sent, the answer, the server's usage."""
    trace = tmp_path / "trace.jsonl"
    model = EndpointModel(chat_server.url, model=MODEL, stream=stream, trace=trace)
    messages = [{"role": "user", "content": "Create out/result.txt"}]

    async def steps():
        first = await model.step(messages, TOOLS, max_tokens=64, cancel=threading.Event())
        function = {"name": "write_file", "arguments": first.raw_arguments}
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                      "function": function}]}  # fmt: skip
        done = await model.step([*messages, call, {"role": "tool", "tool_call_id": "c1", "content": "ok"}], TOOLS,
                                max_tokens=64, cancel=threading.Event())  # fmt: skip
        await model._client.aclose()
        return first, done

    first, done = asyncio.run(steps())
    model._trace.close()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(line["tool"], line["text"], line["completion_tokens"]) for line in lines] == [
        ("write_file", "", CALL_TOKENS), (None, "done", MESSAGE_TOKENS)]  # fmt: skip
    assert json.loads(lines[0]["arguments"]) == {"path": "out/result.txt", "content": "result"}
    assert lines[0]["body"]["model"] == MODEL and lines[0]["body"]["stream"] is stream
    assert lines[0]["body"]["messages"][-1] == messages[-1] and lines[0]["body"]["max_tokens"] == 64
    assert lines[1]["usage"] == {"prompt_tokens": 120, "completion_tokens": MESSAGE_TOKENS, "total_tokens": 122}
    assert all(line["seconds"] >= line["ttft_s"] > 0 for line in lines)
    assert first.kind == "tool" and done.kind == "message"


@LOOP_SLOW
@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "whole-answers"])
def test_the_bench_runs_end_to_end_on_a_server(chat_server, stream):
    command = [sys.executable, "-m", "harness", "bench", "endpoint", "--endpoint", chat_server.url, "--model", MODEL,
               "--tasks", "2", "--rounds", "1", "--loops", "2", "--json",
               *([] if stream else ["--no-stream"])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["server"], figures["model"], figures["stream"]) == (chat_server.url, MODEL, stream)
    assert figures["requests_per_round"] == 4 and figures["task_terminals"] == ["Completed", "Completed"]
    assert figures["identical_outputs"] is True
    assert figures["kernel_tokens_per_s"] > 0 and figures["bare_tokens_per_s"] > 0 and figures["ratio"] > 0
    if stream:
        assert figures["kernel_ttft_ms_median"] > 0 and figures["bare_ttft_ms_median"] > 0
        assert "bare_streamed_ttft" not in figures
    else:  # nothing comes before the whole answer: the bare client streams the same bodies to time a first chunk
        assert figures["kernel_ttft_ms_median"] is None
        assert figures["bare_streamed_ttft"]["requests"] == 4 and figures["bare_streamed_ttft"]["streamed"] == 4
    one, many = figures["one_loop"], figures["n_loops"]
    assert (one["loops"], one["done"], many["loops"], many["done"]) == (1, 2, 2, 4)
    assert many["output_tokens"] == 4 * (CALL_TOKENS + MESSAGE_TOKENS)
    assert figures["loops_tasks_ratio"] > 0
    # the kernel's side, the bare one, the stream probe, one loop of 2 tasks, two loops of 2: all on the one server
    assert chat_server.served["requests"] == 4 + 4 + (0 if stream else 4) + 4 + 8
