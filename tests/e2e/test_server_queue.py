"""The server runs the unattended queue it exists for (issue 31): a workspace holds a whole run config
(commit, queue, policy, sandbox, limits, autonomy, role), is edited, versioned and deleted through the API,
keeps its completed task ids per queue whatever else changes, and can keep draining past Idle."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_E2E
from harness.testing import OUT_RULES, make_workspace, write_yaml
from scripted_agents.presets import turn, write_turn
from tests.helpers.fakegithub import FakeGitHub
from tests.helpers.server_api import wait_for

pytestmark = LOOP_E2E

SRC_RULES = [
    {"id": "read-all", "kind": "read", "decision": "allow", "paths": ["**"]},
    {"id": "write-src", "kind": "write", "decision": "allow", "paths": ["src/**"]},
]


def sessions(client, workspace_id):
    return client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]


def bind(client, workspace_id, scenario: Path) -> None:
    client.put("/api/autonomy", json={"enabled": True})
    bound = client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted",
                                                                             "scenario": str(scenario)})  # fmt: skip
    assert bound.status_code == 200, bound.text


def origin_log(origin: Path) -> list[str]:
    done = subprocess.run(["git", "--git-dir", str(origin), "log", "--format=%s", "main"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def issue_scenario(numbers) -> dict:
    """Issue N changes the tracked src/app.txt and adds src/issue-N.txt."""

    def steps(n: int) -> list[dict]:
        app = write_turn("src/app.txt", f"v{n}\n", call_id=f"a{n}")["steps"]
        return [*app, *write_turn(f"src/issue-{n}.txt", f"{n}\n", call_id=f"b{n}")["steps"]]

    return {"tasks": [{"id": str(n), "turns": [turn(*steps(n))]} for n in numbers]}


def test_an_unattended_github_queue_commits_pushes_and_keeps_draining(server_factory, tmp_path):
    """Done when: through the API alone, a GitHub-backed workspace with commit, limits, budgets and a role
    drains 3 issues changing tracked files to Idle with three commits pushed, then picks up a 4th assigned
    afterwards without another activation."""
    github = FakeGitHub()
    try:
        for number in (1, 2, 3):
            github.add_issue(number, f"issue {number}", assignee="agent")
        ws = make_workspace(tmp_path / "ws", files={"src/app.txt": "v0\n"})
        scenario = write_yaml(tmp_path / "scenario.yaml", issue_scenario(range(1, 5)))
        server = server_factory(env={"FAKE_GITHUB_TOKEN": github.token})  # the host's token: the server's own
        config = {
            "workspace": {"path": str(ws.path), "commit": {"message": "{id}: {title}", "push": True}},
            "queue": {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": "agent",
                      "token_env": "FAKE_GITHUB_TOKEN", "on_complete": ["comment", "close"], "max_wait_s": 5},
            "policy": {"rules": SRC_RULES},
            "limits": {"max_iterations": 4, "turn_timeout_s": 900},
            "autonomy": {"budget": {"tool_calls": {"per_segment": 40}}},
            "role": {"prompt": "You implement the issue you are given."},
        }  # fmt: skip
        with server.client() as client:
            made = client.post("/api/workspaces", json=config)
            assert made.status_code == 201, made.text
            workspace_id = made.json()["id"]
            assert made.json()["config"] == {**config, "workspace": config["workspace"]}
            assert made.json()["version"] == 1
            bind(client, workspace_id, scenario)
            activated = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                                   json={"active": True, "keep_draining": {"every_s": 0.3}})  # fmt: skip
            assert activated.status_code == 200, activated.text
            assert activated.json()["keep_draining"] == {"every_s": 0.3}

            waiting = wait_for(client, workspace_id, lambda s: s["state"] == "waiting")
            assert waiting["terminal"] == "Idle" and waiting["next_check"] > time.time() - 1
            first = sessions(client, workspace_id)
            assert [(s["terminal"], s["version"]) for s in first] == [("Idle", 1)]
            assert [(t["id"], t["terminal"]) for t in first[0]["tasks"]] == [("1", "Completed"), ("2", "Completed"),
                                                                               ("3", "Completed")]  # fmt: skip
            assert origin_log(ws.origin)[:3] == ["3: issue 3", "2: issue 2", "1: issue 1"]

            github.add_issue(4, "issue 4", assignee="agent")  # assigned after the queue drained
            wait_for(client, workspace_id, lambda s: s["state"] == "waiting" and s["session"] != waiting["session"])
            assert (
                client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False}).status_code == 200
            )
            ended = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
            history = sessions(client, workspace_id)
        assert [[t["id"] for t in s["tasks"]] for s in history] == [["1", "2", "3"], ["4"], []]
        assert [s["terminal"] for s in history] == ["Idle", "Idle", "Cancelled"]  # deactivated while it waited
        assert (ended["terminal"], ended["reason"]) == ("Cancelled", {"kind": "deactivated", "waiting": True})
        assert origin_log(ws.origin)[0] == "4: issue 4"
        assert (ws.path / "src" / "app.txt").read_text() == "v4\n"
        closed = sorted(p for m, p, b in github.calls if m == "PATCH" and (b or {}).get("state") == "closed")
        assert closed == [f"/repos/{github.repo}/issues/{n}" for n in (1, 2, 3, 4)]
        start = next(r for r in read_transcript(Path(history[0]["transcript"])) if r["type"] == "run_start")
        values = start["limits"]["values"]
        assert (values["limits.max_iterations"], values["limits.turn_timeout_s"]) == (4, 900)
        assert values["autonomy.budget.tool_calls.per_segment"] == 40
    finally:
        github.close()


def test_a_policy_edit_after_blocked_policy_lets_the_next_activation_pass(server, tmp_path):
    ws = make_workspace(tmp_path / "ws", files={"src/app.txt": "v0\n"})
    scenario = write_yaml(tmp_path / "scenario.yaml", issue_scenario([1]))
    body = {"workspace": {"path": str(ws.path), "commit": {"push": True}},
            "queue": {"provider": "memory", "tasks": [{"id": "1", "title": "one"}]},
            "policy": {"rules": OUT_RULES}}  # fmt: skip
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json=body).json()["id"]
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        blocked = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
        assert (blocked["terminal"], blocked["reason"]["kind"]) == ("BlockedPolicy", "policy_refusal")

        edited = client.patch(f"/api/workspaces/{workspace_id}", json={"policy": {"rules": SRC_RULES}})
        assert edited.status_code == 200, edited.text
        assert (edited.json()["version"], edited.json()["policy"]) == (2, {"rules": SRC_RULES})
        assert edited.json()["config"]["workspace"]["commit"] == {"push": True}  # PATCH kept the other sections
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        passed = wait_for(client, workspace_id, lambda s: s["state"] == "ended" and s["session"] != blocked["session"])
        versions = client.get(f"/api/workspaces/{workspace_id}/versions").json()
        history = sessions(client, workspace_id)
    assert (passed["terminal"], passed["version"]) == ("Idle", 2), passed
    assert [(s["terminal"], s["version"]) for s in history] == [("BlockedPolicy", 1), ("Idle", 2)]
    assert [v["version"] for v in versions["versions"]] == [1, 2] and versions["version"] == 2
    assert versions["versions"][0]["config"]["policy"] == {"rules": OUT_RULES}
    assert origin_log(ws.origin)[0] == "1: one"


HANGS = {"tasks": [{"turns": [turn({"message": "working"}, {"hang": True})]}]}


def test_a_config_is_edited_only_while_no_session_is_live_and_deleted_when_idle(server, tmp_path):
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", HANGS)
    body = {"path": str(ws.path), "host": {"provider": "memory", "tasks": [{"id": "T1"}]},
            "policy": {"rules": OUT_RULES}}  # fmt: skip
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json=body).json()["id"]
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        running = wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")
        for method in ("PUT", "PATCH"):
            refused = client.request(method, f"/api/workspaces/{workspace_id}", json={"limits": {"max_iterations": 2}})
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["kind"] == "session_live"
            assert refused.json()["error"]["session"] == running["session"]
        refused = client.delete(f"/api/workspaces/{workspace_id}")
        assert (refused.status_code, refused.json()["error"]["kind"]) == (409, "session_live")
        assert client.get(f"/api/workspaces/{workspace_id}").json()["version"] == 1  # nothing changed

        client.post(f"/api/workspaces/{workspace_id}/loop/cancel")
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")
        replaced = client.put(f"/api/workspaces/{workspace_id}", json={"queue": body["host"], "limits": {
            "max_iterations": 2}})  # fmt: skip
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["config"] == {
            "workspace": {"path": str(ws.path)},
            "queue": body["host"],
            "limits": {"max_iterations": 2},
        }  # PUT replaces: the policy is gone
        moved = client.put(f"/api/workspaces/{workspace_id}", json={"path": str(tmp_path)})
        assert (moved.status_code, moved.json()["error"]["key"]) == (422, "path")

        deleted = client.delete(f"/api/workspaces/{workspace_id}")
        assert deleted.status_code == 200, deleted.text
        assert client.get(f"/api/workspaces/{workspace_id}").status_code == 404
        again = client.post("/api/workspaces", json=body)  # the path is free again
        assert again.status_code == 201 and again.json()["id"] != workspace_id


@pytest.mark.parametrize(
    ("key", "section", "value"),
    [
        (
            "policy.rules.0.decision",
            "policy",
            {"rules": [{"id": "r", "kind": "write", "decision": "maybe", "paths": ["**"]}]},
        ),
        ("limits.max_iterations", "limits", {"max_iterations": 0}),
        ("autonomy.budget.tool_calls.per_segment", "autonomy", {"budget": {"tool_calls": {"per_segment": 0}}}),
        ("commit.author", "workspace", {"commit": {"author": "no address"}}),
        ("role.tools", "role", {"tools": ["no_such_tool"]}),
        ("sandbox.worktree", "sandbox", {"worktree": "copy"}),
    ],
)
def test_a_bad_section_is_refused_with_the_key_and_message_the_cli_gives(server, tmp_path, key, section, value):
    """One config, two front doors: the server's 422 and `loop-harness run`'s error name the same key with
    the same message, because both call the same validation."""
    ws = make_workspace(tmp_path / "ws")
    sections = {section: {"path": str(ws.path), **value} if section == "workspace" else value}
    run_config = {"workspace": str(ws.path), "agent": {"command": ["true"]}, **sections}
    path = write_yaml(tmp_path / "loop.yaml", run_config)
    cli = subprocess.run([sys.executable, "-m", "harness", "run", str(path)], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    with server.client() as client:
        body = {"path": str(ws.path), **sections} if section != "workspace" else sections
        refused = client.post("/api/workspaces", json=body)
        listed = client.get("/api/workspaces").json()["workspaces"]
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["key"] == key, error
    assert cli.returncode == 2, cli.stderr
    assert error["message"] in cli.stderr, (error["message"], cli.stderr)
    assert listed == []  # a refused registration changes nothing


def test_completed_ids_survive_kill_9_a_restart_and_another_workspaces_registration(server_factory, tmp_path):
    """T1 completes, the server dies during T2. The history of the killed session lists T1; another workspace
    registered before re-activating does not make T1 run again; the reset endpoint forgets it."""
    t1_then_hang = {"tasks": [{"id": "T1", "turns": [write_turn("out/result.txt", "done\n")]},
                              {"id": "T2", "turns": [turn({"hang": True})]}]}  # fmt: skip
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", t1_then_hang)
    queue = {"provider": "memory", "tasks": [{"id": "T1"}, {"id": "T2"}]}
    first = server_factory()
    with first.client() as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path), "queue": queue,
                                                            "policy": {"rules": OUT_RULES}}).json()["id"]  # fmt: skip
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T2")
    first.kill()

    second = server_factory(first.state)
    with second.client() as client:
        killed = sessions(client, workspace_id)[0]
        assert (killed["terminal"], killed["reason"]) == ("Failed", {"kind": "restarted"})
        assert [(t["id"], t["terminal"]) for t in killed["tasks"]] == [("T1", "Completed")]
        other = make_workspace(tmp_path / "other")
        assert client.post("/api/workspaces", json={"path": str(other.path)}).status_code == 201
        edited = client.patch(f"/api/workspaces/{workspace_id}", json={"limits": {"turn_timeout_s": 600}})
        assert edited.status_code == 200, edited.text
        listed = client.get(f"/api/workspaces/{workspace_id}/completed").json()
        assert [c["id"] for c in listed["completed"]] == ["T1"]

        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T2")
        rerun = sessions(client, workspace_id)[1]
        skipped = [r["task"]["id"] for r in read_transcript(Path(rerun["transcript"])) if r["type"] == "task_skipped"]
        assert skipped == ["T1"]
        client.post(f"/api/workspaces/{workspace_id}/loop/cancel")
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")

        forgotten = client.delete(f"/api/workspaces/{workspace_id}/completed")
        assert forgotten.json() == {"forgotten": 1}
        assert client.get(f"/api/workspaces/{workspace_id}/completed").json()["completed"] == []


def test_the_switch_variable_on_a_fresh_state_starts_the_server_and_activation_says_why(server_factory, tmp_path):
    server = server_factory(tmp_path / "fresh", env={"AGENTUP_AUTONOMY_ENABLED": "1"})
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", HANGS)
    with server.client() as client:
        assert client.get("/api/autonomy").json() == {"enabled": True}
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path),
                                                            "policy": {"rules": OUT_RULES}}).json()["id"]  # fmt: skip
        client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted",
                                                                         "scenario": str(scenario)})  # fmt: skip
        refused = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
    assert refused.status_code == 409
    assert refused.json()["error"]["kind"] == "no_host_connection"


OPERATOR_TERMINALS = {
    "MaxIterations": ({"tasks": [{"id": "T1", "turns": [turn({"message": "still going"}, stop="max_tokens")]}]},
                      {"limits": {"max_iterations": 2}}, "budget"),
    "BlockedAwaitingInput": ({"tasks": [{"id": "T1", "turns": [turn({"message": "What should I do?"})]}]},
                             {"limits": {"standing_answers": 1}}, "no_tool_call"),
    "BlockedRateLimited": (None, {"queue": {"faults": [{"op": "list_tasks", "signal": "rate_limited", "times": 10,
                                                        "reset_in_s": 0.01}], "max_retries": 1}}, "rate_limited"),
    "BlockedHostUnavailable": (None, {"queue": {"faults": [{"op": "list_tasks", "signal": "unavailable",
                                                            "times": 10}], "max_retries": 1,
                                                "backoff_base_s": 0.01}}, "host_unavailable"),
    "BlockedPrecondition": ({"tasks": [{"id": "T1", "turns": [write_turn("stray.txt", "left\n")]}]}, {},
                            "git_clean_tree"),  # allowed, not committed: it stops T2 from starting
}  # fmt: skip


@pytest.mark.parametrize("terminal", OPERATOR_TERMINALS)
def test_every_server_level_terminal_is_reached_through_the_api(server, tmp_path, terminal):
    scenario_data, sections, kind = OPERATOR_TERMINALS[terminal]
    written = {"tasks": [{"turns": [write_turn("out/r.txt", "r\n")]}]}
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", scenario_data or written)
    queue = {"provider": "memory", "tasks": [{"id": "T1"}, {"id": "T2"}], **sections.pop("queue", {})}
    rules = [*OUT_RULES, {"id": "stray", "kind": "write", "decision": "allow", "paths": ["stray.txt"]}]
    with server.client() as client:
        made = client.post("/api/workspaces", json={"path": str(ws.path), "queue": queue, "policy": {"rules": rules},
                                                    **sections})  # fmt: skip
        assert made.status_code == 201, made.text
        workspace_id = made.json()["id"]
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        ended = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
    assert ended["terminal"] == terminal, ended
    assert kind in json.dumps(ended["reason"]), ended["reason"]


def projection(transcript: Path) -> list[tuple]:
    """What a run did, without where and when: each record's type, task, tool and terminal."""
    keep = ("task", "terminal", "tool", "decision", "rule_id", "files", "pushed")
    out = []
    for record in read_transcript(transcript):
        task = record.get("task")
        fields = {k: record[k] for k in keep if k in record and k != "task"}
        out.append((record["type"], task["id"] if isinstance(task, dict) else task, json.dumps(fields, sort_keys=True)))
    return out


def test_the_cli_and_the_server_run_one_config_alike(server, tmp_path):
    """One config, two front doors: `loop-harness run` and the server, fed the same sections on two copies of
    one repository, write the same records (types, tasks, decisions, commits) and end the same way."""
    scenario = write_yaml(tmp_path / "scenario.yaml", issue_scenario([1, 2]))
    sections = {"queue": {"provider": "memory", "tasks": [{"id": "1", "title": "one"}, {"id": "2", "title": "two"}]},
                "policy": {"rules": SRC_RULES}, "limits": {"max_iterations": 3},
                "autonomy": {"budget": {"changes": {"files_total": 10}}}, "role": {"prompt": "Be brief."}}  # fmt: skip
    commit = {"message": "{id}: {title}", "push": True}
    cli_ws = make_workspace(tmp_path / "cli", files={"src/app.txt": "v0\n"})
    agent = {"command": [sys.executable, "-m", "scripted_agents", str(scenario)], "supports_permission_requests": True}
    config = write_yaml(tmp_path / "loop.yaml", {"workspace": {"path": str(cli_ws.path), "commit": commit},
                                                 "agent": agent, "transcripts": str(tmp_path / "cli-transcripts"),
                                                 **sections})  # fmt: skip
    cli = subprocess.run([sys.executable, "-m", "harness", "run", str(config), "--json"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    by_cli = json.loads(cli.stdout.strip().splitlines()[-1])

    served_ws = make_workspace(tmp_path / "served", files={"src/app.txt": "v0\n"})
    with server.client() as client:
        made = client.post("/api/workspaces", json={"workspace": {"path": str(served_ws.path), "commit": commit},
                                                    **sections})  # fmt: skip
        assert made.status_code == 201, made.text
        workspace_id = made.json()["id"]
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        ended = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
        served = sessions(client, workspace_id)[0]

    assert (ended["terminal"], ended["reason"]) == (by_cli["terminal"], by_cli["reason"]) == (
        "Idle", {"kind": "queue_empty", "completed": 2})  # fmt: skip
    assert projection(Path(served["transcript"])) == projection(Path(by_cli["transcript"]))
    assert origin_log(served_ws.origin) == origin_log(cli_ws.origin)


def test_a_waiting_loop_respects_a_rate_limit_and_backs_off_an_outage(server_factory, tmp_path):
    """Kept draining against a GitHub that answers a listing with a rate limit (retry in 2 s), then an outage:
    the next listing waits for the reset, the one after an outage waits longer, each failure shows in the
    status, and the loop goes on to pick up the issue assigned afterwards."""
    github = FakeGitHub()
    try:
        github.add_issue(1, "issue 1", assignee="agent")
        ws = make_workspace(tmp_path / "ws", files={"src/app.txt": "v0\n"})
        scenario = write_yaml(tmp_path / "scenario.yaml", issue_scenario([1, 2]))
        server = server_factory(env={"GITHUB_TOKEN": github.token})
        host = {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": "agent",
                "max_wait_s": 5}  # fmt: skip
        with server.client() as client:
            workspace_id = client.post("/api/workspaces", json={
                "workspace": {"path": str(ws.path), "commit": {}}, "queue": host,
                "policy": {"rules": SRC_RULES}}).json()["id"]  # fmt: skip
            bind(client, workspace_id, scenario)
            limited = {"status": 403, "headers": {"retry-after": "2"}, "body": {"message": "slow down"}}
            client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                       json={"active": True, "keep_draining": {"every_s": 0.3}})  # fmt: skip
            wait_for(client, workspace_id, lambda s: s["state"] == "waiting")
            listings = len(github.made("GET", f"/repos/{github.repo}/issues"))
            github.script("GET", f"/repos/{github.repo}/issues", limited, {"status": 503, "body": {"message": "down"}})

            first = wait_for(client, workspace_id, lambda s: (s.get("failure") or {}).get("failures") == 1)
            assert "RateLimited" in first["failure"]["error"]
            assert first["next_check"] - first["failure"]["at"] >= 1.9  # not before the reset the host gave
            second = wait_for(client, workspace_id, lambda s: (s.get("failure") or {}).get("failures") == 2)
            assert "HostUnavailable" in second["failure"]["error"]
            assert second["next_check"] - second["failure"]["at"] >= 0.3 * 4 - 0.05  # doubled twice
            cleared = wait_for(client, workspace_id, lambda s: s["state"] == "waiting" and s["failure"] is None)
            assert cleared["checks"] >= 3
            assert len(github.made("GET", f"/repos/{github.repo}/issues")) - listings >= 3

            github.add_issue(2, "issue 2", assignee="agent")
            # the second session ended (the status and the history are two requests: a session row alone may be
            # one that started after the status said waiting)
            wait_for(client, workspace_id, lambda s: s["state"] == "waiting" and [
                r["ended"] is not None for r in sessions(client, workspace_id)] == [True, True])  # fmt: skip
            client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False})
            wait_for(client, workspace_id, lambda s: s["state"] == "ended")
            history = sessions(client, workspace_id)
        assert [[t["id"] for t in s["tasks"]] for s in history] == [["1"], ["2"], []]
    finally:
        github.close()


def test_a_loop_killed_while_it_waits_ends_failed_restarted_and_activates_again(server_factory, tmp_path):
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", {"tasks": [{"turns": [write_turn("out/r.txt", "r\n")]}]})
    first = server_factory()
    with first.client() as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path), "policy": {"rules": OUT_RULES},
                                                            "queue": {"provider": "memory", "tasks": [{"id": "T1"}]}}
                                   ).json()["id"]  # fmt: skip
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                   json={"active": True, "keep_draining": {"every_s": 30}})  # fmt: skip
        wait_for(client, workspace_id, lambda s: s["state"] == "waiting")
    first.kill()

    second = server_factory(first.state)
    with second.client() as client:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
        assert (status["state"], status["terminal"], status["reason"]) == (
            "ended", "Failed", {"kind": "restarted", "waiting": True})  # fmt: skip
        assert [s["terminal"] for s in sessions(client, workspace_id)] == ["Idle", "Failed"]
        assert client.get(f"/api/workspaces/{workspace_id}").json()["active"] is False
        again = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        assert again.status_code == 200, again.text  # the dead server's lock went with it
        ended = wait_for(
            client, workspace_id, lambda s: s["state"] == "ended" and s["session"] == again.json()["session"]
        )
    assert ended["terminal"] == "Idle" and ended["reason"]["skipped_completed_earlier"] == 1


REVIEWER = {
    "prompt": "Review the proposed change. Do not edit the worktree.",
    "tools": ["get_commits_status", "get_issue", "submit_review"],
    "trigger": "ProposalAwaitingReview",
    "termination": "ReviewSubmitted",
}


def test_a_reviewer_loop_kept_draining_reviews_each_requested_pull_request_once(server_factory, tmp_path):
    """A role on the server: the reviewer drains the pull requests awaiting its review. The host still lists a
    reviewed one (the loopback GitHub keeps the request), and the completed ids keep it from a second review;
    one requested later is reviewed without another activation."""
    github = FakeGitHub()
    try:
        github.add_pull(11, "Fix the parser", reviewers=["agent"])
        review = turn({"mcp_call": {"tool": "submit_review", "arguments": {"verdict": "approve", "body": "ok"}}})
        scenario = write_yaml(tmp_path / "scenario.yaml", {"tasks": [{"turns": [review]}], "agent": {"mcp_http": True}})
        ws = make_workspace(tmp_path / "ws")
        server = server_factory(env={"GITHUB_TOKEN": github.token})
        host = {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": "agent"}
        with server.client() as client:
            made = client.post("/api/workspaces", json={"path": str(ws.path), "queue": host, "role": REVIEWER,
                                                        "policy": {"rules": SRC_RULES[:1]}})  # fmt: skip
            assert made.status_code == 201, made.text
            workspace_id = made.json()["id"]
            bind(client, workspace_id, scenario)
            client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                       json={"active": True, "keep_draining": {"every_s": 0.2}})  # fmt: skip
            waiting = wait_for(client, workspace_id, lambda s: s["state"] == "waiting")
            wait_for(client, workspace_id, lambda s: s["state"] == "waiting" and s["checks"] >= 2)  # 11 listed again
            github.add_pull(12, "Add docs", reviewers=["agent"])
            wait_for(client, workspace_id, lambda s: s["state"] == "waiting" and s["session"] != waiting["session"])
            client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False})
            history = sessions(client, workspace_id)
    finally:
        github.close()
    ran = [[(t["id"], t["reason"]["kind"] == "completed_earlier") for t in s["tasks"]] for s in history]
    assert ran == [[("11", False)], [("11", True), ("12", False)], []]  # 11 listed again, skipped: never run twice
    reviews = [c[1] for c in github.made("POST", f"/repos/{github.repo}/pulls/")]
    assert reviews == [f"/repos/{github.repo}/pulls/11/reviews", f"/repos/{github.repo}/pulls/12/reviews"]


def test_a_patch_null_drops_a_section_and_commit_false_stops_commits(server, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    body = {"workspace": {"path": str(ws.path), "commit": {"push": False}}, "policy": {"rules": SRC_RULES},
            "limits": {"max_iterations": 3}}  # fmt: skip
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json=body).json()["id"]
        dropped = client.patch(f"/api/workspaces/{workspace_id}", json={"limits": None})
        assert dropped.status_code == 200, dropped.text
        assert "limits" not in dropped.json()["config"] and dropped.json()["version"] == 2
        stopped = client.patch(f"/api/workspaces/{workspace_id}", json={"workspace": {"commit": False}})
        assert stopped.json()["config"] == {"workspace": {"path": str(ws.path)}, "policy": {"rules": SRC_RULES}}
        defaults = client.patch(f"/api/workspaces/{workspace_id}", json={"workspace": {"commit": None}})
        assert defaults.json()["config"]["workspace"] == {"path": str(ws.path), "commit": {}}  # `commit:` alone: on
        versions = client.get(f"/api/workspaces/{workspace_id}/versions").json()["versions"]
    assert [v["version"] for v in versions] == [1, 2, 3, 4]


BAD_SHAPES = [
    {"path": 5},
    {"workspace": {"path": ["x"]}},
    {"path": "/a\u0000b"},
    {"autonomy": {"profile": []}},
    {"autonomy": {"profile": {}}},
    {"sandbox": {"home": "~nosuchuser-loop-harness/x"}},
    {"sandbox": {"tmp": ""}},
    {"sandbox": {"home": "relative/home"}},
    {"sandbox": {"hide": ["~nosuchuser-loop-harness/x"]}},
    {"sandbox": {"sockets": ["~nosuchuser-loop-harness/s"]}},
]


@pytest.mark.parametrize("body", BAD_SHAPES, ids=[json.dumps(b)[:40] for b in BAD_SHAPES])
def test_a_malformed_edit_or_registration_is_a_422_never_a_500(server, tmp_path, body):
    ws = make_workspace(tmp_path / "ws")
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path)}).json()["id"]
        edited = client.patch(f"/api/workspaces/{workspace_id}", json=body)
        fresh = make_workspace(tmp_path / "fresh")
        registered = client.post("/api/workspaces", json={"path": str(fresh.path), **body} if "path" not in body
                                 and "workspace" not in body else body)  # fmt: skip
        listed = client.get("/api/workspaces").json()["workspaces"]
    assert edited.status_code == 422, edited.text
    assert registered.status_code == 422, registered.text
    assert [w["version"] for w in listed] == [1]  # nothing changed, nothing registered


def test_nested_worktrees_registered_at_once_never_both_land(server, tmp_path):
    """The overlap check runs again after the config's validation: two registrations racing, one a worktree
    inside the other, never both succeed."""
    import concurrent.futures

    for attempt in range(8):
        outer = make_workspace(tmp_path / f"outer{attempt}")
        inner = outer.path / "vendor" / "inner"
        inner.mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(inner)], check=True)
        with server.client() as a, server.client() as b, concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda pair: pair[0].post("/api/workspaces", json={"path": str(pair[1])}),
                                    [(a, outer.path), (b, inner)]))  # fmt: skip
        codes = sorted(answer.status_code for answer in answers)
        assert codes in ([201, 409], [201, 422]), [answer.text for answer in answers]


def test_activating_while_deactivating_is_a_409_not_a_dying_session(server, tmp_path):
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    scenario = write_yaml(tmp_path / "scenario.yaml", HANGS)
    with server.client() as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path), "policy": {"rules": OUT_RULES},
                                                            "queue": {"provider": "memory", "tasks": [{"id": "T1"}]}}
                                   ).json()["id"]  # fmt: skip
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False})
        again = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        if again.status_code == 409:  # still ending: said so
            assert again.json()["error"]["kind"] == "session_ending"
        else:  # already ended: a new session, not the dying one
            assert again.status_code == 200 and again.json()["session"] != sessions(client, workspace_id)[0]["id"]
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")


def test_nothing_a_session_started_outlives_it_while_the_loop_waits(server, tmp_path):
    """Kept draining, the loop waits between sessions with no agent running: the session's agent, and a daemon it
    started with setsid and an empty environment (out of its process group, without the run's token), ended
    with the session: the sandbox's pid namespace. (With the sandbox off such a daemon lives on: this test then
    fails, as it was seen to.)"""
    import psutil

    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    daemon = turn({"run": {"script": "env -i setsid sleep 299.7 < /dev/null > /dev/null 2>&1 & echo started"}},
                  *write_turn("out/r.txt", "r\n")["steps"])  # fmt: skip
    scenario = write_yaml(tmp_path / "waits-scenario.yaml", {"tasks": [{"turns": [daemon]}]})
    with server.client() as client:
        body = {"path": str(ws.path), "policy": {"rules": OUT_RULES}, "queue": {"provider": "memory", "tasks": [
            {"id": "T1"}]}}  # fmt: skip
        workspace_id = client.post("/api/workspaces", json=body).json()["id"]
        bind(client, workspace_id, scenario)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy",
                   json={"active": True, "keep_draining": {"every_s": 30}})  # fmt: skip
        waiting = wait_for(client, workspace_id, lambda s: s["state"] == "waiting")
        assert waiting["terminal"] == "Idle", waiting
        deadline = time.monotonic() + 10
        while True:
            left = [p.pid for p in psutil.process_iter(["cmdline"])
                    if "waits-scenario.yaml" in " ".join(p.info["cmdline"] or [])
                    or (p.info["cmdline"] or [])[:2] == ["sleep", "299.7"]]  # fmt: skip
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": False})
    assert left == [], f"still running while the loop waits: {left}"


def test_a_queue_is_the_same_queue_however_github_spells_it(tmp_path):
    """Completed ids are kept per queue identity: a repository or assignee written in other case, or the API URL
    with a trailing slash, is the same GitHub queue (its completed ids stand); another repository is not."""
    from harness.server._workspace_config import queue_identity, run_config

    ws = make_workspace(tmp_path / "ws")

    def identity(**queue: str) -> str:
        base = {"provider": "github", "api_url": "https://api.github.com", "repo": "acme/widgets", "assignee": "bot"}
        config = run_config(str(ws.path), {"queue": {**base, **queue}}, agent={"command": ["true"]},
                            transcripts=tmp_path / "t", hide=[], base_dir=tmp_path)  # fmt: skip
        return queue_identity(config)

    same = identity()
    assert identity(repo="Acme/Widgets") == same
    assert identity(assignee="Bot") == same
    assert identity(api_url="https://api.github.com/") == same
    assert identity(repo="acme/gadgets") != same
    assert identity(assignee="other-bot") != same
