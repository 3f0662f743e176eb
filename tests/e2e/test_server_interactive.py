"""The interactive path through the server: a prompt session whose policy has no rule, its permission
requests answered over the API, and seed 002's idle allow-once countdown (server-owned, allow-once only,
eligible only with the switch on and the sandbox off)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_E2E
from harness.testing import make_workspace, write_yaml
from scripted_agents.presets import turn, write_turn

pytestmark = LOOP_E2E

ASKS = {"tasks": [{"turns": [turn(*write_turn("out/notes.txt", "yes\n")["steps"][:2])]}]}  # ask, then write


def interactive_workspace(client, tmp_path, *, sandbox=None, host=None):
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    body = {"path": str(ws.path), "policy": {"rules": []}}
    if sandbox:
        body["sandbox"] = {"mode": sandbox}
    if host:
        body["host"] = host
    workspace_id = client.post("/api/workspaces", json=body).json()["id"]
    scenario = write_yaml(tmp_path / "scenario.yaml", ASKS)
    bound = client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted",
                                                                             "scenario": str(scenario)})  # fmt: skip
    assert bound.status_code == 200, bound.text
    return ws, workspace_id


def pending(client, workspace_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = client.get(f"/api/workspaces/{workspace_id}/permissions").json()["pending"]
        if waiting:
            return waiting
        time.sleep(0.05)
    raise AssertionError("no permission request reached the API")


def ended(client, workspace_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
        if status["state"] == "ended":
            return status
        time.sleep(0.05)
    raise AssertionError(f"the session did not end: {status}")


@pytest.mark.parametrize(("answer", "written"), [({"optionId": "allow"}, True), ({"optionId": "reject"}, False)])
def test_a_person_answers_over_the_api_with_autonomy_off(server, tmp_path, answer, written):
    with server.client() as client:
        ws, workspace_id = interactive_workspace(client, tmp_path)
        started = client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "write some notes"})
        assert started.status_code == 202 and started.json()["interactive"] is True

        waiting = pending(client, workspace_id)
        assert len(waiting) == 1 and waiting[0]["toolCall"]["title"] == "Write out/notes.txt"
        assert waiting[0]["allow_once_in_s"] is None  # autonomy is off: no countdown, a person must answer
        bad = client.post(f"/api/workspaces/{workspace_id}/permissions/{waiting[0]['id']}", json={"optionId": "x"})
        assert bad.status_code == 422
        answered = client.post(f"/api/workspaces/{workspace_id}/permissions/{waiting[0]['id']}", json=answer)
        assert answered.status_code == 200, answered.text

        status = ended(client, workspace_id)
    assert status["terminal"] == "EndTurn"
    assert (ws.path / "out" / "notes.txt").exists() is written


@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_the_idle_countdown_answers_allow_once_only_with_the_sandbox_off(server_factory, tmp_path, sandbox):
    server = server_factory(env={"LOOP_HARNESS_ALLOW_ONCE_AFTER_S": "1"})
    with server.client() as client:
        host = {"provider": "memory", "tasks": [{"id": "T1", "title": "x"}]}
        ws, workspace_id = interactive_workspace(client, tmp_path, sandbox=sandbox, host=host)
        assert client.put("/api/autonomy", json={"enabled": True}).status_code == 200
        client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "write some notes"})
        waiting = pending(client, workspace_id)
        if sandbox == "off":
            assert 0 < waiting[0]["allow_once_in_s"] <= 1
            status = ended(client, workspace_id)  # nobody answered: the countdown did
        else:
            assert waiting[0]["allow_once_in_s"] is None
            time.sleep(1.5)
            assert client.get(f"/api/workspaces/{workspace_id}/permissions").json()["pending"], "still waiting"
            client.post(f"/api/workspaces/{workspace_id}/permissions/{waiting[0]['id']}", json={"optionId": "allow"})
            status = ended(client, workspace_id)
        sessions = client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]
    assert status["terminal"] == "EndTurn" and (ws.path / "out" / "notes.txt").read_text() == "yes\n"
    decided = [r for r in read_transcript(Path(sessions[-1]["transcript"])) if r["type"] == "policy"
               and r["source"] == "session/request_permission"]  # fmt: skip
    assert [r["outcome"] for r in decided] == [{"outcome": "selected", "optionId": "allow"}]  # allow-once, never always
