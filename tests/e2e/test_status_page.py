"""The status page in a real headless Chromium (Debian's `chromium`, driven by Playwright): it loads with the
token from the URL fragment, shows a run complete, steers and cancels another, answers a pending permission;
a screenshot is kept (in $LOOP_HARNESS_ARTIFACTS when set)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.pytest_plugin import LOOP_E2E
from harness.testing import OUT_RULES, make_workspace, write_yaml
from scripted_agents.presets import turn, write_turn

pytestmark = LOOP_E2E

BROWSER = os.environ.get("LOOP_HARNESS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def workspace(client, tmp_path, name, scenario, *, tasks, rules=OUT_RULES):
    ws = make_workspace(tmp_path / name, ignore=["out/"])
    path = write_yaml(tmp_path / f"{name}.yaml", scenario)
    made = client.post("/api/workspaces", json={"path": str(ws.path), "policy": {"rules": rules},
                                                "host": {"provider": "memory", "tasks": tasks}})  # fmt: skip
    workspace_id = made.json()["id"]
    client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted", "scenario": str(path)})
    return ws, workspace_id


def test_the_status_page_watches_steers_cancels_and_answers(server, tmp_path):
    if BROWSER is None:
        pytest.fail("no Chromium: `apt-get install chromium` (Debian), or set LOOP_HARNESS_CHROMIUM", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    slow = {"tasks": [{"turns": [turn({"sleep": 0.4}, *write_turn("out/result.txt", "done\n")["steps"])]}]}
    hangs = {"tasks": [{"turns": [turn({"message": "working"}, {"hang": True})]}]}
    asks = {"tasks": [{"turns": [turn(*write_turn("out/notes.txt", "yes\n")["steps"][:2])]}]}
    three = [{"id": f"T{i}", "title": f"task {i}"} for i in range(1, 4)]
    with server.client() as client:
        _, done_id = workspace(client, tmp_path, "done", slow, tasks=three)
        _, steer_id = workspace(client, tmp_path, "steer", hangs, tasks=three[:1])
        asked, ask_id = workspace(client, tmp_path, "ask", asks, tasks=three[:1], rules=[])
        client.put("/api/autonomy", json={"enabled": True})
        for workspace_id in (done_id, steer_id):
            assert (
                client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True}).status_code == 200
            )
        client.post(f"/api/workspaces/{ask_id}/prompt", json={"text": "write some notes"})

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"{server.url}/#token={server.token}")
            assert "token" not in page.url  # the token leaves the address bar at once

            done = page.locator(f"#ws-{done_id}")
            expect(done.get_by_test_id("terminal")).to_have_text("Idle", timeout=30_000)
            expect(done.get_by_test_id("reason")).to_contain_text('"completed":3')

            steer = page.locator(f"#ws-{steer_id}")
            expect(steer.get_by_test_id("task")).to_have_text("T1", timeout=30_000)
            steer.get_by_test_id("steer-text").fill("mind the tests")
            steer.get_by_test_id("steer").click()
            expect(steer.get_by_test_id("steering")).to_contain_text("mind the tests", timeout=10_000)
            steer.get_by_test_id("cancel").click()
            expect(steer.get_by_test_id("terminal")).to_have_text("Cancelled", timeout=30_000)

            ask = page.locator(f"#ws-{ask_id}")
            expect(ask.get_by_test_id("pending")).to_contain_text("Write out/notes.txt", timeout=30_000)
            ask.get_by_test_id("option-allow").click()
            expect(ask.get_by_test_id("terminal")).to_have_text("EndTurn", timeout=30_000)

            artifacts = Path(os.environ.get("LOOP_HARNESS_ARTIFACTS") or tmp_path)
            artifacts.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(artifacts / "status-page.png"), full_page=True)
            browser.close()

    assert (asked.path / "out" / "notes.txt").read_text() == "yes\n"
    assert (artifacts / "status-page.png").stat().st_size > 10_000


def test_the_page_holds_no_data_and_forbids_framing(server):
    with server.client(token="") as client:  # no token: the page loads, the data does not
        page = client.get("/")
        assert page.status_code == 200 and "loop-harness" in page.text
        assert page.headers["x-frame-options"] == "DENY"
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        assert client.get("/api/workspaces").status_code == 401
    with server.client(token="", Origin="http://evil.example") as client:
        assert client.get("/").status_code == 403


def test_the_page_switches_binds_activates_edits_the_policy_and_deactivates(server, tmp_path):
    """The operator's path on the page alone: switch autonomy on, bind the agent, activate, see BlockedPolicy,
    widen the policy, activate again to Idle; then a hanging loop deactivated ends Cancelled."""
    if BROWSER is None:
        pytest.fail("no Chromium: `apt-get install chromium` (Debian), or set LOOP_HARNESS_CHROMIUM", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    writes = write_yaml(tmp_path / "writes.yaml", {"tasks": [{"turns": [write_turn("src/a.txt", "a\n")]}]})
    hangs = {"tasks": [{"turns": [turn({"message": "working"}, {"hang": True})]}]}
    with server.client() as client:
        ws = make_workspace(tmp_path / "edit", ignore=["src/"])
        host = {"provider": "memory", "tasks": [{"id": "T1"}]}
        made = client.post("/api/workspaces", json={"path": str(ws.path), "policy": {"rules": OUT_RULES}, "host": host})
        edit_id = made.json()["id"]
        _, hang_id = workspace(client, tmp_path, "hang", hangs, tasks=[{"id": "T1"}])
        assert client.get("/api/autonomy").json() == {"enabled": False}

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=BROWSER, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"{server.url}/#token={server.token}")
            expect(page.get_by_test_id("autonomy-toggle")).to_have_text("Switch on", timeout=10_000)
            page.get_by_test_id("autonomy-toggle").click()
            expect(page.locator("#autonomy")).to_have_text("· autonomy on", timeout=10_000)

            card = page.locator(f"#ws-{edit_id}")
            card.get_by_test_id("binding-text").fill(f'{{"module": "scripted", "scenario": "{writes}"}}')
            card.get_by_test_id("bind").click()
            expect(page.locator("#error")).to_have_text("", timeout=10_000)
            card.get_by_test_id("activate").click()
            expect(card.get_by_test_id("terminal")).to_have_text("BlockedPolicy", timeout=30_000)

            widened = {"rules": [*OUT_RULES, {"id": "src", "kind": "write", "decision": "allow", "paths": ["src/**"]}]}
            card.get_by_test_id("policy-text").fill(json.dumps(widened))
            card.get_by_test_id("save-policy").click()
            expect(card.get_by_test_id("version")).to_have_text("config version 2", timeout=10_000)
            card.get_by_test_id("activate").click()
            expect(card.get_by_test_id("terminal")).to_have_text("Idle", timeout=30_000)

            hang = page.locator(f"#ws-{hang_id}")
            hang.get_by_test_id("activate").click()
            expect(hang.get_by_test_id("task")).to_have_text("T1", timeout=30_000)
            hang.get_by_test_id("deactivate").click()
            expect(hang.get_by_test_id("terminal")).to_have_text("Cancelled", timeout=30_000)
            browser.close()

        assert client.get(f"/api/workspaces/{edit_id}").json()["policy"] == widened
    assert (ws.path / "src" / "a.txt").read_text() == "a\n"
