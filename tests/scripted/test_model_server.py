"""`agent.endpoint`: the model server the agent is told to use, checked against the sandbox's network rules
before the run and recorded in `run_start` as the server described it (a real HTTP server on loopback)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import testing
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn
from tests.helpers.loopback import LoopbackServer

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
MODEL_SERVER = {"id": "model-server", "kind": "network", "hosts": ["127.0.0.1"], "decision": "allow"}


def models_server(listed: list[dict[str, object]] | str) -> LoopbackServer:
    """Answers `GET /v1/models` with `listed` (a list of entries, or raw text that is no JSON)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer = listed if isinstance(listed, str) else json.dumps({"object": "list", "data": listed})
            body = answer.encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return LoopbackServer(Handler)


@pytest.fixture(name="prompt_config")
def prompt_config_fixture(scripted_scenario, harness_config):
    """A config whose scripted agent answers one prompt, told about the model server at `url`."""

    def write(url: str, *, model: str = "qwen-coder", rules=(MODEL_SERVER,), **options) -> Path:
        command = testing.scripted_agent_command(scripted_scenario(scenario({None: [turn()]})))
        agent = {"command": command, "supports_permission_requests": True, "endpoint": {"url": url, "model": model}}
        read_all = {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"}
        return harness_config(agent=agent, rules=[read_all, *rules], **options)

    return write


def run_start(config: Path) -> dict[str, object]:
    result = testing.run_loop(config, prompt="say hello")
    assert result.terminal.value == "EndTurn", result.reason
    records = testing.assert_transcript_complete(result)
    return records[0]


def test_run_start_records_the_model_and_the_revision_the_server_reports(prompt_config):
    served = {"id": "qwen-coder", "object": "model", "digest": "sha256:5a1e", "owned_by": "me"}
    server = models_server([{"id": "other", "object": "model"}, served])
    try:
        first = run_start(prompt_config(f"{server.url}/v1/"))
    finally:
        server.close()
    endpoint = first["endpoint"]
    assert endpoint["url"] == f"{server.url}/v1"  # the trailing slash is dropped, as a base URL's is
    assert endpoint["model"] == "qwen-coder"
    assert endpoint["listed"] is True and endpoint["revision"] == "sha256:5a1e"
    assert endpoint["entry"]["owned_by"] == "me"


def test_a_model_the_server_does_not_serve_is_recorded_with_what_it_serves(prompt_config):
    server = models_server([{"id": "llama-3"}, {"id": "mistral"}])
    try:
        endpoint = run_start(prompt_config(f"{server.url}/v1"))["endpoint"]
    finally:
        server.close()
    assert endpoint["listed"] is False and endpoint["revision"] is None
    assert endpoint["served"] == ["llama-3", "mistral"]


@pytest.mark.parametrize("answer", ["down", "garbage"])
def test_a_server_that_does_not_answer_is_recorded_and_the_run_goes_on(prompt_config, answer):
    """The agent meets the server, not the kernel: the run is not refused for it, and `run_start` says why
    the model could not be described."""
    if answer == "down":
        server = models_server([])
        url = server.url
        server.close()  # nothing listens on the port now
    else:
        server = models_server("<html>not an API</html>")
        url = server.url
    try:
        endpoint = run_start(prompt_config(f"{url}/v1"))["endpoint"]
    finally:
        server.close()
    assert endpoint["listed"] is None and endpoint["revision"] is None
    assert ("ConnectError" if answer == "down" else "JSONDecodeError") in endpoint["error"]


def test_the_agent_is_told_the_endpoint_in_its_environment(scripted_scenario, harness_config, tmp_path):
    told = tmp_path / "told.txt"
    scenario_path = scripted_scenario(scenario({None: [turn()]}))
    agent_command = " ".join(testing.scripted_agent_command(scenario_path))
    # The agent writes what it was told, then becomes the scripted agent (sandbox off: it writes outside).
    command = ["bash", "-c", f'printf "%s %s" "$LOOP_HARNESS_ENDPOINT" "$LOOP_HARNESS_MODEL" > {told}; '
                             f"exec {agent_command}"]  # fmt: skip
    url = "http://127.0.0.1:9/v1"
    for env, expected in [({}, f"{url} m1"), ({"LOOP_HARNESS_MODEL": "mine"}, f"{url} mine")]:
        agent = {"command": command, "supports_permission_requests": True, "env": env,
                 "endpoint": {"url": url, "model": "m1"}}  # fmt: skip
        config = harness_config(agent=agent, sandbox={"mode": "off"})
        result = testing.run_loop(config, prompt="say hello")
        assert result.terminal.value == "EndTurn", result.reason
        assert told.read_text() == expected  # an `env` the operator wrote wins over the endpoint's


def test_a_server_the_network_rules_refuse_is_a_config_error_before_anything_runs(prompt_config, tmp_path):
    """Under the sandbox the agent reaches its server only through the proxy: a server the rules refuse
    would fail every turn, so the run is refused at once, with the rule that would allow it."""
    config = prompt_config("http://127.0.0.1:8080/v1", rules=())
    done = subprocess.run([CLI, "run", str(config), "--prompt", "hi"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "agent.endpoint.url" in done.stderr
    assert "hosts: [127.0.0.1]" in done.stderr
    assert not (tmp_path / "transcripts").exists() or not any((tmp_path / "transcripts").glob("*.jsonl"))
    # With the sandbox off the agent's own network is not the kernel's to filter: the same config runs.
    off = prompt_config("http://127.0.0.1:8080/v1", rules=(), sandbox={"mode": "off"}, name="off.yaml")
    assert testing.run_loop(off, prompt="hi").terminal.value == "EndTurn"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1/v1", "an http:// or https:// base URL"),
        ("http:///v1", "an http:// or https:// base URL"),
        ("http://user:pw@127.0.0.1/v1", "no query, fragment or credentials"),
        ("http://127.0.0.1/v1?key=1", "no query, fragment or credentials"),
    ],
)
def test_a_malformed_endpoint_is_refused_naming_its_key(prompt_config, url, message):
    config = prompt_config(url)
    done = subprocess.run([CLI, "run", str(config), "--prompt", "hi"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "agent.endpoint.url" in done.stderr and message in done.stderr, done.stderr
