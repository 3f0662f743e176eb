"""Scale-out: several servers share the host as the queue. GitHub assignment is the distribution (one
assignee per server, or per workspace): each server drains only its assignee's issues, so no issue is
driven twice, and each is closed once."""

from __future__ import annotations

import time

from harness.pytest_plugin import LOOP_E2E
from harness.testing import OUT_RULES, make_workspace, write_yaml
from scripted_agents.presets import write_turn
from tests.helpers.fakegithub import FakeGitHub

pytestmark = LOOP_E2E


def test_two_servers_split_one_repository_by_assignee(server_factory, tmp_path):
    github = FakeGitHub()
    try:
        for number in range(1, 7):
            github.add_issue(number, f"issue {number}", assignee="agent-a" if number % 2 else "agent-b")
        scenario = write_yaml(tmp_path / "scenario.yaml", {"tasks": [{"turns": [write_turn("out/r.txt", "r\n")]}]})
        servers = {name: server_factory(tmp_path / f"state-{name}", env={"GITHUB_TOKEN": github.token})
                   for name in ("a", "b")}  # fmt: skip
        ids = {}
        for name, server in servers.items():
            ws = make_workspace(tmp_path / f"ws-{name}", ignore=["out/"])
            host = {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": f"agent-{name}",
                    "on_complete": ["comment", "close"], "max_wait_s": 5}  # fmt: skip
            with server.client() as client:
                made = client.post("/api/workspaces", json={"path": str(ws.path), "host": host,
                                                            "policy": {"rules": OUT_RULES}})  # fmt: skip
                assert made.status_code == 201, made.text
                ids[name] = made.json()["id"]
                client.put("/api/autonomy", json={"enabled": True})
                client.put(f"/api/workspaces/{ids[name]}/agent/binding",
                           json={"module": "scripted", "scenario": str(scenario)})  # fmt: skip
                assert (
                    client.put(f"/api/workspaces/{ids[name]}/agent/autonomy", json={"active": True}).status_code == 200
                )
        ended = {}
        for name, server in servers.items():
            with server.client() as client:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    status = client.get(f"/api/workspaces/{ids[name]}/loop").json()
                    if status["state"] == "ended":
                        break
                    time.sleep(0.1)
                ended[name] = status
    finally:
        github.close()

    assert {n: s["terminal"] for n, s in ended.items()} == {"a": "Idle", "b": "Idle"}, ended
    done = {n: sorted(t["id"] for t in s["tasks"] if t["terminal"] == "Completed") for n, s in ended.items()}
    assert done == {"a": ["1", "3", "5"], "b": ["2", "4", "6"]}, done
    closes = [
        path for method, path, body in github.calls if method == "PATCH" and (body or {}).get("state") == "closed"
    ]
    assert sorted(closes) == sorted({*closes}) and len(closes) == 6  # each issue closed exactly once
