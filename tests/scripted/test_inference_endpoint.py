"""The inference agent on an OpenAI-compatible endpoint (issue 33): a scripted chat-completions server on
loopback stands in for the model, and the real agent process runs under the kernel (sandbox on: it reaches the
server through the kernel's proxy, a network rule allowing 127.0.0.1).

A tool call streamed in fragments is permitted and carried out; a cancel mid-stream closes the HTTP request
(the server sees its client go); a server that is down, answers 500 or answers garbage ends the run `Failed`
(`agent_error`) with the cause in the reason, the transcript complete and valid; the model's name and
revision are reported in `initialize`. Below those, the backend in-process: its parsing, its budget, and the
two renderings of one history (the local one exactly as the agent wrote it before it kept a history).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Terminal, read_transcript, testing
from harness.inference._endpoint import EndpointModel
from harness.inference._model import StepError
from harness.inference._prompting import (
    NOT_CARRIED_OUT,
    NOT_JSON,
    TOOLS,
    chatml_messages,
    openai_messages,
    system_prompt,
)
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

MODEL, REVISION = "fake-coder", "0123456789abcdef0123456789abcdef01234567"
RULES = [
    {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
    {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"},
    {"id": "model-server", "kind": "network", "hosts": ["127.0.0.1"], "decision": "allow"},
]
TASK = {"id": "T1", "title": "Write a greeting", "body": "Create the file out/hello.txt containing the word hello."}
HELLO = {"path": "out/hello.txt", "content": "hello"}

# --- a scripted OpenAI chat-completions server ------------------------------------------------------------

Reply = Callable[["_Handler", "FakeChat"], None]


class FakeChat:
    """`POST {url}/chat/completions` answered by the next reply of the script (then a plain "done" message);
    `GET {url}/models` lists the model with a revision and a context size. `requests` keeps every chat request
    body; `streaming` is set once a reply has started streaming, `closed` once a waiting reply saw its client
    go."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.streaming = threading.Event()
        self.closed = threading.Event()
        fake = self

        class Handler(_Handler):
            chat = fake

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    chat: FakeChat

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_error(404)
            return
        entry = {"id": MODEL, "object": "model", "owned_by": "test", "revision": REVISION, "max_model_len": 8192}
        self.answer(200, json.dumps({"object": "list", "data": [entry]}).encode(), "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.chat.requests.append(body)
        reply = self.chat.replies.pop(0) if self.chat.replies else sse(text_chunks("done"))
        reply(self, self.chat)

    def answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0, no length: the body ends when the connection closes

    def log_message(self, *args: object) -> None:
        pass


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def tool_chunks(name: str, arguments: dict[str, Any], *, fragments: int = 4, call_id: str = "call_srv_1",
                usage: tuple[int, int] | None = (321, 17)) -> list[dict[str, Any]]:  # fmt: skip
    """A tool call as servers stream it: the name first, then the arguments in `fragments` pieces."""
    raw = json.dumps(arguments)
    size = -(-len(raw) // fragments)
    head = {"role": "assistant", "tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}  # fmt: skip
    pieces = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": raw[i : i + size]}}]})
              for i in range(0, len(raw), size)]  # fmt: skip
    tail = [chunk(finish="tool_calls")]
    if usage is not None:
        tail.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                              "total_tokens": sum(usage)}})  # fmt: skip
    return [chunk(head), *pieces, *tail]


def raw_call(name: str, arguments: str) -> list[dict[str, Any]]:
    """A tool call whose arguments are this text, whatever it is."""
    head = {"tool_calls": [{"index": 0, "id": "call_raw", "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}  # fmt: skip
    return [chunk(head), chunk(finish="tool_calls")]


def text_chunks(text: str, *, finish: str = "stop", usage: tuple[int, int] | None = (400, 3)) -> list[dict[str, Any]]:
    words = [w + " " for w in text.split(" ")]
    words[-1] = words[-1].rstrip()
    out = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": w}) for w in words), chunk(finish=finish)]
    if usage is not None:
        out.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    return out


def sse(chunks: list[dict[str, Any]], *, done: bool = True) -> Reply:
    def reply(handler: _Handler, chat: FakeChat) -> None:
        handler.start_stream()
        for piece in chunks:
            handler.wfile.write(f"data: {json.dumps(piece)}\n\n".encode())
            handler.wfile.flush()
        if done:
            handler.wfile.write(b"data: [DONE]\n\n")

    return reply


def raw(status: int, body: bytes, content_type: str) -> Reply:
    return lambda handler, chat: handler.answer(status, body, content_type)


def raw_stream(text: bytes) -> Reply:
    def reply(handler: _Handler, chat: FakeChat) -> None:
        handler.start_stream()
        handler.wfile.write(text)

    return reply


def json_body(message: dict[str, Any], finish: str, usage: tuple[int, int] = (300, 20)) -> Reply:
    answer = {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
              "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}  # fmt: skip
    return raw(200, json.dumps(answer).encode(), "application/json")


def stream_then_wait(handler: _Handler, chat: FakeChat) -> None:
    """Starts a message, then waits (SSE comments, as servers ping) until the client closes the connection."""
    handler.start_stream()
    handler.wfile.write(f"data: {json.dumps(chunk({'role': 'assistant', 'content': 'Let me'}))}\n\n".encode())
    handler.wfile.flush()
    chat.streaming.set()
    deadline = time.monotonic() + 60
    sock = handler.connection
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.05)
        try:
            if readable and not sock.recv(1, socket.MSG_PEEK):  # the request was read whole: this is its end
                break
            handler.wfile.write(b": waiting\n\n")
            handler.wfile.flush()
        except OSError:
            break
    else:
        return
    chat.closed.set()


@pytest.fixture(name="fake_chat")
def fake_chat_fixture() -> Iterator[Callable[[list[Reply]], FakeChat]]:
    started: list[FakeChat] = []

    def start(replies: list[Reply]) -> FakeChat:
        started.append(FakeChat(replies))
        return started[-1]

    yield start
    for chat in started:
        chat.close()


def endpoint_config(tmp_path: Path, url: str, *, sandbox: str | None = None, name: str = "loop.yaml") -> Path:
    """A run of one task by the inference agent on `url` (`agent.endpoint`: the kernel tells the agent)."""
    workspace = testing.make_workspace(tmp_path / "ws", ignore=["out/"])
    agent = {"command": [sys.executable, "-m", "harness", "agent", "inference", "--read-timeout", "20"],
             "supports_permission_requests": True, "endpoint": {"url": url, "model": MODEL}}  # fmt: skip
    config = testing.loop_config(workspace, agent=agent, tasks=[TASK], rules=RULES,
                                 limits={"turn_timeout_s": 60, "cancel_grace_s": 10},
                                 transcripts=str(tmp_path / "transcripts"),
                                 **({"sandbox": {"mode": sandbox}} if sandbox else {}))  # fmt: skip
    return testing.write_yaml(tmp_path / name, config)


def answered(result: Any, method: str) -> list[dict[str, Any]]:
    """The agent's answers to the kernel's requests of `method`."""
    records = read_transcript(result.transcript)
    ids = {r["msg"]["id"] for r in records if r["type"] == "rpc" and r["dir"] == "out"
           and r["msg"].get("method") == method}  # fmt: skip
    return [r["msg"] for r in records if r["type"] == "rpc" and r["dir"] == "in" and "method" not in r["msg"]
            and r["msg"].get("id") in ids]  # fmt: skip


def updates(result: Any, kind: str) -> list[dict[str, Any]]:
    return [r["msg"]["params"]["update"] for r in read_transcript(result.transcript)
            if r["type"] == "rpc" and r["msg"].get("method") == "session/update"
            and r["msg"]["params"]["update"]["sessionUpdate"] == kind]  # fmt: skip


# --- the agent under the kernel -----------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["stream", "json-body"])
def test_a_tool_call_streamed_in_fragments_is_permitted_and_carried_out(fake_chat, run_loop, tmp_path, answer):
    """Streamed, the call's arguments come in fragments; a server that answers one JSON body although a stream
    was asked for is read the same way."""
    if answer == "stream":
        first = sse(tool_chunks("write_file", HELLO, fragments=5))
    else:
        call = {
            "id": "call_srv_1",
            "type": "function",
            "function": {"name": "write_file", "arguments": json.dumps(HELLO)},
        }
        first = json_body({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls", (321, 17))
    chat = fake_chat([first, sse(text_chunks("I wrote out/hello.txt."))])

    result = run_loop(endpoint_config(tmp_path, chat.url))

    assert result.terminal is Terminal.IDLE, result.reason
    assert [(t.id, t.terminal) for t in result.tasks] == [("T1", Terminal.COMPLETED)]
    written = testing.records(result, "policy", source="fs/write_text_file")
    assert [r["rule_ids"] for r in written] == [["write-out"]]
    assert (Path(written[0]["path"])).read_text() == "hello"
    # the model's call went through the permission request, decided by a rule
    asked = testing.records(result, "policy", source="session/request_permission")
    assert [(r["decision"], r["rule_ids"]) for r in asked] == [("allow", ["write-out"])]
    # through the kernel's proxy, as the rule allows
    egress = testing.records(result, "egress", rule_ids=["model-server"])
    assert egress and all(r["allowed"] for r in egress)

    # the server was sent real OpenAI messages: the call with its id, then its result as a `tool` message
    assert len(chat.requests) == 2
    first_request, second = chat.requests
    assert first_request["model"] == MODEL and first_request["stream"] is True
    assert first_request["stream_options"] == {"include_usage": True}
    assert first_request["tool_choice"] == "auto" and first_request["temperature"] == 0
    offered = [t["function"]["name"] for t in first_request["tools"]]
    assert offered[: len(TOOLS)] == list(TOOLS)  # its own tools first, then the host's (get_issue, ...)
    assert [m["role"] for m in first_request["messages"]] == ["system", "user"]
    made = {"id": "call_srv_1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(HELLO)}}
    assert second["messages"][2:] == [
        {"role": "assistant", "content": "", "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "call_srv_1", "content": "wrote 5 characters to out/hello.txt"},
    ]

    # usage is the server's, and the context size the one it reported (max_model_len)
    assert [u["used"] for u in updates(result, "usage_update")] == [321, 400]
    assert {u["size"] for u in updates(result, "usage_update")} == {8192}
    usage = testing.records(result, "usage")[0]
    assert (usage["usage"]["inputTokens"], usage["usage"]["outputTokens"]) == (721, 20)
    assert usage["meta"]["loopHarness"]["modelLoads"] == 0
    assert usage["meta"]["loopHarness"]["steps"] == 2


def test_a_cancel_mid_stream_closes_the_http_request(fake_chat, run_loop, tmp_path):
    chat = fake_chat([stream_then_wait])
    kernel: dict[str, Any] = {}
    waiting: list[asyncio.Task[None]] = []

    async def cancel_once_streaming() -> None:
        if await asyncio.to_thread(chat.streaming.wait, 30):
            kernel["k"].cancel()

    def observe(record: dict[str, Any]) -> None:
        if record["type"] == "rpc" and record["msg"].get("method") == "session/prompt" and not waiting:
            waiting.append(asyncio.get_running_loop().create_task(cancel_once_streaming()))

    started = time.monotonic()
    result = run_loop(endpoint_config(tmp_path, chat.url), setup=lambda k: kernel.setdefault("k", k),
                      observer=observe)  # fmt: skip

    assert result.terminal is Terminal.CANCELLED, result.reason
    assert result.reason["agent_stop_reason"] == "cancelled"
    assert result.reason["killed"] is False  # the agent answered the cancel itself, within the grace
    assert chat.closed.wait(10), "the server never saw the agent close the streamed request"
    assert time.monotonic() - started < 30
    assert [a["result"]["stopReason"] for a in answered(result, "session/prompt")] == ["cancelled"]


@pytest.fixture(name="dead_port")
def dead_port_fixture():
    """A port bound and never listened on, for the whole test: a connection to it is refused, and no other test
    can take it meanwhile (a port freed again could be bound by a server of another test's)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("sandbox", [None, "off"])
def test_a_server_that_is_down_fails_the_run_with_the_cause(run_loop, tmp_path, sandbox, dead_port):
    """Nothing listens on the port. Direct (sandbox off) the agent's connection is refused; under the sandbox the
    kernel's proxy is refused it and answers 400, which the agent reports with the proxy's words."""
    url = f"http://127.0.0.1:{dead_port}/v1"

    started = time.monotonic()
    result = run_loop(endpoint_config(tmp_path, url, sandbox=sandbox))

    assert time.monotonic() - started < 30  # never a hang
    assert result.terminal is Terminal.FAILED, result.reason
    assert result.reason["kind"] == "agent_error" and result.reason["request"] == "session/prompt"
    message = result.reason["message"]
    if sandbox == "off":
        assert f"connection refused to {url}/chat/completions" in message
    else:
        assert f"HTTP 400 from POST {url}/chat/completions" in message and "Connect call failed" in message
    assert result.reason["data"]["model"] == {"name": MODEL, "endpoint": url, "revision": None}
    assert [(t.id, t.terminal) for t in result.tasks] == [("T1", Terminal.FAILED)]
    testing.assert_transcript_valid(result.transcript)


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        (raw(500, b'{"error": {"message": "CUDA out of memory"}}', "application/json"),
         'HTTP 500 from POST {url}/chat/completions: {"error": {"message": "CUDA out of memory"}}'),
        (raw(200, b"<html><body>502 Bad Gateway</body></html>", "text/html"),
         "the answer from {url}/chat/completions is not JSON: '<html><body>502 Bad Gateway"),
        (raw_stream(b"data: <html>oops</html>\n\n"), "malformed event from {url}/chat/completions"),
        (sse(text_chunks("cut short")[:2], done=False),
         "the stream from {url}/chat/completions ended without a finish_reason after 2 events"),
    ],
    ids=["status-500", "not-json", "malformed-event", "no-finish"],
)  # fmt: skip
def test_a_server_answering_an_error_or_garbage_fails_the_run_with_the_cause(fake_chat, run_loop, tmp_path, reply,
                                                                             cause):  # fmt: skip
    chat = fake_chat([reply])

    result = run_loop(endpoint_config(tmp_path, chat.url))

    assert result.terminal is Terminal.FAILED, result.reason
    assert result.reason["kind"] == "agent_error", result.reason
    assert cause.replace("{url}", chat.url) in result.reason["message"]
    assert result.reason["message"].startswith("model backend: ")
    records = testing.assert_transcript_complete(result)  # complete, numbered, every line valid
    assert records[-1]["reason"]["message"] == result.reason["message"]
    assert testing.records(result, "task_end")[0]["terminal"] == "Failed"


# --- the agent by hand: what it reports -----------------------------------------------------------------------


def initialize(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    command = [sys.executable, "-m", "harness", "agent", "inference", *args]
    done = subprocess.run(command, input=json.dumps(request) + "\n", capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines, done.stderr
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in lines)
    return dict(json.loads(lines[0])["result"])


def test_the_model_name_and_revision_are_reported_in_initialize(fake_chat):
    chat = fake_chat([])

    # from the environment, as the kernel passes agent.endpoint; the model is the one the server lists
    told = initialize([], {"LOOP_HARNESS_ENDPOINT": chat.url})
    assert told["agentInfo"]["name"] == "loop-harness-inference"
    assert told["agentInfo"]["title"] == f"loop-harness inference agent ({MODEL})"
    assert told["_meta"]["loopHarness"]["model"] == {"name": MODEL, "endpoint": chat.url, "revision": REVISION}

    # the flags win over the environment; a model the server does not list has no revision to report
    flagged = initialize(["--endpoint", chat.url + "/", "--model", "other"],
                         {"LOOP_HARNESS_ENDPOINT": "http://127.0.0.1:9/v1", "LOOP_HARNESS_MODEL": MODEL})  # fmt: skip
    assert flagged["_meta"]["loopHarness"]["model"] == {"name": "other", "endpoint": chat.url, "revision": None}


def test_an_endpoint_agent_loads_no_model():
    """No GGUF is resolved (the model cache is empty) and llama_cpp is never imported."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['harness', 'agent', 'inference', '--endpoint', 'http://127.0.0.1:9/v1']\n"
        "try:\n    runpy.run_module('harness', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp was imported'\n"
        "sys.stderr.write('no llama_cpp\\n')\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "LOOP_HARNESS_MODEL_CACHE": "/nonexistent"}
    done = subprocess.run([sys.executable, "-c", probe], input="", capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "no llama_cpp" in done.stderr


# --- the backend in-process ---------------------------------------------------------------------------------


def step(url: str, *, history: list[dict[str, Any]] | None = None, max_tokens: int = 100, stream: bool = True,
         cancel: threading.Event | None = None) -> Any:  # fmt: skip
    model = EndpointModel(url, model=MODEL, stream=stream, read_timeout=10)
    messages = history or [{"role": "user", "content": "Create out/hello.txt"}]

    async def play() -> Any:
        try:
            return await model.step(messages, TOOLS, max_tokens=max_tokens, cancel=cancel or threading.Event())
        finally:
            if model._client is not None:
                await model._client.aclose()

    return asyncio.run(play())


@pytest.mark.parametrize(
    ("reply", "kind", "why"),
    [
        (sse(text_chunks("a long answer", finish="length")), "length", None),
        (sse(raw_call("write_file", '{"path": "out/a.txt", "content": ')), "invalid", NOT_JSON),
        (sse(tool_chunks("write_file", {"path": "out/a.txt"})), "invalid", "Those arguments lack content."),
        (sse(tool_chunks("write_file", {"path": 7, "content": "x"})), "invalid", "The argument path must be a string."),
        (sse(tool_chunks("delete_everything", {})), "invalid", "There is no tool named 'delete_everything'."),
        (sse(tool_chunks("write_file", HELLO, usage=(50, 500))), "length", None),  # a server ignoring max_tokens
    ],
    ids=["finish-length", "not-json", "missing-key", "wrong-type", "unknown-tool", "over-budget"],
)  # fmt: skip
def test_what_a_step_makes_of_an_answer(fake_chat, reply, kind, why):
    chat = fake_chat([reply])
    made = step(chat.url)
    assert made.kind == kind
    if why is not None:
        assert made.why_invalid == why


def test_usage_falls_back_to_counting_chunks_and_timings_are_kept(fake_chat):
    chat = fake_chat([sse(tool_chunks("write_file", HELLO, fragments=6, usage=None))])
    made = step(chat.url)
    assert (made.kind, made.tool, made.arguments, made.call_id) == ("tool", "write_file", HELLO, "call_srv_1")
    assert made.completion_tokens == 7  # the chunks that carried the call: its name, then six fragments
    assert (
        made.prompt_tokens
        == len(json.dumps(openai_messages([{"role": "user", "content": "Create out/hello.txt"}]))) // 4
    )
    assert made.ttft_s > 0 and made.decode_s >= 0


def test_no_stream_asks_for_a_whole_answer(fake_chat):
    call = {"id": "c9", "type": "function", "function": {"name": "finish", "arguments": {"summary": "ok"}}}
    chat = fake_chat([json_body({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")])
    made = step(chat.url, stream=False)
    assert chat.requests[0]["stream"] is False and "stream_options" not in chat.requests[0]
    assert (made.kind, made.tool, made.arguments) == ("tool", "finish", {"summary": "ok"})  # an object, not text
    assert (made.prompt_tokens, made.completion_tokens) == (300, 20)


def test_a_cancel_in_process_closes_the_connection(fake_chat):
    chat = fake_chat([stream_then_wait])
    cancel = threading.Event()
    threading.Thread(target=lambda: chat.streaming.wait(10) and cancel.set(), daemon=True).start()
    made = step(chat.url, cancel=cancel)
    assert made.kind == "cancelled"
    assert chat.closed.wait(10)


def test_a_spent_budget_asks_nothing(fake_chat):
    chat = fake_chat([])
    assert step(chat.url, max_tokens=0).kind == "length"
    assert chat.requests == []


def test_a_read_timeout_is_a_step_error_not_a_hang(fake_chat):
    def silent(handler: _Handler, chat: FakeChat) -> None:
        handler.start_stream()
        time.sleep(3)

    chat = fake_chat([silent])
    model = EndpointModel(chat.url, model=MODEL, read_timeout=0.5)

    async def play() -> None:
        try:
            await model.step([{"role": "user", "content": "hi"}], TOOLS, max_tokens=10, cancel=threading.Event())
        finally:
            assert model._client is not None
            await model._client.aclose()

    with pytest.raises(StepError, match=r"no data from .* for 0.5 s"):
        asyncio.run(play())


# --- one history, two renderings ----------------------------------------------------------------------------

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Task T1: Write a greeting\n\nCreate out/hello.txt"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {
        "name": "write_file", "arguments": '{"path": "out/hello.txt"'}}]},
    {"role": "tool", "tool_call_id": "a", "name": "write_file", "content": "Those arguments are not valid JSON.",
     "invalid": True},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "type": "function", "function": {
        "name": "write_file", "arguments": '{"path": "out/hello.txt", "content": "hello"}'}}]},
    {"role": "tool", "tool_call_id": "b", "name": "write_file", "content": "wrote 5 characters to out/hello.txt"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "run_command", "arguments": '{"command": "rm -rf /"}'}}]},
    {"role": "user", "content": "Continue without waiting for input."},
    {"role": "assistant", "content": "Done."},
]  # fmt: skip


def test_the_local_rendering_is_the_chatml_the_agent_always_wrote():
    assert chatml_messages(HISTORY, TOOLS) == [
        {"role": "system", "content": system_prompt(TOOLS)},
        {"role": "user", "content": "Task T1: Write a greeting\n\nCreate out/hello.txt"},
        {"role": "assistant", "content": 'functions.write_file:\n{"path": "out/hello.txt"'},
        {"role": "user", "content": "Those arguments are not valid JSON."},
        {"role": "assistant", "content": 'functions.write_file:\n{"path": "out/hello.txt", "content": "hello"}'},
        {"role": "user", "content": "Result of write_file: wrote 5 characters to out/hello.txt"},
        {"role": "assistant", "content": 'functions.run_command:\n{"command": "rm -rf /"}'},
        {"role": "user", "content": "Continue without waiting for input."},
        {"role": "assistant", "content": "message:\nDone."},
    ]


def test_the_endpoint_rendering_answers_every_call_and_drops_orphans():
    wire = openai_messages(HISTORY[2:])  # a window that cut call `a` away from its result
    roles = [(m["role"], m.get("tool_call_id")) for m in wire]
    assert roles == [("system", None), ("assistant", None), ("tool", "b"), ("assistant", None), ("tool", "c"),
                     ("user", None), ("assistant", None)]  # fmt: skip
    assert wire[4]["content"] == NOT_CARRIED_OUT  # refused or cancelled: the turn ended before a result
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in wire)


def test_a_call_id_the_history_holds_already_is_not_reused():
    from harness.inference._agent import _history_id

    assert _history_id(HISTORY, "call_0") == "call_0"  # the server's, kept
    fresh = _history_id(HISTORY, "b")  # a server that numbers each answer's calls from 0 again
    assert fresh != "b" and len(fresh) == 9 and fresh.isalnum()
    assert len(_history_id(HISTORY, None)) == 9
