"""Loops driven through the control server: bind, activate, watch a queue drain, steer, cancel, the
preconditions each typed, history kept, kill -9 and restart, and one workspace never driven by two loops."""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_E2E
from harness.testing import OUT_RULES, make_workspace, write_yaml
from scripted_agents.presets import turn, write_turn
from tests.helpers.server_api import wait_for

pytestmark = LOOP_E2E

TASKS = [{"id": "T1", "title": "First"}, {"id": "T2", "title": "Second"}]
POLICY = {"rules": OUT_RULES}


def setup_workspace(client, tmp_path, scenario, *, tasks=TASKS, policy=POLICY, name="ws", sandbox=None):
    """A worktree (out/ ignored) registered with a memory host, the scripted agent bound, autonomy on."""
    ws = make_workspace(tmp_path / name, ignore=["out/"])
    path = write_yaml(tmp_path / f"{name}-scenario.yaml", scenario)
    body = {"path": str(ws.path), "host": {"provider": "memory", "tasks": tasks}, "policy": policy}
    made = client.post("/api/workspaces", json={**body, **({"sandbox": sandbox} if sandbox else {})})
    assert made.status_code == 201, made.text
    workspace_id = made.json()["id"]
    assert client.put("/api/autonomy", json={"enabled": True}).status_code == 200
    bound = client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "scripted",
                                                                             "scenario": str(path)})  # fmt: skip
    assert bound.status_code == 200, bound.text
    return ws, workspace_id


def register_again(client, ws, tmp_path):
    """`ws`, set up on one server by `setup_workspace`, registered, bound and switched on in another."""
    made = client.post("/api/workspaces", json={"path": str(ws.path), "policy": POLICY,
                                                "host": {"provider": "memory", "tasks": TASKS}})  # fmt: skip
    workspace_id = made.json()["id"]
    client.put("/api/autonomy", json={"enabled": True})
    client.put(
        f"/api/workspaces/{workspace_id}/agent/binding",
        json={"module": "scripted", "scenario": str(tmp_path / "ws-scenario.yaml")},
    )
    return workspace_id


WRITES = {"tasks": [{"turns": [write_turn("out/result.txt", "done\n")]}]}
HANGS = {"tasks": [{"turns": [turn({"message": "working"}, {"hang": True})]}]}


def test_an_activated_workspace_drains_its_queue(server, tmp_path):
    with server.client() as client:
        ws, workspace_id = setup_workspace(client, tmp_path, WRITES)
        assert client.get(f"/api/workspaces/{workspace_id}/loop").json()["state"] == "new"
        activated = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        assert activated.status_code == 200, activated.text

        status = wait_for(client, workspace_id, lambda s: s["state"] == "ended")

        assert (status["terminal"], status["reason"]) == ("Idle", {"kind": "queue_empty", "completed": 2})
        assert [(t["id"], t["terminal"]) for t in status["tasks"]] == [("T1", "Completed"), ("T2", "Completed")]
        assert (ws.path / "out" / "result.txt").read_text() == "done\n"
        sessions = client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]
        assert [(s["id"], s["module"], s["terminal"]) for s in sessions] == [(status["session"], "scripted", "Idle")]
        assert client.get(f"/api/workspaces/{workspace_id}").json()["active"] is False


def test_steering_is_queued_and_cancel_ends_the_loop_cancelled(server, tmp_path):
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, HANGS)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        running = wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")

        steered = client.post(f"/api/workspaces/{workspace_id}/loop/steering", json={"text": "mind the tests"})
        assert steered.status_code == 202 and steered.json()["session"] == running["session"]
        assert client.get(f"/api/workspaces/{workspace_id}/loop").json()["steering"] == ["mind the tests"]

        other = client.put(
            f"/api/workspaces/{workspace_id}/agent/binding",
            json={"module": "command", "command": ["true"], "supports_permission_requests": True},
        )
        assert other.status_code == 409 and other.json()["error"]["session"] == running["session"]
        bound = client.get(f"/api/workspaces/{workspace_id}").json()["binding"]
        elsewhere = write_yaml(tmp_path / "other-scenario.yaml", WRITES)  # the same module, another agent
        same_module = client.put(f"/api/workspaces/{workspace_id}/agent/binding",
                                 json={**bound, "scenario": str(elsewhere)})  # fmt: skip
        assert same_module.status_code == 409 and same_module.json()["error"]["kind"] == "session_live"
        assert client.get(f"/api/workspaces/{workspace_id}").json()["binding"] == bound  # nothing changed
        assert client.put(f"/api/workspaces/{workspace_id}/agent/binding", json=bound).status_code == 200  # as is
        assert client.delete(f"/api/workspaces/{workspace_id}/agent/binding").status_code == 409

        assert client.post(f"/api/workspaces/{workspace_id}/loop/cancel").status_code == 202
        ended = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
        assert ended["terminal"] == "Cancelled"
        assert client.post(f"/api/workspaces/{workspace_id}/loop/cancel").json()["error"]["kind"] == "no_live_session"
        assert client.delete(f"/api/workspaces/{workspace_id}/agent/binding").status_code == 200


@pytest.mark.parametrize("broken", ["autonomy_disabled", "not_bound", "agent_permission_support", "policy_non_empty",
                                    "precondition"])  # fmt: skip
def test_each_activation_precondition_is_typed(server, tmp_path, broken):
    with server.client() as client:
        policy = {"rules": []} if broken == "policy_non_empty" else POLICY
        ws, workspace_id = setup_workspace(client, tmp_path, WRITES, policy=policy)
        if broken == "autonomy_disabled":
            client.put("/api/autonomy", json={"enabled": False})
        elif broken == "not_bound":
            client.delete(f"/api/workspaces/{workspace_id}/agent/binding")
        elif broken == "agent_permission_support":
            client.put(f"/api/workspaces/{workspace_id}/agent/binding", json={"module": "command", "command": ["x"]})
        elif broken == "precondition":
            ws.write("README.md", "changed by nobody's task\n")

        answer = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})

        assert answer.status_code == 409 and answer.json()["error"]["kind"] == broken, answer.text
        if broken == "precondition":
            assert answer.json()["error"]["reason"]["check"] == "git_clean_tree"
        assert client.get(f"/api/workspaces/{workspace_id}/loop").json()["state"] == "new"  # nothing started
        assert client.get(f"/api/workspaces/{workspace_id}").json()["active"] is False


def test_kill_9_mid_run_then_restart_marks_it_failed_restarted_and_ends_its_agent(server_factory, tmp_path):
    first = server_factory()
    with first.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, HANGS)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        running = wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")
    agents = [p for p in psutil.process_iter(["cmdline"]) if "ws-scenario.yaml" in " ".join(p.info["cmdline"] or [])]
    assert agents, "the scripted agent is running"
    first.kill()

    second = server_factory(first.state)
    with second.client() as client:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
        assert (status["state"], status["session"], status["terminal"], status["reason"]) == (
            "ended",
            running["session"],
            "Failed",
            {"kind": "restarted"},
        )
        assert client.get(f"/api/workspaces/{workspace_id}").json()["active"] is False
    gone = psutil.wait_procs(agents, timeout=10)[1] == []
    assert gone, f"left running: {[p.pid for p in agents if p.is_running()]}"


def test_a_task_completed_before_kill_9_is_skipped_after_the_restart(server_factory, tmp_path):
    """T1 completes, the server dies during T2; activated again after the restart, the loop skips T1."""
    first = server_factory()
    t1_then_hang = {"tasks": [{"id": "T1", "turns": [write_turn("out/result.txt", "done\n")]},
                              {"id": "T2", "turns": [turn({"hang": True})]}]}  # fmt: skip
    with first.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, t1_then_hang)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T2")
    first.kill()

    second = server_factory(first.state)
    with second.client() as client:
        assert client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True}).status_code == 200
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T2")
        sessions = client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]
        assert [s["terminal"] for s in sessions] == ["Failed", None]  # the dead one, and this one running
        skipped = [r for r in read_transcript(Path(sessions[1]["transcript"])) if r["type"] == "task_skipped"]
        assert [r["task"]["id"] for r in skipped] == ["T1"], skipped
        client.post(f"/api/workspaces/{workspace_id}/loop/cancel")
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")


def test_one_workspace_is_never_driven_by_two_servers(server_factory, tmp_path):
    a = server_factory(tmp_path / "state-a")
    b = server_factory(tmp_path / "state-b")
    with a.client() as client_a, b.client() as client_b:
        ws, id_a = setup_workspace(client_a, tmp_path, HANGS)
        id_b = register_again(client_b, ws, tmp_path)
        client_a.put(f"/api/workspaces/{id_a}/agent/autonomy", json={"active": True})
        wait_for(client_a, id_a, lambda s: s["state"] == "running")

        refused = client_b.put(f"/api/workspaces/{id_b}/agent/autonomy", json={"active": True})

        assert refused.status_code == 409 and refused.json()["error"]["kind"] == "workspace_busy", refused.text
        client_a.post(f"/api/workspaces/{id_a}/loop/cancel")
        wait_for(client_a, id_a, lambda s: s["state"] == "ended")


def hanging_loop(server, tmp_path) -> str:
    """A workspace whose loop is running T1, which never ends by itself; its id."""
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, HANGS)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")
    return workspace_id


def test_stopping_the_server_cancels_its_loops(server_factory, tmp_path):
    first = server_factory()
    workspace_id = hanging_loop(first, tmp_path)
    first.kill(signal.SIGTERM)  # uvicorn's graceful stop: the loops are cancelled, then it re-raises the signal

    second = server_factory(first.state)
    with second.client() as client:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
        assert (status["terminal"], status["reason"]["kind"]) == ("Cancelled", "user_cancel"), status


def test_the_loop_is_watched_as_server_sent_events(server, tmp_path):
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, WRITES)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        seen = []
        with client.stream("GET", f"/api/workspaces/{workspace_id}/loop/events") as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            for line in events.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[len("data: ") :]))
        assert seen[-1]["state"] == "ended" and seen[-1]["terminal"] == "Idle"
        assert all(a != b for a, b in itertools.pairwise(seen))  # an event is a change
        assert {s.get("task") for s in seen if s["state"] == "running"} <= {None, "T1", "T2"}
        # with no loop running the stream gives the last status and ends
        with client.stream("GET", f"/api/workspaces/{workspace_id}/loop/events") as events:
            lines = [line for line in events.iter_lines() if line.startswith("data: ")]
        assert [json.loads(line[6:])["terminal"] for line in lines] == ["Idle"]
        assert client.get("/api/workspaces/nope/loop/events").status_code == 404


def test_loops_in_one_server_never_cross_one_hostile(server, tmp_path):
    """Three workspaces at once: two well-behaved agents, one hostile that tries to write into another's
    worktree itself (the sandbox stops it) and through the client (the policy refuses: BlockedPolicy)."""
    slow = {"tasks": [{"turns": [turn({"sleep": 0.3}, *write_turn("out/result.txt", "done\n")["steps"])]}]}
    tasks = [{"id": f"T{i}", "title": f"task {i}"} for i in range(1, 4)]
    with server.client() as client:
        a, id_a = setup_workspace(client, tmp_path, slow, tasks=tasks, name="a")
        b, id_b = setup_workspace(client, tmp_path, slow, tasks=tasks, name="b")
        target = b.path / "out" / "stolen.txt"
        hostile = {"tasks": [{"turns": [turn(
            {"run": {"script": f"echo pwned > {target}; echo pwned > {b.path}/README.md"}},
            {"run": {"script": f"cat {a.path}/README.md"}},
            {"run": {"script": f"cat {server.state}/token"}},
            {"run": {"script": f"cat {server.state}/workspaces/{id_a}/transcripts/*.jsonl"}},
            {"write": {"path": str(target), "content": "pwned\n"}},
        )]}]}  # fmt: skip
        _, id_h = setup_workspace(client, tmp_path, hostile, tasks=tasks[:1], name="h")
        for workspace_id in (id_a, id_b, id_h):
            assert (
                client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True}).status_code == 200
            )
        wait_for(client, id_a, lambda s: s["state"] == "running")
        client.post(f"/api/workspaces/{id_a}/loop/steering", json={"text": "only for a"})

        ended = {w: wait_for(client, w, lambda s: s["state"] == "ended") for w in (id_a, id_b, id_h)}

    assert [ended[w]["terminal"] for w in (id_a, id_b)] == ["Idle", "Idle"]
    assert all(t["terminal"] == "Completed" for w in (id_a, id_b) for t in ended[w]["tasks"])
    assert ended[id_h]["terminal"] == "BlockedPolicy", ended[id_h]
    assert not target.exists() and (b.path / "README.md").read_text() == "A workspace for loop-harness.\n"
    assert b.git("status", "--porcelain") == ""
    with server.client() as client:
        transcripts = {w: Path(client.get(f"/api/workspaces/{w}/sessions").json()["sessions"][0]["transcript"])
                       for w in (id_a, id_b, id_h)}  # fmt: skip
    assert len(set(transcripts.values())) == 3
    # nobody's records in another's (the sandbox and the bwrap argv name what they hide: the other worktrees)
    text = {w: json.dumps([r for r in read_transcript(p) if r["type"] not in ("sandbox", "agent_start")])
            for w, p in transcripts.items()}  # fmt: skip
    assert str(b.path) not in text[id_a] and str(a.path) not in text[id_b]
    steered = [w for w, p in transcripts.items() if any(r["type"] == "steer_queued" for r in read_transcript(p))]
    assert steered == [id_a]
    ran = [r["msg"]["params"]["update"]["content"]["text"] for r in read_transcript(transcripts[id_h])
           if r["type"] == "rpc" and "agent_message_chunk" in json.dumps(r) and "ran '" in json.dumps(r)]  # fmt: skip
    outputs = [text.split("\n", 1)[1] for text in ran]  # what each printed, after "ran '<script>' -> exit N"
    assert len(outputs) == 4, ran  # a hidden file reads empty, a hidden directory's files do not exist
    assert "A workspace for loop-harness" not in outputs[1] and server.token not in outputs[2], outputs  # unread
    assert '"seq"' not in outputs[3]  # nor another workspace's transcript
    hidden = next(r for r in read_transcript(transcripts[id_h]) if r["type"] == "sandbox")
    assert str(a.path) in json.dumps(hidden) and str(b.path) in json.dumps(hidden)


def test_a_resume_naming_another_module_than_the_bind_is_refused(server, tmp_path):
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, WRITES)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        first = wait_for(client, workspace_id, lambda s: s["state"] == "ended")["session"]
        client.put(
            f"/api/workspaces/{workspace_id}/agent/binding",
            json={"module": "command", "command": ["true"], "supports_permission_requests": True},
        )

        refused = client.post(f"/api/workspaces/{workspace_id}/sessions/{first}/resume")

        error = refused.json()["error"]
        assert refused.status_code == 409 and (error["kind"], error["module"], error["bound"]) == (
            "module_mismatch",
            "scripted",
            "command",
        )
        assert len(client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]) == 1  # none started
        assert client.post(f"/api/workspaces/{workspace_id}/sessions/nope/resume").status_code == 404
        client.put(
            f"/api/workspaces/{workspace_id}/agent/binding",
            json={"module": "scripted", "scenario": str(tmp_path / "ws-scenario.yaml")},
        )
        resumed = client.post(f"/api/workspaces/{workspace_id}/sessions/{first}/resume")
        assert resumed.status_code == 200 and resumed.json()["resumes"] == first
        wait_for(client, workspace_id, lambda s: s["state"] == "ended" and s["session"] == resumed.json()["session"])


def test_the_token_from_the_environment_never_reaches_an_agent(server_factory, tmp_path):
    server = server_factory(env={"LOOP_HARNESS_SERVER_TOKEN": "s3cret-server-token"})
    assert not (server.state / "token").exists()  # the environment's token is the one in use
    ws = make_workspace(tmp_path / "ws")
    with server.client(token="s3cret-server-token") as client:
        workspace_id = client.post("/api/workspaces", json={"path": str(ws.path), "policy": POLICY}).json()["id"]
        client.put(
            f"/api/workspaces/{workspace_id}/agent/binding",
            json={
                "module": "command",
                "command": ["sh", "-c", "env >&2; exit 3"],
                "supports_permission_requests": True,
            },
        )
        client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "show me"})
        status = wait_for(client, workspace_id, lambda s: s["state"] == "ended")
    assert status["terminal"] == "Failed" and "PATH=" in json.dumps(status["reason"])  # its env reached stderr
    assert "s3cret-server-token" not in json.dumps(status["reason"])


def test_switching_autonomy_off_cancels_the_loops_and_a_prompt_session_blocks_activation(server, tmp_path):
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, HANGS)
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "running" and s.get("task") == "T1")
        assert client.put("/api/autonomy", json={"enabled": False}).status_code == 200
        assert wait_for(client, workspace_id, lambda s: s["state"] == "ended")["terminal"] == "Cancelled"

        client.put("/api/autonomy", json={"enabled": True})
        client.post(f"/api/workspaces/{workspace_id}/prompt", json={"text": "hang"})
        wait_for(client, workspace_id, lambda s: s["state"] == "running")
        refused = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        assert refused.status_code == 409 and refused.json()["error"]["kind"] == "session_live", refused.text
        client.post(f"/api/workspaces/{workspace_id}/loop/cancel")
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")


def test_a_signal_stops_the_server_even_with_an_event_stream_open(server_factory, tmp_path):
    import threading

    first = server_factory()
    workspace_id = hanging_loop(first, tmp_path)

    def watch() -> None:
        with first.client() as watcher, watcher.stream("GET", f"/api/workspaces/{workspace_id}/loop/events") as s:
            for _ in s.iter_lines():
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.5)
    first.process.send_signal(signal.SIGTERM)
    first.process.wait(timeout=20)  # an open stream must not hold the shutdown that ends its loop
    first.process.stderr.close()
    watcher.join(timeout=10)
    second = server_factory(first.state)
    with second.client() as client:
        assert client.get(f"/api/workspaces/{workspace_id}/loop").json()["terminal"] == "Cancelled"


def test_an_agent_that_may_commit_cannot_free_its_workspace_for_a_second_loop(server_factory, tmp_path):
    """With `git_writable` the agent may write `.git`: removing the lock file there would let a second server
    lock a fresh one and drive the same worktree. The lock lives where `.git` stays read-only to it."""
    a = server_factory(tmp_path / "state-a")
    b = server_factory(tmp_path / "state-b")
    unlock = {"tasks": [{"turns": [turn(
        {"run": {"script": "rm -fv .git/info/loop-harness.lock .git/loop-harness.lock"}},
        {"hang": True})]}]}  # fmt: skip
    with a.client() as client_a, b.client() as client_b:
        ws, id_a = setup_workspace(client_a, tmp_path, unlock, sandbox={"git_writable": True})
        client_a.put(f"/api/workspaces/{id_a}/agent/autonomy", json={"active": True})
        wait_for(client_a, id_a, lambda s: s["state"] == "running" and s.get("task") == "T1")
        time.sleep(1.0)  # the agent's removal has run by now
        id_b = register_again(client_b, ws, tmp_path)

        refused = client_b.put(f"/api/workspaces/{id_b}/agent/autonomy", json={"active": True})

        assert refused.status_code == 409 and refused.json()["error"]["kind"] == "workspace_busy", refused.text
        client_a.post(f"/api/workspaces/{id_a}/loop/cancel")
        wait_for(client_a, id_a, lambda s: s["state"] == "ended")


def ran_outputs(transcript: Path) -> list[str]:
    """What each `run` step of a scripted agent printed, in order (after "ran '<script>' -> exit N")."""
    return [r["msg"]["params"]["update"]["content"]["text"].split("\n", 1)[1] for r in read_transcript(transcript)
            if r["type"] == "rpc" and "agent_message_chunk" in json.dumps(r) and "ran '" in json.dumps(r)]  # fmt: skip


def test_transcripts_of_later_sessions_and_the_repository_behind_a_linked_worktree_are_hidden(server, tmp_path):
    """The hostile agent starts, waits while another workspace registers and runs, then looks: for that
    session's transcript, and into the repository behind a linked worktree registered before it started
    (the repository lies outside that worktree). A worktree registered after a loop started is not hidden
    from it: docs/server.md says so."""
    with server.client() as client:
        repository = make_workspace(tmp_path / "repository")  # not registered: only its linked worktree is
        linked = tmp_path / "linked"
        repository.git("worktree", "add", "-q", "-b", "side", str(linked))
        assert client.post("/api/workspaces", json={"path": str(linked), "policy": POLICY}).status_code == 201
        # the signal outside the worktree: an overlay shows the agent the worktree as its run found it
        wait = f"for i in $(seq 600); do [ -e {tmp_path}/go ] && break; sleep 0.1; done"
        look = {"tasks": [{"turns": [turn(
            {"run": {"script": f"{wait}; ls -R {server.state}"}},
            {"run": {"script": f"ls -A {repository.path}/.git; git -C {repository.path} log --oneline | head -3"}},
            {"run": {"script": f"cat {linked}/README.md"}},
        )]}]}  # fmt: skip
        _, id_h = setup_workspace(client, tmp_path, look, tasks=TASKS[:1], name="h")
        client.put(f"/api/workspaces/{id_h}/agent/autonomy", json={"active": True})
        wait_for(client, id_h, lambda s: s["state"] == "running" and s.get("task") == "T1")

        _, id_b = setup_workspace(client, tmp_path, WRITES, name="later")
        client.put(f"/api/workspaces/{id_b}/agent/autonomy", json={"active": True})
        assert wait_for(client, id_b, lambda s: s["state"] == "ended")["terminal"] == "Idle"
        (tmp_path / "go").write_text("")
        wait_for(client, id_h, lambda s: s["state"] == "ended")
        transcript = Path(client.get(f"/api/workspaces/{id_h}/sessions").json()["sessions"][0]["transcript"])

    listing, git, readme = ran_outputs(transcript)[:3]  # the first turn's three looks
    assert listing.splitlines() == [f"{server.state}:"], listing  # the state directory reads empty
    assert "HEAD" not in git and "initial commit" not in git, git  # the repository behind the linked worktree
    assert "A workspace for loop-harness" not in readme, readme


def test_activations_racing_on_one_workspace_start_one_session(server, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, HANGS)

        def activate(_: int) -> tuple[int, str]:
            with server.client() as own:  # a connection each: the requests really overlap
                answer = own.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
                body = answer.json()
                return answer.status_code, body.get("session") or body["error"]["kind"]

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(activate, range(6)))
        sessions = client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"]
        assert len(sessions) == 1, (answers, sessions)
        assert {what for status, what in answers if status == 200} == {sessions[0]["id"]}, answers
        assert all(what == "session_live" for status, what in answers if status != 200), answers
        client.post(f"/api/workspaces/{workspace_id}/loop/cancel")
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")


def test_a_workspaces_own_hidden_paths_stay_hidden_beside_the_servers(server, tmp_path):
    secret = tmp_path / "secrets"
    secret.mkdir()
    (secret / "key").write_text("hunter2\n")
    look = {"tasks": [{"turns": [turn({"run": {"script": f"cat {secret}/key"}})]}]}
    with server.client() as client:
        _, workspace_id = setup_workspace(client, tmp_path, look, tasks=TASKS[:1], sandbox={"hide": [str(secret)]})
        client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        wait_for(client, workspace_id, lambda s: s["state"] == "ended")
        transcript = Path(client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"][0]["transcript"])
    printed = ran_outputs(transcript)
    assert printed and not any("hunter2" in text for text in printed), printed


def test_a_symlink_planted_as_the_worktree_lock_is_refused_and_followed_nowhere(server, tmp_path):
    victim = tmp_path / "thesis.txt"
    victim.write_text("years of work\n")
    with server.client() as client:
        ws, workspace_id = setup_workspace(client, tmp_path, WRITES)
        (ws.path / ".git" / "info").mkdir(exist_ok=True)
        (ws.path / ".git" / "info" / "loop-harness.lock").symlink_to(victim)
        refused = client.put(f"/api/workspaces/{workspace_id}/agent/autonomy", json={"active": True})
        assert (refused.status_code, refused.json()["error"]["kind"]) == (409, "workspace_busy"), refused.text
        assert "cannot be taken" in refused.json()["error"]["message"]
        assert client.get(f"/api/workspaces/{workspace_id}/sessions").json()["sessions"] == []
    assert victim.read_text() == "years of work\n"
