"""The scripted agent as a command any ACP client can drive: `python -m scripted_agents SCENARIO`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents import ScenarioError, parse_scenario
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED


class RawClient:
    """A minimal stdlib JSON-RPC client: what an editor or another harness would be."""

    def __init__(self, scenario_path):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scripted_agents", str(scenario_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0

    def send(self, message):
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    def read(self):
        return json.loads(self.process.stdout.readline())

    def close(self):
        self.process.stdin.close()
        status = self.process.wait(timeout=10)
        self.process.stdout.close()
        self.process.stderr.close()
        return status


def test_a_raw_client_drives_a_whole_turn(scripted_scenario, tmp_path):
    path = scripted_scenario(
        scenario(
            {
                None: [
                    turn(
                        {"message": "hi"},
                        {
                            "tool_call": {
                                "id": "c1",
                                "title": "Write a.txt",
                                "kind": "edit",
                                "locations": ["a.txt"],
                                "permission": True,
                            }
                        },
                        {"write": {"path": "a.txt", "content": "a"}},
                    )
                ]
            }
        )
    )
    client = RawClient(path)
    client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {"fs": {"writeTextFile": True}}})
    init = client.read()["result"]
    assert init["protocolVersion"] == 1
    assert init["agentCapabilities"]["sessionCapabilities"] == {"close": {}}

    client.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    session = client.read()["result"]["sessionId"]
    prompt_id = client.request("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]})

    seen = []
    while True:
        message = client.read()
        seen.append(message.get("method") or ("answer" if message.get("id") == prompt_id else "?"))
        if message.get("method") == "session/request_permission":
            assert message["params"]["toolCall"]["locations"] == [{"path": str(tmp_path / "a.txt")}]
            client.send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
                }
            )
        elif message.get("method") == "fs/write_text_file":
            client.send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
        elif message.get("id") == prompt_id:
            assert message["result"] == {"stopReason": "end_turn"}
            break
    assert seen == [
        "session/update",
        "session/update",
        "session/request_permission",
        "session/update",
        "fs/write_text_file",
        "session/update",
        "answer",
    ]
    assert client.close() == 0  # exits when stdin closes


def test_unknown_methods_are_method_not_found(scripted_scenario):
    client = RawClient(scripted_scenario(scenario({None: [turn()]})))
    client.request("session/bogus", {})
    assert client.read()["error"]["code"] == -32601
    client.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tasks": []}, "tasks: a non-empty list"),
        ({"tasks": [{"turns": [{"steps": [{"teleport": 1}]}]}]}, "tasks[0].turns[0].steps[0]: unknown step 'teleport'"),
        ({"tasks": [{"turns": [{"stop": "done"}]}]}, "tasks[0].turns[0].stop: 'done' is not a stop reason"),
        ({"tasks": [{"id": "T1", "turns": [{}]}], "extra": 1}, "scenario: unknown key(s) ['extra']"),
    ],
)
def test_a_bad_scenario_names_the_bad_key(data, message):
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert message in str(error.value)


def test_a_bad_scenario_file_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [{turns: [{steps: [{teleport: 1}]}]}]\n")
    done = subprocess.run([sys.executable, "-m", "scripted_agents", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "unknown step 'teleport'" in done.stderr


def test_the_scripted_agent_fixture_gives_a_command_any_client_can_run(scripted_agent):
    command = scripted_agent(scenario({None: [turn({"message": "hi"})]}))
    done = subprocess.run(
        command,
        input=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(done.stdout.splitlines()[0])["result"]["protocolVersion"] == 1
    assert done.returncode == 0


def test_the_package_exports_what_it_lists():
    import harness

    assert sorted(harness.__all__) == sorted(harness._MODULE_OF)
    for name in harness.__all__:
        assert getattr(harness, name) is not None
