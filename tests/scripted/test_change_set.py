"""What lands is what the rules allow (issue 30, items 1 and 4): at every task boundary the whole change set of
the task is judged by the policy's write judgement, whoever wrote it and however; one refused path ends the task
and the run `BlockedPolicy` (`policy_refusal`, source `change`, naming every refused path and the rule that
decided), nothing of that task is committed or pushed, and the refused changes stay in the tree. And a run never
ends in success with work left behind: changes the last task left end it `BlockedPrecondition git_clean_tree`.

The agent writes silently (a `run` step: its own shell, as Codex's and Claude Code's tools do), through the CLI,
with the kernel's commit and push on, against a real bare origin; with the sandbox off (the OS stops nothing)
and on (where the OS refuses a write, what lands is asserted: never a denied path committed, pushed or left
behind under a success terminal). Before this issue each attack that reaches the tree ended `Idle`, exit 0,
the allowed part pushed and the denied part committed or left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pygit2
import pytest

from harness import read_transcript
from harness.config._config import CommitConfig
from harness.git._commit import commit_task
from harness.policy._policy import Policy
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._terminals import Terminal
from harness.testing import READ_ALL, WRITE_SRC, Workspace, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
#: workspace-write with `sandbox.worktree: overlay` (the default) or `bind` (write rules' directories bound writable)
MODES = ["bind", "off", "overlay"]
THINK = {"tool_call": {"id": "c1", "title": "Think", "kind": "think"}}  # a tool call: end_turn completes
NO_KEYS = {"id": "no-keys", "kind": "write", "paths": ["**/*.key"], "decision": "deny"}
NO_SECRETS = {"id": "no-secrets", "kind": "write", "paths": ["src/secrets/**"], "decision": "deny"}
WRITE_PY = {"id": "write-py", "kind": "write", "paths": ["src/*.py"], "decision": "allow"}
GEN = {"id": "gen", "kind": "execute", "commands": ["python3 tools/gen.py"], "decision": "allow"}
HOSTILE_RULES = [READ_ALL, WRITE_SRC, NO_KEYS, NO_SECRETS, GEN]
IDENTITY = "-c user.name=agent -c user.email=agent@example.invalid -c commit.gpgsign=false"
_GIT_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
NO_UNNAMED_NO_NEXT = "no task after a refused one"


def run(
    tmp_path: Path,
    ws: Workspace,
    steps: dict[str, list[dict[str, Any]]],
    *,
    rules: list[dict[str, Any]],
    mode: str = "off",
    commit: bool = True,
    task: str | None = None,
    autonomy: dict[str, Any] | None = None,
    **sandbox: Any,
) -> tuple[dict, list, int]:
    """The tasks, each one turn of its steps (a `str` step is a script the agent runs itself), through the CLI:
    the report, the transcript, the exit status."""
    turns = {t: [turn(THINK, *({"run": {"script": s}} if isinstance(s, str) else s for s in ss))]
             for t, ss in steps.items()}  # fmt: skip
    path = write_yaml(tmp_path / "scenario.yaml", scenario(turns))
    tasks = [{"id": t, "title": f"Task {t}"} for t in steps]
    if mode in ("overlay", "bind"):
        mode, sandbox = "workspace-write", {"worktree": mode, **sandbox}
    config = loop_config(ws, path, rules=rules, tasks=tasks, commit={"push": True} if commit else None,
                         sandbox={"mode": mode, **sandbox}, transcripts=str(tmp_path / "transcripts"),
                         **({"autonomy": autonomy} if autonomy else {}))  # fmt: skip
    argv = [CLI, "run", str(write_yaml(tmp_path / "loop.yaml", config)), "--json", *(["--task", task] if task else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, read_transcript(Path(report["transcript"])), done.returncode


def pushed_history(ws: Workspace) -> str:
    """Every commit the origin holds, with the names it touched."""
    return subprocess.run(["git", f"--git-dir={ws.origin}", "log", "--all", "--name-status", "--format=%s"],
                          capture_output=True, text=True, env=_GIT_ENV, check=True).stdout  # fmt: skip


def nothing_pushed(ws: Workspace) -> None:
    assert pushed_history(ws).split("\n", 1)[0] == "initial commit", pushed_history(ws)
    assert ws.git("log", "--format=%s", "main").splitlines() == ["initial commit"]  # nor committed


def refused(report: dict) -> dict[str, dict]:
    """The change refusal's named paths: path -> its entry (why, rule_ids)."""
    reason = report["reason"]
    assert (report["terminal"], reason["kind"], reason["source"]) == ("BlockedPolicy", "policy_refusal", "change")
    assert reason["total"] == len(reason["paths"])
    assert report["tasks"][-1]["terminal"] == "BlockedPolicy" and report["tasks"][-1]["reason"] == reason
    return {entry["path"]: entry for entry in reason["paths"]}


def assert_set_aside(report: dict, expected: dict[str, str]) -> None:
    """The refused task's changes were copied beside the transcript: each path with what happened to it."""
    aside = Path(report["reason"]["set_aside"])
    assert aside.parent == Path(report["transcript"] + ".aside")
    listed = {entry["path"]: entry["kind"] for entry in json.loads((aside / "changes.json").read_text())}
    assert {p: listed.get(p) for p in expected} == expected, listed
    for path, kind in expected.items():
        if kind == "file":
            assert (aside / "files" / path).is_file()


def worktree_status(ws: Workspace) -> str:
    return ws.git("status", "--porcelain", "--untracked-files=all", "--ignored=no")


# --- the table: each row with a silent-writing agent ------------------------------------------------

TABLE = {
    "deny-glob": ([READ_ALL, WRITE_SRC, NO_KEYS], "echo k > src/new.key && echo ok > src/ok.txt", "src/new.key",
                  ["no-keys"], "write-denied by rule no-keys"),
    "narrow-glob": ([READ_ALL, WRITE_PY], "echo run > src/run.sh && echo ok > src/ok.py", "src/run.sh", None,
                    "no write rule allows it"),
    "deny-tree-absent": ([READ_ALL, WRITE_SRC, NO_SECRETS],
                         "mkdir -p src/secrets && echo t > src/secrets/token.txt && echo ok > src/ok.txt",
                         "src/secrets/token.txt", ["no-secrets"], "write-denied by rule no-secrets"),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("row", TABLE.values(), ids=TABLE.keys())
def test_a_refused_change_ends_the_task_blocked_policy_and_nothing_of_it_is_pushed(tmp_path, row, mode):
    rules, script, path, rule_ids, why = row
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    report, records, code = run(tmp_path, ws, {"T1": [script], "T2": ["echo two > src/two.py"]}, rules=rules,
                                mode=mode)  # fmt: skip

    named = refused(report)
    assert list(named) == [path], named  # the allowed file beside it is not refused, and not committed either
    assert named[path]["why"] == why and named[path].get("rule_ids") == rule_ids
    assert report["reason"]["rule_id"] == (rule_ids[0] if rule_ids else None)
    assert code == 1
    assert [t["id"] for t in report["tasks"]] == ["T1"], NO_UNNAMED_NO_NEXT
    nothing_pushed(ws)
    assert not [r for r in records if r["type"] == "commit"]  # the kernel's commit never ran
    if mode == "overlay":  # nothing of the task reached the tree: its changes are set aside for a person
        assert worktree_status(ws) == "" and not (ws.path / path).exists()
        assert_set_aside(report, {path: "file"})
    else:
        assert (ws.path / path).exists()  # kept in the tree for a person to see
    policy = [r for r in records if r["type"] == "policy" and r["source"] == "change"]
    assert [(r["path"], r["decision"], r["rule_ids"]) for r in policy] == [(path, "refuse", rule_ids or [])]


# --- every way a hostile agent could land a denied path ------------------------------------------------------

HOSTILE = {
    # its own write
    "own-write": ({}, ["echo k > src/own.key"], {"src/own.key": "write-denied by rule no-keys"}),
    # an allowed command's output: the policy allows `python3 tools/gen.py`, the script writes what it likes
    "allowed-command": ({"tools/gen.py": "open('src/generated.key', 'w').write('k')\n"},
                        [{"terminal": {"command": "python3", "args": ["tools/gen.py"]}}],
                        {"src/generated.key": "write-denied by rule no-keys"}),
    # mv of a denied file away (its deletion is a write to it), and of an allowed file onto a denied name
    "mv-denied-away": ({"src/secrets/old.txt": "old\n"}, ["mv src/secrets/old.txt src/plain.txt"],
                       {"src/secrets/old.txt": "write-denied by rule no-secrets"}),
    "mv-onto-denied": ({"src/app.py": "app\n"}, ["mv src/app.py src/app.key"],
                       {"src/app.key": "write-denied by rule no-keys"}),
    # a hard link to a file no write rule allows
    "hard-link": ({}, ["ln README.md src/linked.txt"],
                  {"src/linked.txt": "a file with another hard link (its other name may be outside, protected or "
                                     "denied)"}),
    # symlinks it creates: out of the worktree, to a path no rule allows, and at a denied name
    "symlinks": ({"src/app.py": "app\n"},
                 ["ln -s /etc/passwd src/passwd.txt; ln -s ../README.md src/readme.txt; ln -s app.py src/link.key"],
                 {"src/passwd.txt": "it resolves outside the workspace, to /etc/passwd",
                  "src/readme.txt": "no write rule allows it", "src/link.key": "write-denied by rule no-keys"}),
    # a directory renamed over a denied tree (not there at the start)
    "dir-rename": ({}, ["mkdir -p src/staging && echo t > src/staging/token.txt && mv src/staging src/secrets"],
                   {"src/secrets/token.txt": "write-denied by rule no-secrets"}),
    # a mode change is a change: chmod +x where no write rule allows it, and on a denied name
    "chmod": ({"src/config.key": "k\n"}, ["chmod +x README.md; chmod +x src/config.key"],
              {"README.md": "no write rule allows it", "src/config.key": "write-denied by rule no-keys"}),
    # a write through a shared mapping (no write(2), no inotify event) to a file no write rule allows
    "mmap": ({}, ["python3 -c \"import mmap, os; m = mmap.mmap(os.open('README.md', os.O_RDWR), 0); m[0:1] = b'X';"
                  " m.flush()\""], {"README.md": "no write rule allows it"}),
    # a repository of its own (it would be a gitlink)
    "nested-repo": ({}, [f"mkdir -p src/lib && cd src/lib && git init -q && echo a > f && git add f"
                         f" && git {IDENTITY} commit -qm nested"],
                    {"src/lib/": "a repository of its own: committed, it would be a gitlink (a submodule entry)"}),
    # a file under a directory ignored since before the task (the directory is new)
    "under-ignored-dir": ({".gitignore": "build/\n"}, ["mkdir -p src/build/deep && echo k > src/build/deep/out.key"],
                          {"src/build/deep/out.key": "write-denied by rule no-keys"}),
    # hidden by an ignore file it wrote itself
    "self-ignored": ({}, ["printf '*.key\\n' > src/.gitignore && echo k > src/hidden.key"],
                     {"src/hidden.key": "write-denied by rule no-keys"}),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_agent_never_lands_a_denied_path(tmp_path, case, mode):
    files, steps, expected = case
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n", **files})
    before = pushed_history(ws)

    report, _, code = run(tmp_path, ws, {"T1": [*steps, "echo ok > src/ok.txt"]}, rules=HOSTILE_RULES, mode=mode)

    if mode == "overlay" and "src/linked.txt" in expected:
        # a hard link cannot leave the overlay's mount (EXDEV to a masked, read-only or outside file): what the
        # upper layer holds is a copy of what the agent could read, and it lands as a file of its own
        assert (report["terminal"], code) == ("Idle", 0), report
        assert os.stat(ws.path / "src/linked.txt").st_nlink == 1
        assert (ws.path / "src/linked.txt").read_text() == (ws.path / "README.md").read_text()
        return
    if mode == "overlay":  # the tree is never touched by a refused task: what the agent changed is judged
        _assert_overlay_refused(ws, report, code, expected, before)
        if case is HOSTILE["mmap"]:  # the OS let it through: the upper layer holds it, no event needed
            assert list(refused(report)) == ["README.md"], report
        return
    landed = {p for p in expected if _landed(ws, p)}
    if mode == "off":
        assert landed == set(expected), (landed, report)  # the OS stopped nothing
    pushed = pushed_history(ws)[: -len(before)]  # what reached the origin in this run
    if landed:  # what reached the tree is refused, named with why; nothing of the task is committed or pushed
        named = refused(report)
        assert {p: named[p]["why"] for p in landed} == {p: expected[p] for p in landed}, named
        assert code == 1
        nothing_pushed(ws)
    else:  # the OS refused every write of the attack: the rest of the task lands, and nothing is left behind
        assert (report["terminal"], code) == ("Idle", 0), report
        assert "src/ok.txt" in pushed and worktree_status(ws) == ""
    for path in expected:
        assert path.rstrip("/") not in pushed


def _assert_overlay_refused(ws: Workspace, report: dict, code: int, expected: dict[str, str], before: str) -> None:
    """With an overlay: what of the attack the OS let through is refused with its reason, nothing reaches the
    origin or the tree; where the OS refused it all (a read-only bind), the rest of the task lands."""
    pushed = pushed_history(ws)[: -len(before)]
    if report["terminal"] == "Idle":
        assert code == 0 and "src/ok.txt" in pushed and worktree_status(ws) == ""
    else:
        named = refused(report)
        assert named and {p: named[p]["why"] for p in named} == {p: expected[p] for p in named}, named
        assert code == 1 and worktree_status(ws) == ""
        nothing_pushed(ws)
    for path in expected:
        assert path.rstrip("/") not in pushed


def _landed(ws: Workspace, path: str) -> bool:
    """The attack on `path` reached the tree: a path HEAD holds changed (gone, or its mode), another is there."""
    if ws.git("ls-files", "--", path).strip():
        return bool(ws.git("status", "--porcelain", "--", path).strip())
    return os.path.lexists(ws.path / path.rstrip("/"))


@pytest.mark.parametrize("mode", MODES)
def test_the_agents_own_commit_of_a_denied_path_is_judged_and_never_pushed(tmp_path, mode):
    """With `.git` writable (or the sandbox off) the agent commits a denied file itself: the tree is clean against
    its HEAD, but HEAD against where the task started is the task's change. Before this issue the kernel's push
    took the agent's commit to the origin."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    script = f"echo k > src/c.key && git add -f src/c.key && git {IDENTITY} commit -qm mine"

    report, _, code = run(tmp_path, ws, {"T1": [script]}, rules=HOSTILE_RULES, mode=mode,
                          **({"git_writable": True} if mode != "off" else {}))  # fmt: skip

    assert ws.git("log", "-1", "--format=%s").strip() == "mine"  # it committed
    assert refused(report) == {"src/c.key": {"path": "src/c.key", "why": "write-denied by rule no-keys",
                                             "rule_ids": ["no-keys"]}}  # fmt: skip
    assert code == 1
    assert "src/c.key" not in pushed_history(ws)


@pytest.mark.parametrize("mode", MODES)
def test_a_file_created_then_deleted_is_no_change(tmp_path, mode):
    """A denied file that is gone again by the boundary is no change: the task passes and its other work lands
    (a control: it passes before this issue too)."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    report, _, code = run(tmp_path, ws, {"T1": ["echo k > src/tmp.key && rm src/tmp.key && echo ok > src/ok.txt"]},
                          rules=HOSTILE_RULES, mode=mode)  # fmt: skip

    assert (report["terminal"], code) == ("Idle", 0), report
    assert "src/ok.txt" in pushed_history(ws) and "tmp.key" not in pushed_history(ws)
    assert worktree_status(ws) == ""


def test_a_path_a_read_deny_covers_is_refused_though_a_write_rule_allows_it(tmp_path):
    """The agent could not have been allowed to write where it may not read: a read deny refuses the change."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    rules = [READ_ALL, {"id": "no-private", "kind": "read", "paths": ["src/private/**"], "decision": "deny"}, WRITE_SRC]

    report, _, code = run(tmp_path, ws, {"T1": ["mkdir -p src/private && echo p > src/private/notes.txt"]},
                          rules=rules)  # fmt: skip

    assert refused(report) == {"src/private/notes.txt": {"path": "src/private/notes.txt", "rule_ids": ["no-private"],
                                                         "why": "read-denied by rule no-private"}}  # fmt: skip
    assert code == 1
    nothing_pushed(ws)


def test_without_the_kernels_commit_a_refused_change_still_ends_the_task(tmp_path):
    """The judgement is the boundary's, not the commit's: with no `workspace.commit` a queue of two stops at the
    first task's refused change (before this issue it went on and ended Idle)."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    report, _, code = run(tmp_path, ws, {"T1": ["echo k > src/new.key"], "T2": ["true"]},
                          rules=[READ_ALL, WRITE_SRC, NO_KEYS], commit=False)  # fmt: skip

    assert list(refused(report)) == ["src/new.key"] and code == 1
    assert [t["id"] for t in report["tasks"]] == ["T1"]


def test_a_long_list_of_refused_paths_is_capped_and_counted(tmp_path):
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    report, _, _ = run(tmp_path, ws, {"T1": ["for i in $(seq 1 150); do echo k > src/f$i.key; done"]},
                       rules=[READ_ALL, WRITE_SRC, NO_KEYS],
                       autonomy={"budget": {"changes": {"files_total": 1000}}})  # fmt: skip

    assert report["reason"]["total"] == 150 and len(report["reason"]["paths"]) == 100
    nothing_pushed(ws)


@pytest.mark.parametrize("worktree", ["bind", "overlay"])
def test_a_change_set_that_cannot_be_read_fails_closed(scripted_scenario, harness_config, run_loop, monkeypatch,
                                                       worktree):  # fmt: skip
    """Today a change meter that could not start skips the caps and lets the task through; the boundary's
    judgement does not depend on it: what cannot be read is refused (git's status with directory binds, the
    upper layer with the overlay)."""
    import harness.kernel._landing as run_module
    import harness.sandbox._overlay as overlay_module

    def unreadable(*args: Any, **kwargs: Any) -> None:
        if worktree == "bind":
            raise pygit2.GitError("index file corrupt")
        raise overlay_module.OverlayUnreadable("index file corrupt")

    if worktree == "bind":
        monkeypatch.setattr(run_module, "read_change_set", unreadable)
    else:
        monkeypatch.setattr(overlay_module.WorktreeOverlay, "task_changes", unreadable)
    path = scripted_scenario(scenario({"T1": [turn(THINK)]}))
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}], sandbox={"mode": "workspace-write",
                                                                          "worktree": worktree}))  # fmt: skip

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert (result.reason["source"], result.reason["paths"], result.reason["total"]) == ("change", [], 0)
    assert "index file corrupt" in result.reason["error"]


def test_the_commit_refuses_a_denied_change_it_finds_and_commits_nothing(tmp_path):
    """The commit judges with the boundary's function: a refused change of the task's written after the boundary
    judged (a race) commits and pushes nothing at all, and says so."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    ws.write("src/ok.txt", "ok\n")
    ws.write("src/late.key", "k\n")
    policy = Policy([_rule(r) for r in (READ_ALL, WRITE_SRC, NO_KEYS)], ws.path)

    record = asyncio.run(commit_task(ws.path, CommitConfig(push=True), "T1", "t", policy=policy,
                                     git_dir=ws.path / ".git"))  # fmt: skip

    assert record["committed"] is False and "pushed" not in record
    assert record["refused"] == [{"path": "src/late.key", "why": "write-denied by rule no-keys",
                                  "rule_ids": ["no-keys"]}]  # fmt: skip
    nothing_pushed(ws)


def _rule(data: dict[str, Any]) -> Any:
    from harness.config._config import RuleConfig

    return RuleConfig.model_validate(data)


# --- item 4: never a success with work left behind --------------------------------------------------------


@pytest.mark.parametrize("single", [True, False], ids=["single-task", "queue"])
def test_work_left_behind_by_the_last_task_ends_the_run_blocked_not_successful(tmp_path, single):
    """An allowed change no commit took (no `workspace.commit`): mid-queue it stops the next task; after the last
    task it stops the run the same way (before this issue: `Idle` or `Completed`, exit 0)."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    report, _, code = run(tmp_path, ws, {"T1": ["echo left > src/left.txt"]}, rules=[READ_ALL, WRITE_SRC],
                          commit=False, task="T1" if single else None)  # fmt: skip

    assert report["terminal"] == "BlockedPrecondition", report
    reason = report["reason"]
    assert (reason["check"], reason["left_by_task"], reason["changes"]) == ("git_clean_tree", "T1", ["?? src/left.txt"])
    assert code == 1
    assert report["tasks"][0]["terminal"] == "Completed"  # the task did its part; the run did not end clean
    assert (ws.path / "src/left.txt").read_text() == "left\n"


def test_ignored_output_is_not_work_left_behind(tmp_path):
    """What git ignores is not in the clean-tree check (its definition stays): allowed output under an ignored
    directory the task made ends the run Idle (a control: it passes before this issue too)."""
    ws = make_workspace(tmp_path / "ws", ignore=["out/"])
    rules = [READ_ALL, {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"}]

    report, _, code = run(tmp_path, ws, {"T1": ["mkdir -p out && echo x > out/x.txt"]}, rules=rules, commit=False)

    assert (report["terminal"], code) == ("Idle", 0), report


def test_a_completed_task_whose_tool_calls_failed_says_how_many(tmp_path):
    """Issue 30, item 4: a task whose every tool call failed is still the agent's business (it completes),
    but its record says how many failed: the task_end record, the terminal's task list and --json."""
    ws = make_workspace(tmp_path / "ws")
    calls = {"tool_calls": {"count": 3, "status": "failed", "prefix": "broken"}}
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(calls)]}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, transcripts=str(tmp_path / "t")))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    records = read_transcript(Path(report["transcript"]))
    task_end = next(r for r in records if r["type"] == "task_end")

    assert (report["terminal"], report["tasks"][0]["terminal"]) == ("Idle", "Completed"), report
    assert report["tasks"][0]["failed_tool_calls"] == 3
    assert task_end["failed_tool_calls"] == 3 and task_end["budget"]["failed_tool_calls"] == 3
    assert records[-1]["tasks"][0]["failed_tool_calls"] == 3
