"""`agent.endpoint`: the model server the agent is told to use, checked against the sandbox's network rules
before the run and recorded in `run_start` as the server described it (a real HTTP server on loopback)."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import testing
from harness.models import LockError, ModelLock, find_lock_file
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn
from tests.helpers.loopback import LoopbackServer

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
MODEL_SERVER = {"id": "model-server", "kind": "network", "hosts": ["127.0.0.1"], "decision": "allow"}


def models_server(listed: list[dict[str, object]] | str, tags: list[dict[str, object]] | None = None) -> LoopbackServer:
    """Answers `GET /v1/models` with `listed` (a list of entries, or raw text that is no JSON), and, given
    `tags`, `GET /api/tags` as Ollama does."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer = listed if isinstance(listed, str) else json.dumps({"object": "list", "data": listed})
            if self.path == "/api/tags" and tags is not None:
                answer = json.dumps({"models": tags})
            body = answer.encode()
            self.send_response(200 if self.path == "/v1/models" or (tags and self.path == "/api/tags") else 404)
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


def test_whatever_size_the_server_answers_with_run_start_stays_whole(prompt_config):
    """A server may answer with any size: what run_start keeps of it is bounded, so the record is never
    truncated (a truncated run_start loses the fields recovery checks a marker against)."""
    huge = "x" * 1_000_000
    server = models_server([{"id": "qwen-coder", "revision": huge, "meta": {"blob": huge}, "n_ctx": 4096}])
    try:
        first = run_start(prompt_config(f"{server.url}/v1"))
    finally:
        server.close()
    assert "truncated" not in first and first["agent"] and first["limits"]
    endpoint = first["endpoint"]
    assert endpoint["revision"] == "x" * 200
    assert endpoint["entry"]["n_ctx"] == 4096 and len(endpoint["entry"]["meta"]) == 200


@pytest.mark.parametrize("url", ["http://evil.example\\@127.0.0.1/v1", "http://127.0.0.1\\x/v1"])
def test_an_endpoint_url_readers_disagree_on_is_refused(prompt_config, url):
    """Python reads the host of these as 127.0.0.1 or 127.0.0.1\\x; a WHATWG reader (Node: most agents)
    reaches evil.example: the check reads the URL as the proxy does, and refuses what it cannot read one way."""
    config = prompt_config(url)
    done = subprocess.run([CLI, "run", str(config), "--prompt", "hi"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "agent.endpoint.url" in done.stderr, done.stderr
    assert "backslash" in done.stderr or "credentials" in done.stderr, done.stderr  # the config or the check


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


DIGEST = "sha256:" + "5a1e" * 16


@pytest.fixture(name="models_lock")
def models_lock_fixture(tmp_path, monkeypatch):
    """A models.lock with the shipped models and `[endpoints.*]` entries, found through LOOP_HARNESS_MODELS_LOCK."""

    def write(endpoints: str) -> Path:
        lock = tmp_path / "models.lock"
        lock.write_text(f"{find_lock_file().read_text()}\n{endpoints}")
        monkeypatch.setenv("LOOP_HARNESS_MODELS_LOCK", str(lock))
        return lock

    return write


def pinned_run(prompt_config, server: LoopbackServer, pin: str, **options):
    config = prompt_config(f"{server.url}/v1", **options)
    data = yaml.safe_load(config.read_text())
    data["agent"]["endpoint"]["pin"] = pin
    config.write_text(yaml.safe_dump(data))
    result = testing.run_loop(config, prompt="say hello")
    return result, testing.assert_transcript_complete(result)


@pytest.mark.parametrize(
    ("entry", "pinned", "why"),
    [
        ({"digest": DIGEST}, f'digest = "{DIGEST}"', None),
        ({"revision": "abc123"}, 'revision = "abc123"', None),
        ({}, "", None),  # the name alone is pinned: a server that reports no revision is taken on its name
        ({"digest": "sha256:" + "0" * 64}, f'digest = "{DIGEST}"', f"at sha256:{'0' * 64}, not the pinned {DIGEST}"),
        ({}, 'revision = "abc123"', "reports no revision or digest for 'qwen-coder', so the pinned abc123 cannot"),
    ],
)
def test_a_pinned_model_runs_only_where_the_server_serves_it_as_pinned(prompt_config, models_lock, entry, pinned, why):
    models_lock(f'[endpoints.coder]\nmodel = "qwen-coder"\n{pinned}\nsource = "Qwen/Qwen2.5-Coder-7B-Instruct"\n')
    server = models_server([{"id": "qwen-coder", **entry}])
    try:
        result, records = pinned_run(prompt_config, server, "coder")
    finally:
        server.close()
    if why is None:
        assert result.terminal.value == "EndTurn", result.reason
        return
    assert result.terminal.value == "BlockedPrecondition"
    assert result.reason["check"] == "model_server" and result.reason["pin"] == "coder"
    assert why in result.reason["detail"], result.reason["detail"]
    assert not [r for r in records if r["type"] == "agent_start"], "an agent was started on a model not pinned"


def test_ollamas_digest_is_read_from_its_own_api(prompt_config, models_lock):
    """Ollama's OpenAI API lists no digest: `/api/tags` does, without its `sha256:` prefix."""
    models_lock(f'[endpoints.coder]\nmodel = "qwen-coder:7b"\ndigest = "{DIGEST}"\n')
    server = models_server([{"id": "qwen-coder:7b", "owned_by": "library"}],
                           tags=[{"name": "qwen-coder:7b", "digest": DIGEST.removeprefix("sha256:")}])  # fmt: skip
    try:
        result, records = pinned_run(prompt_config, server, "coder", model="qwen-coder:7b")
    finally:
        server.close()
    assert result.terminal.value == "EndTurn", result.reason
    assert records[0]["endpoint"]["revision"] == DIGEST


def test_a_pin_that_names_no_entry_is_a_config_error(prompt_config, models_lock, tmp_path):
    lock = models_lock('[endpoints.coder]\nmodel = "qwen-coder"\n')
    config = prompt_config("http://127.0.0.1:9/v1")
    data = yaml.safe_load(config.read_text())
    data["agent"]["endpoint"]["pin"] = "coderr"
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "LOOP_HARNESS_MODELS_LOCK": str(lock)}
    done = subprocess.run([CLI, "run", str(config), "--prompt", "hi"], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip
    assert done.returncode == 2
    assert "agent.endpoint.pin" in done.stderr and "no [endpoints.coderr] entry (known: coder)" in done.stderr


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('model = "m"\ndigest = "sha256:abc"', "endpoints.e.digest = 'sha256:abc' is not sha256:<64 lowercase hex>"),
        ('revision = "r"', "endpoints.e.model is missing"),
        ('model = "m"\nrevison = "r"', "unknown keys ['revison']"),
        ('model = ""', "endpoints.e.model must be non-empty text"),
    ],
)
def test_a_malformed_endpoint_entry_names_its_key(models_lock, entry, message):
    lock = models_lock(f"[endpoints.e]\n{entry}\n")
    with pytest.raises(LockError, match=re.escape(message)):
        ModelLock.load(lock)
