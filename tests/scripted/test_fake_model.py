"""`loop-harness fake-model responses|messages --script FILE` as a real process, talked to over real HTTP on
loopback with a raw httpx client: the URL it prints, the streamed replies with their tool calls event by event,
`--requests`, SIGTERM and SIGINT, a malformed script refused before anything listens; and the script format and
the plugin's fixtures in-process."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.fake_model._messages import replies_of as messages_replies
from harness.fake_model._responses import replies_of as responses_replies
from harness.fake_model._script import ScriptError, load_script
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")

#: One script for both APIs: a reply that says something and runs a command, a generic tool call, then done.
SCRIPT = """\
- - say: Running the tests.
  - shell: python3 -m pytest -q
- - tool: Write
    input: {file_path: notes.txt, content: "ok\\n"}
- - say: All done.
"""


@contextmanager
def fake_model(api: str, script: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`loop-harness fake-model API --script SCRIPT` running, with the URL it printed first; killed if the test
    left it running."""
    process = subprocess.Popen([CLI, "fake-model", api, "--script", str(script), *options],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        url = process.stdout.readline().strip() if ready else ""
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def stop(process: subprocess.Popen[str], how: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
    """Send `how`; the exit status and stderr once it has exited."""
    process.send_signal(how)
    _, stderr = process.communicate(timeout=30)
    return process.returncode, stderr


def events(client: httpx.Client, url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """POST `body` and read the answer as server-sent events, in order: (event name, data)."""
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream"
        found, name = [], None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name  # each event is named by its type, as both APIs do
                found.append((name, data))
    return found


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- the Responses API (Codex) -------------------------------------------------------------------------------------

CODEX_TOOLS = [{"type": "function", "name": "shell_command"}, {"type": "function", "name": "apply_patch"}]


def test_the_responses_cli_streams_the_script_with_its_tool_calls_and_keeps_every_request(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_model("responses", write(tmp_path / "s.yaml", SCRIPT), "--requests", str(log)) as (process, url):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url), url
        sent = [{"model": "m", "stream": True, "tools": CODEX_TOOLS, "input": [{"role": "user", "content": c}]}
                for c in ("first", "second", "third", "past the end")]  # fmt: skip
        with httpx.Client(timeout=10) as client:
            answers = [events(client, f"{url}/responses", body) for body in sent]
            assert client.get(f"{url}/models").json() == {"models": [], "data": []}
        code, stderr = stop(process)
    assert code == 0, stderr
    first, second, third, past = answers
    assert [name for name, _ in first] == ["response.created", "response.output_item.done",
                                           "response.output_item.done", "response.completed"]  # fmt: skip
    assert first[0][1]["response"]["id"] == "resp_1" and first[-1][1]["response"]["id"] == "resp_1"
    said, call = first[1][1]["item"], first[2][1]["item"]
    assert said == {"type": "message", "role": "assistant", "id": "msg_1",
                    "content": [{"type": "output_text", "text": "Running the tests."}]}  # fmt: skip
    # the shell tool the request offers, with its own argument shape and an id of its own
    assert call == {"type": "function_call", "call_id": "call_1_2", "name": "shell_command",
                    "arguments": json.dumps({"command": "python3 -m pytest -q"})}  # fmt: skip
    assert [name for name, _ in second] == ["response.created", "response.output_item.done", "response.completed"]
    assert second[1][1]["item"] == {"type": "function_call", "call_id": "call_2_1", "name": "Write",
                                    "arguments": json.dumps({"file_path": "notes.txt", "content": "ok\n"})}  # fmt: skip
    assert third[1][1]["item"]["content"] == [{"type": "output_text", "text": "All done."}]
    # past the script: an empty message, which ends the turn
    assert past[1][1]["item"]["content"] == [{"type": "output_text", "text": ""}]
    assert past[-1][1]["response"]["usage"]["total_tokens"] == 15
    kept = [json.loads(line) for line in log.read_text().splitlines()]
    assert kept == [{"method": "POST", "path": "/v1/responses", "body": body} for body in sent]


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        ({"type": "function", "name": "shell_command"},
         {"type": "function_call", "call_id": "call_1_1", "name": "shell_command",
          "arguments": json.dumps({"command": "ls -la"})}),
        ({"type": "function", "name": "exec_command"},
         {"type": "function_call", "call_id": "call_1_1", "name": "exec_command",
          "arguments": json.dumps({"cmd": "ls -la"})}),
        ({"type": "function", "name": "shell"},
         {"type": "function_call", "call_id": "call_1_1", "name": "shell",
          "arguments": json.dumps({"command": ["bash", "-lc", "ls -la"]})}),
        ({"type": "local_shell"},
         {"type": "local_shell_call", "call_id": "call_1_1", "status": "completed",
          "action": {"type": "exec", "command": ["bash", "-lc", "ls -la"]}}),
    ],
    ids=["shell_command", "exec_command", "shell", "local_shell"],
)  # fmt: skip
def test_a_shell_item_calls_whichever_shell_tool_codex_offers(fake_responses, offered, expected):
    api = fake_responses([[{"shell": "ls -la"}]])
    with httpx.Client(timeout=10) as client:
        answer = events(client, f"{api.url}/responses", {"tools": [offered]})
    assert [name for name, _ in answer] == ["response.created", "response.output_item.done", "response.completed"]
    assert answer[1][1]["item"] == expected
    assert api.requests == [{"tools": [offered]}] and api.errors == []


def test_a_request_offering_no_shell_tool_is_answered_400_saying_so(fake_responses):
    api = fake_responses([[{"shell": "ls"}]])
    answer = httpx.post(f"{api.url}/responses", json={"tools": [{"type": "function", "name": "apply_patch"}]})
    assert answer.status_code == 400
    assert "offers no shell tool" in answer.json()["error"]["message"]
    assert api.errors == ["LookupError: the request offers no shell tool: ['apply_patch']"]
    assert len(api.requests) == 1  # kept all the same: what the adapter sent is what a test reads


def test_codex_outputs_are_read_from_the_next_requests(fake_responses):
    api = fake_responses([[{"shell": "echo hi"}], [{"say": "done"}]])
    offered = {"tools": CODEX_TOOLS}
    follow = {**offered, "input": [{"type": "function_call_output", "call_id": "call_1_1", "output": "hi\n"},
                                   {"type": "custom_tool_call_output", "output": {"text": "x"}}]}  # fmt: skip
    with httpx.Client(timeout=10) as client:
        events(client, f"{api.url}/responses", offered)
        events(client, f"{api.url}/responses", follow)
    assert api.outputs() == ["hi\n", json.dumps({"text": "x"})]


# --- the Messages API (Claude Code) ----------------------------------------------------------------------------------

CLAUDE_TOOLS = [{"name": "Bash", "input_schema": {}}, {"name": "Write", "input_schema": {}}]


def test_the_messages_cli_streams_the_script_with_its_tool_calls_and_keeps_every_request(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_model("messages", write(tmp_path / "s.yaml", SCRIPT), "--requests", str(log)) as (process, url):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url  # ANTHROPIC_BASE_URL: no /v1
        turn = {
            "model": "claude-x",
            "stream": True,
            "tools": CLAUDE_TOOLS,
            "messages": [{"role": "user", "content": "go"}],
        }
        aside = {"model": "claude-haiku", "stream": True, "messages": [{"role": "user", "content": "a title?"}]}
        with httpx.Client(timeout=10) as client:
            first = events(client, f"{url}/v1/messages", turn)
            side = events(client, f"{url}/v1/messages", aside)  # no Bash offered: not the agent's turn
            counted = client.post(f"{url}/v1/messages/count_tokens", json=turn).json()
            second = events(client, f"{url}/v1/messages", turn)
            whole = client.post(f"{url}/v1/messages", json={**turn, "stream": False}).json()
            past = events(client, f"{url}/v1/messages", turn)
        code, stderr = stop(process, signal.SIGINT)  # Ctrl-C stops it as cleanly as SIGTERM
    assert code == 0, stderr
    assert [(name, data.get("index")) for name, data in first] == [
        ("message_start", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    assert first[0][1]["message"]["model"] == "claude-x" and first[0][1]["message"]["content"] == []
    assert first[1][1]["content_block"] == {"type": "text", "text": ""}
    assert first[2][1]["delta"] == {"type": "text_delta", "text": "Running the tests."}
    bash = {"command": "python3 -m pytest -q", "description": "Run the script"}
    assert first[4][1]["content_block"] == {"type": "tool_use", "id": "toolu_01_02", "name": "Bash", "input": {}}
    assert [first[5][1]["delta"], first[6][1]["delta"]] == [
        {"type": "input_json_delta", "partial_json": ""},
        {"type": "input_json_delta", "partial_json": json.dumps(bash)},
    ]
    assert first[8][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # a side request gets a short text and leaves the script where it was
    assert [d["delta"]["text"] for n, d in side if n == "content_block_delta"] == ["ok"]
    assert side[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert counted == {"input_tokens": 10}
    assert second[1][1]["content_block"] == {"type": "tool_use", "id": "toolu_02_01", "name": "Write", "input": {}}
    assert json.loads(second[3][1]["delta"]["partial_json"]) == {"file_path": "notes.txt", "content": "ok\n"}
    # unstreamed, the same reply as one message
    assert whole["content"] == [{"type": "text", "text": "All done."}] and whole["stop_reason"] == "end_turn"
    # past the script: an empty text, which ends the turn
    assert [d["delta"]["text"] for n, d in past if n == "content_block_delta"] == [""]
    assert past[-2][1]["delta"]["stop_reason"] == "end_turn"
    kept = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(k["method"], k["path"], k["turn"]) for k in kept] == [
        ("POST", "/v1/messages", True), ("POST", "/v1/messages", False), ("POST", "/v1/messages/count_tokens", False),
        ("POST", "/v1/messages", True), ("POST", "/v1/messages", True), ("POST", "/v1/messages", True),
    ]  # fmt: skip
    assert [k["body"] for k in kept] == [turn, aside, turn, turn, {**turn, "stream": False}, turn]


def test_claude_outputs_are_read_from_its_turns(fake_messages):
    api = fake_messages([[{"shell": "echo hi"}], [{"say": "done"}]])
    result = {"type": "tool_result", "tool_use_id": "toolu_01_01", "content": [{"type": "text", "text": "hi\n"}]}
    later = {"tools": CLAUDE_TOOLS, "messages": [{"role": "user", "content": [result]}]}
    with httpx.Client(timeout=10) as client:
        client.post(f"{api.url}/v1/messages", json={"tools": CLAUDE_TOOLS, "messages": []})
        client.post(f"{api.url}/v1/messages", json=later)
        client.post(f"{api.url}/v1/messages", json=later)  # a later turn repeats the conversation
    assert api.outputs() == ["hi\n"]
    assert len(api.turns()) == 3 and api.errors == []


# --- the script --------------------------------------------------------------------------------------------------


def test_one_script_plays_on_both_apis(tmp_path):
    script = load_script(write(tmp_path / "s.yaml", SCRIPT))
    assert [[item.kind for item in reply] for reply in script.replies] == [["say", "shell"], ["tool"], ["say"]]
    blocks = messages_replies(script)
    assert blocks[0][1] == {"type": "tool_use", "id": "toolu_01_02", "name": "Bash",
                            "input": {"command": "python3 -m pytest -q", "description": "Run the script"}}  # fmt: skip
    items = responses_replies(script)
    assert items[1][0]({}) == {"type": "function_call", "call_id": "call_2_1", "name": "Write",
                               "arguments": json.dumps({"file_path": "notes.txt", "content": "ok\n"})}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("- - sya: hello\n", "reply 1, item 1, key sya: unknown key"),
        ("- - say: hi\n- - shell: ls\n    say: also\n",
         "reply 2, item 1: an item has exactly one of say, shell or tool (got say, shell)"),
        ("- - say: hi\n- - tool: Write\n    input: [1]\n",
         "reply 2, item 1, key input: Input should be a valid dictionary"),
        ("- - say: x\n    input: {}\n", "reply 1, item 1: input goes with tool only"),
        ("- - shell: ''\n", "reply 1, item 1, key shell: String should have at least 1 character"),
        ("- - say: hi\n- []\n", "reply 2: an empty reply"),
        ("- - say: hi\n- say: flat\n", "reply 2: not a list of items (got dict)"),
        ("- - hello\n", "reply 1, item 1: not a mapping (got str)"),
        ("replies: []\n", "not a list of replies (got dict)"),
        ("[]\n", "no replies"),
        ("", "empty"),
        ("- - say: [unclosed\n", "not YAML"),
    ],
    ids=["unknown-key", "two-kinds", "input-not-mapping", "input-without-tool", "empty-command", "empty-reply",
         "reply-not-list", "item-not-mapping", "not-a-list", "no-replies", "empty-file", "not-yaml"],
)  # fmt: skip
def test_a_bad_script_is_refused_naming_the_reply_the_item_and_the_key(tmp_path, text, named):
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ScriptError) as refused:
        load_script(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert named in str(refused.value)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_cli_refuses_a_malformed_script_with_exit_2_before_it_listens(tmp_path, api):
    path = write(tmp_path / "bad.yaml", "- - say: fine\n- - shell: ls\n    timeout: 5\n")
    done = subprocess.run([CLI, "fake-model", api, "--script", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""  # no URL: nothing listens
    assert f"fake-model: {path}: reply 2, item 1, key timeout: unknown key" in done.stderr


def test_the_cli_refuses_a_missing_script_with_exit_2(tmp_path):
    done = subprocess.run([CLI, "fake-model", "responses", "--script", str(tmp_path / "none.yaml")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "cannot read the script" in done.stderr


def test_the_cli_listens_on_the_port_asked_and_exits_0_on_sigterm(tmp_path):
    with fake_model("messages", write(tmp_path / "s.yaml", SCRIPT)) as (process, url):
        port = int(url.rsplit(":", 1)[1])
    with fake_model("messages", write(tmp_path / "s.yaml", SCRIPT), "--port", str(port)) as (process, url):
        assert url == f"http://127.0.0.1:{port}"
        answer = httpx.post(f"{url}/v1/messages", json={"tools": CLAUDE_TOOLS, "messages": []}, timeout=10)
        assert answer.json()["content"][0] == {"type": "text", "text": "Running the tests."}
        code, stderr = stop(process)
    assert code == 0, stderr
    assert f"the messages API on {url}, 3 replies" in stderr
    with pytest.raises(httpx.ConnectError):  # gone: nothing listens after the signal
        httpx.post(f"{url}/v1/messages", json={}, timeout=5)
