"""The interactive path through the server: a prompt session whose policy has no rule, its permission
requests answered over the API, and the idle allow-once countdown (server-owned, allow-once only,
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


def test_an_answer_after_the_countdown_answered_is_a_409_and_ids_differ_between_sessions(server_factory, tmp_path):
    """A stale page's click must not land on another request: ids are never reused across sessions, and a
    reply to a request already answered (here by the countdown) says so instead of a 200."""
    server = server_factory(env={"LOOP_HARNESS_ALLOW_ONCE_AFTER_S": "1"})
    with server.client() as client:
        host = {"provider": "memory", "tasks": [{"id": "T1", "title": "x"}]}
        ws, workspace_id = interactive_workspace(client, tmp_path, sandbox="off", host=host)
        client.put("/api/autonomy", json={"enabled": True})
        ids = []
        for _ in range(2):
            client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "write some notes"})
            ids.append(pending(client, workspace_id)[0]["id"])
            ended(client, workspace_id)  # the countdown answered allow-once
            (ws.path / "out" / "notes.txt").unlink()
        assert ids[0] != ids[1], ids

        client.put("/api/autonomy", json={"enabled": False})  # no countdown: the request waits for a person
        client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "write some notes"})
        waiting = pending(client, workspace_id)[0]["id"]
        stale = client.post(f"/api/workspaces/{workspace_id}/permissions/{ids[0]}", json={"optionId": "reject"})
        assert (stale.status_code, stale.json()["error"]["kind"]) == (404, "no_such_request")
        assert client.post(f"/api/workspaces/{workspace_id}/permissions/{waiting}", json={"optionId": "reject"}
                           ).status_code == 200  # fmt: skip
        ended(client, workspace_id)
    assert not (ws.path / "out" / "notes.txt").exists()


def test_kill_9_during_a_prompt_session_then_restart_ends_its_transcript(server_factory, tmp_path):
    """A prompt session is not an activated loop, but a restart still ends it: history and transcript."""
    first = server_factory()
    with first.client() as client:
        _, workspace_id = interactive_workspace(client, tmp_path)
        client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "write some notes"})
        pending(client, workspace_id)
        session = client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"][0]
    first.kill()
    assert read_transcript(Path(session["transcript"]))[-1]["type"] != "terminal"

    second = server_factory(first.state)
    with second.client() as client:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
    assert (status["terminal"], status["reason"]) == ("Failed", {"kind": "restarted"})
    last = read_transcript(Path(session["transcript"]))[-1]
    assert (last["type"], last["terminal"], last["reason"]["kind"]) == ("terminal", "Failed", "restarted")
    assert not list(Path(session["transcript"]).parent.glob(".active/*.json"))
