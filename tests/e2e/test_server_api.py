"""The control server's API against a real server on loopback: auth, the autonomy switch, workspaces, bad
input on every endpoint (typed 4xx, nothing changed), and state that survives kill -9."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from harness.pytest_plugin import LOOP_E2E
from harness.testing import make_workspace

pytestmark = LOOP_E2E

ENDPOINTS = [("GET", "/api/autonomy"), ("PUT", "/api/autonomy"), ("GET", "/api/workspaces"),
             ("POST", "/api/workspaces"), ("GET", "/api/workspaces/abc")]  # fmt: skip
MEMORY_HOST = {"provider": "memory", "tasks": [{"id": "T1", "title": "Greet"}]}
POLICY = {"rules": [{"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"}]}


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize("token", ["", "not-the-token"], ids=["none", "wrong"])
def test_every_endpoint_needs_the_token(server, method, path, token):
    with server.client(token=token) as client:
        answer = client.request(method, path, json={"enabled": True})
    assert answer.status_code == 401 and answer.json()["error"]["kind"] == "unauthorized"
    assert answer.headers["www-authenticate"] == "Bearer"


def test_another_origin_is_refused_even_with_the_token(server):
    with server.client(Origin="http://evil.example") as client:
        answer = client.get("/api/autonomy")
    assert answer.status_code == 403 and answer.json()["error"]["kind"] == "origin_refused"
    with server.client(Origin=server.url) as client:
        assert client.get("/api/autonomy").status_code == 200


def test_the_token_is_made_once_and_kept_owner_only(server):
    assert len(server.token) >= 40
    assert (server.state / "token").stat().st_mode & 0o077 == 0


def test_autonomy_is_off_and_needs_a_host_connection_to_enable(server, tmp_path):
    with server.client() as client:
        assert client.get("/api/autonomy").json() == {"enabled": False}
        refused = client.put("/api/autonomy", json={"enabled": True})
        assert refused.status_code == 409 and refused.json()["error"]["kind"] == "no_host_connection"
        assert client.get("/api/autonomy").json() == {"enabled": False}

        bare = make_workspace(tmp_path / "bare")  # registered with no host: still not enough
        assert client.post("/api/workspaces", json={"path": str(bare.path), "policy": POLICY}).status_code == 201
        assert client.put("/api/autonomy", json={"enabled": True}).status_code == 409

        hosted = make_workspace(tmp_path / "hosted")
        made = client.post("/api/workspaces", json={"path": str(hosted.path), "host": MEMORY_HOST, "policy": POLICY})
        assert made.status_code == 201, made.text
        assert client.put("/api/autonomy", json={"enabled": True}).json() == {"enabled": True}
        assert client.put("/api/autonomy", json={"enabled": False}).json() == {"enabled": False}


def test_a_workspace_is_registered_listed_and_read(server, tmp_path):
    ws = make_workspace(tmp_path / "one")
    with server.client() as client:
        made = client.post("/api/workspaces", json={"path": str(ws.path), "host": MEMORY_HOST, "policy": POLICY})
        body = made.json()
        assert made.status_code == 201 and body["path"] == str(ws.path) and body["has_host_connection"] is True
        assert body["host"]["tasks"] == [{"id": "T1", "title": "Greet"}]
        assert client.get(f"/api/workspaces/{body['id']}").json() == body
        assert client.get("/api/workspaces").json() == {"workspaces": [body]}


BAD = [
    ("PUT", "/api/autonomy", {"json": {"enabled": "yes"}}, 422, "invalid"),
    ("PUT", "/api/autonomy", {"json": {"enabled": True, "more": 1}}, 422, "invalid"),
    ("PUT", "/api/autonomy", {"content": b"{not json"}, 400, "not_json"),
    ("PUT", "/api/autonomy", {"json": [True]}, 400, "not_an_object"),
    ("PUT", "/api/autonomy", {"content": b" " * 70_000}, 413, "too_large"),
    ("PUT", "/api/autonomy", {"content": (b" " * 8192 for _ in range(100))}, 413, "too_large"),  # chunked
    ("PUT", "/api/autonomy", {"content": b"[" * 60_000}, 400, "not_json"),  # nested past the recursion limit
    ("POST", "/api/workspaces", {"json": {"path": "relative/ws"}}, 422, "invalid"),
    ("POST", "/api/workspaces", {"json": {"path": "/nonexistent/ws"}}, 422, "not_a_worktree"),
    ("POST", "/api/workspaces", {"json": {"path": "WS/src"}}, 422, "not_a_worktree"),
    ("POST", "/api/workspaces", {"json": {"path": "WS", "policy": {"rules": [{"id": "r", "kind": "read",
     "paths": ["**"], "decision": "maybe"}]}}}, 422, "invalid"),
    ("POST", "/api/workspaces", {"json": {"path": "WS", "host": {"provider": "github"}}}, 422, "invalid"),
    ("POST", "/api/workspaces", {"json": {"path": "WS", "colour": "red"}}, 422, "invalid"),
    ("POST", "/api/workspaces", {"json": {"path": "WS"}}, 409, "workspace_exists"),
    ("GET", "/api/workspaces/nope", {}, 404, "no_such_workspace"),
    ("GET", "/api/nothing-here", {}, 404, "not_found"),
    ("DELETE", "/api/autonomy", {}, 405, "method_not_allowed"),
]  # fmt: skip


def test_bad_input_on_every_endpoint_is_a_typed_4xx_and_changes_nothing(server, tmp_path):
    ws = make_workspace(tmp_path / "ws", files={"src/a.txt": "a\n"})
    with server.client() as client:
        assert client.post("/api/workspaces", json={"path": str(ws.path), "host": MEMORY_HOST}).status_code == 201
        before = (client.get("/api/autonomy").json(), client.get("/api/workspaces").json())
        for method, path, kwargs, status, kind in BAD:
            if "json" in kwargs and isinstance(kwargs["json"], dict) and isinstance(kwargs["json"].get("path"), str):
                kwargs = {"json": {**kwargs["json"], "path": kwargs["json"]["path"].replace("WS", str(ws.path))}}
            answer = client.request(method, path, **kwargs)
            assert (answer.status_code, answer.json()["error"]["kind"]) == (status, kind), (method, path, answer.text)
            assert answer.json()["error"]["message"]
        assert (client.get("/api/autonomy").json(), client.get("/api/workspaces").json()) == before


def test_a_policy_error_names_its_key(server, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    rule = {"id": "r", "kind": "read", "paths": ["**"], "decision": "maybe"}
    with server.client() as client:
        answer = client.post("/api/workspaces", json={"path": str(ws.path), "policy": {"rules": [rule]}})
    assert answer.json()["error"]["key"] == "policy.rules.0.decision"


def test_the_switch_and_the_workspaces_survive_kill_9(server_factory, tmp_path):
    first = server_factory()
    ws = make_workspace(tmp_path / "ws")
    with first.client() as client:
        made = client.post("/api/workspaces", json={"path": str(ws.path), "host": MEMORY_HOST}).json()
        assert client.put("/api/autonomy", json={"enabled": True}).status_code == 200
    first.kill()  # SIGKILL: no shutdown of any kind

    second = server_factory(first.state)
    assert second.token == first.token
    with second.client() as client:
        assert client.get("/api/autonomy").json() == {"enabled": True}
        assert client.get("/api/workspaces").json() == {"workspaces": [made]}


def test_the_environment_sets_the_switch_at_start(server_factory, tmp_path):
    first = server_factory()
    ws = make_workspace(tmp_path / "ws")
    with first.client() as client:
        assert client.post("/api/workspaces", json={"path": str(ws.path), "host": MEMORY_HOST}).status_code == 201
    first.kill()
    second = server_factory(first.state, env={"AGENTUP_AUTONOMY_ENABLED": "1"})
    with second.client() as client:
        assert client.get("/api/autonomy").json() == {"enabled": True}


def test_the_server_bench_runs_and_reports_its_ratio():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "harness", "bench", "server", "--loops", "2", "--tasks", "5",
                           "--idle-seconds", "2", "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["loops"] == 2 and figures["tasks_per_loop"] == 5
    assert figures["ratio"] > 0 and len(figures["api_ms_under_load"]) == 2
    assert figures["steering_posts"] > 0 and len(figures["steering_ms_under_load"]) == 2
    # kept draining every 1 s for 2 s: one or two listings each, never a busy loop
    assert 0 < figures["host_calls_per_hour_per_workspace"] <= 2 * 3600


#: The workspace's own endpoints ("W" is its id): each bad request a typed 4xx that changes nothing.
BAD_ON_A_WORKSPACE = [
    ("PUT", "/api/workspaces/W/agent/binding", {"json": {"module": "telepathy"}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W/agent/binding", {"json": {"module": "scripted", "scenario": "relative.yaml"}}, 422,
     "invalid"),
    ("PUT", "/api/workspaces/W/agent/binding", {"json": {"module": "command", "command": "rm -rf /"}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W/agent/binding", {"json": {"module": "codex", "flags": 1}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W/agent/binding", {"json": {"module": "inference", "env": {"A": 1}}}, 422, "invalid"),
    ("PUT", "/api/workspaces/nope/agent/binding", {"json": {"module": "codex"}}, 404, "no_such_workspace"),
    ("PUT", "/api/workspaces/W/agent/autonomy", {"json": {"active": "yes"}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W/agent/autonomy", {"json": {"active": True}}, 409, "autonomy_disabled"),
    ("POST", "/api/workspaces/W/loop/steering", {"json": {"text": ""}}, 422, "invalid"),
    ("POST", "/api/workspaces/W/loop/steering", {"content": b'{"text": "a\\ud800"}'}, 400, "not_json"),
    ("PUT", "/api/workspaces/W/agent/binding", {"content": b'{"module": "codex", "env": {"A": "\\ud800"}}'}, 400,
     "not_json"),  # a lone surrogate: stored, it would break every answer that shows the workspace
    ("POST", "/api/workspaces/W/loop/steering", {"json": {"text": "hi"}}, 409, "no_live_session"),
    ("POST", "/api/workspaces/W/loop/cancel", {}, 409, "no_live_session"),
    ("POST", "/api/workspaces/W/prompt", {"json": {"text": 7}}, 422, "invalid"),
    ("POST", "/api/workspaces/W/prompt", {"json": {"text": "hi"}}, 409, "not_bound"),
    ("POST", "/api/workspaces/W/permissions/p1", {"json": {"optionId": "allow"}}, 409, "no_live_session"),
    ("POST", "/api/workspaces/W/sessions/s1/resume", {}, 404, "no_such_session"),
    ("GET", "/api/workspaces/nope/loop", {}, 404, "no_such_workspace"),
    ("GET", "/api/workspaces/nope/sessions", {}, 404, "no_such_workspace"),
    ("DELETE", "/api/workspaces/W/loop", {}, 405, "method_not_allowed"),
    ("PATCH", "/api/workspaces/W", {"json": {"policy": {"rules": [{"id": "r", "kind": "read", "paths": ["**"],
     "decision": "maybe"}]}}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W", {"json": {"colour": "red"}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W", {"json": {"agent": {"command": ["sh"]}}}, 422, "invalid"),  # the binding's
    ("PATCH", "/api/workspaces/W", {"json": {"transcripts": "/tmp/t"}}, 422, "invalid"),  # the server's
    ("PATCH", "/api/workspaces/W", {"json": {"role": "role.yaml"}}, 422, "invalid"),  # a file: the CLI's
    ("PATCH", "/api/workspaces/W", {"json": {"commit": {}}}, 422, "invalid"),  # workspace.commit
    ("PATCH", "/api/workspaces/W", {"json": {"workspace": {"commit": {"push": "often"}}}}, 422, "invalid"),
    ("PATCH", "/api/workspaces/W", {"json": {"host": {}, "queue": {}}}, 422, "invalid"),
    ("PUT", "/api/workspaces/W/agent/autonomy", {"json": {"active": True, "keep_draining": {"every_s": 0}}}, 422,
     "invalid"),
    ("PUT", "/api/workspaces/W/agent/autonomy", {"json": {"active": True, "keep_draining": {"every": 5}}}, 422,
     "invalid"),
    ("DELETE", "/api/workspaces/nope", {}, 404, "no_such_workspace"),
    ("PATCH", "/api/workspaces/nope", {"json": {}}, 404, "no_such_workspace"),
    ("DELETE", "/api/workspaces/nope/completed", {}, 404, "no_such_workspace"),
]  # fmt: skip


def test_bad_input_on_every_workspace_endpoint_is_a_typed_4xx_and_changes_nothing(server, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path), "host": MEMORY_HOST}).json()["id"]
        before = (client.get("/api/workspaces").json(), client.get(f"/api/workspaces/{workspace_id}/sessions").json())
        for method, path, kwargs, status, kind in BAD_ON_A_WORKSPACE:
            answer = client.request(method, re.sub(r"/W(?=/|$)", f"/{workspace_id}", path), **kwargs)
            assert (answer.status_code, answer.json()["error"]["kind"]) == (status, kind), (method, path, answer.text)
        after = (client.get("/api/workspaces").json(), client.get(f"/api/workspaces/{workspace_id}/sessions").json())
        assert after == before


def test_a_rebound_host_name_is_refused(server):
    port = server.url.rsplit(":", 1)[1]
    with server.client(Host=f"evil.example:{port}") as client:
        answer = client.get("/api/autonomy")
    assert answer.status_code == 403 and answer.json()["error"]["kind"] == "host_refused"
    with server.client(Host=f"localhost:{port}") as client:
        assert client.get("/api/autonomy").status_code == 200


def test_odd_paths_are_a_typed_422_not_a_500(server):
    with server.client() as client:
        for path in ("/tmp/a\u0000b", "/" + "x" * 5000):
            answer = client.post("/api/workspaces", json={"path": path})
            assert (answer.status_code, answer.json()["error"]["kind"]) == (422, "not_a_worktree"), answer.text


def test_a_worktree_holding_or_inside_the_state_directory_is_refused(server_factory, tmp_path):
    """Every agent is kept from the state directory (tokens, database, transcripts): a worktree there would
    be hidden from its own agent, and one holding it would hold every transcript."""
    holder = make_workspace(tmp_path / "holder")
    server = server_factory(holder.path / "state")  # the state directory inside a worktree
    inside = make_workspace(server.state / "inside")
    with server.client() as client:
        for path in (holder.path, inside.path):
            answer = client.post("/api/workspaces", json={"path": str(path)})
            assert (answer.status_code, answer.json()["error"]["kind"]) == (422, "not_a_worktree"), answer.text
            assert "state directory" in answer.json()["error"]["message"]
        assert client.get("/api/workspaces").json()["workspaces"] == []


def test_nested_worktrees_are_refused_and_a_relative_state_directory_works(server_factory, tmp_path):
    """One loop's agent may write its whole worktree: a workspace nested in it would be written too. A
    relative --state (the default is one) is made absolute, or every session's config would be refused."""
    server = server_factory(Path("relative-state"), cwd=tmp_path)
    outer = make_workspace(tmp_path / "outer", ignore=["nested/"])
    inner = make_workspace(outer.path / "nested")
    holder = make_workspace(tmp_path / "holder", ignore=["in/"])
    held = make_workspace(holder.path / "in")
    with server.client() as client:
        made = client.post("/api/workspaces", json={"path": str(outer.path)})
        assert made.status_code == 201 and client.post("/api/workspaces", json={"path": str(held.path)}).is_success
        for path in (inner.path, holder.path):  # inside a registered worktree; holding one
            answer = client.post("/api/workspaces", json={"path": str(path)})
            assert (answer.status_code, answer.json()["error"]["kind"]) == (409, "workspace_overlap"), answer.text
        (tmp_path / "alias").symlink_to(outer.path)  # the same worktree by another name: resolved, then refused
        answer = client.post("/api/workspaces", json={"path": str(tmp_path / "alias")})
        assert (answer.status_code, answer.json()["error"]["kind"]) == (409, "workspace_exists"), answer.text
        scenario = tmp_path / "scenario.yaml"
        scenario.write_text('tasks: [{turns: [{steps: [{message: "hello"}]}]}]\n')
        workspace_id = made.json()["id"]
        client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted",
                                                                         "scenario": str(scenario)})  # fmt: skip
        assert client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "hi"}).status_code == 202
        deadline = time.monotonic() + 30
        while (status := client.get(f"/api/workspaces/{workspace_id}/loop").json())["state"] != "ended":
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert status["terminal"] == "EndTurn", status


def test_the_state_is_the_server_users_alone_and_one_servers_only(server, server_factory):
    assert server.state.stat().st_mode & 0o077 == 0
    assert (server.state / "state.db").stat().st_mode & 0o077 == 0
    with pytest.raises(RuntimeError, match="another server uses"):
        server_factory(server.state)


def test_a_token_file_others_can_read_is_refused(server_factory, tmp_path):
    state = tmp_path / "loose"
    state.mkdir()
    (state / "token").write_text("guessable\n")
    (state / "token").chmod(0o644)
    with pytest.raises(RuntimeError, match="must be the server user's own, mode 0600"):
        server_factory(state)


#: The tables as the server before issue 31 made them: workspaces held three sections, runs no version.
OLD_SCHEMA = """
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE workspaces (id TEXT PRIMARY KEY, path TEXT NOT NULL UNIQUE, queue TEXT, policy TEXT NOT NULL,
    created REAL NOT NULL, binding TEXT, active INTEGER NOT NULL DEFAULT 0, sandbox TEXT);
CREATE TABLE runs (id TEXT PRIMARY KEY, workspace TEXT NOT NULL REFERENCES workspaces(id), module TEXT NOT NULL,
    transcript TEXT NOT NULL, started REAL NOT NULL, ended REAL, terminal TEXT, reason TEXT, tasks TEXT);
"""


def test_a_state_directory_from_before_workspace_configs_is_read_and_edited(server_factory, tmp_path):
    import json
    import sqlite3

    ws = make_workspace(tmp_path / "ws")
    state = tmp_path / "old-state"
    state.mkdir(mode=0o700)
    with sqlite3.connect(state / "state.db") as db:
        db.executescript(OLD_SCHEMA)
        row = (str(ws.path), json.dumps(MEMORY_HOST), json.dumps(POLICY), json.dumps({"mode": "off"}))
        db.execute("INSERT INTO workspaces VALUES ('w1', ?, ?, ?, 1.0, NULL, 0, ?)", row)
        db.execute("INSERT INTO runs VALUES ('r1', 'w1', 'scripted', '/t.jsonl', 1.0, 2.0, 'Idle', '{}', '[]')")
    server = server_factory(state)
    with server.client() as client:
        old = client.get("/api/workspaces/w1").json()
        assert (old["version"], old["config"]) == (1, {"workspace": {"path": str(ws.path)}, "queue": MEMORY_HOST,
                                                       "policy": POLICY, "sandbox": {"mode": "off"}})  # fmt: skip
        assert client.get("/api/workspaces/w1/sessions").json()["sessions"][0]["terminal"] == "Idle"
        edited = client.patch("/api/workspaces/w1", json={"limits": {"max_iterations": 3}})
        assert edited.status_code == 200, edited.text
        assert (edited.json()["version"], edited.json()["config"]["limits"]) == (2, {"max_iterations": 3})
        assert edited.json()["policy"] == POLICY
        versions = client.get("/api/workspaces/w1/versions").json()["versions"]
        assert [(v["version"], v["config"].get("limits")) for v in versions] == [(1, None), (2, {"max_iterations": 3})]
