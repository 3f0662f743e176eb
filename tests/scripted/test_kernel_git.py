"""The git the kernel runs (issue 29): it never executes anything the agent could write, and its commit
follows the policy, not the ignore files the agent wrote (docs/kernel-git.md lists each way git could run
a program, and the test here that shows the kernel's git does not).

Each attack is made by a hostile scripted agent that runs shell itself (as Codex and Claude Code do), through
the CLI, with the sandbox on (the default: `.git` read-only) and, where it means something, off. Every attack
here fails on the kernel's commit before this issue (`git status` recursing into a submodule, `git add -A`,
git finding a repository from the workspace); the hook, libgit2 and transport tests show what held.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pygit2
import pytest
from pygit2.enums import DiffOption

from harness import read_transcript
from harness.git._preconditions import read_git_state
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import READ_ALL, WRITE_SRC, Workspace, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
MODES = ["workspace-write", "off"]
SECRET = "TOPSECRET-" + secrets.token_hex(8)
#: Only in the kernel's environment: the agent's is trimmed. A program the kernel's git runs sees it.
KERNEL_MARK = "KERNEL-ONLY-" + secrets.token_hex(8)
RULES = [
    READ_ALL,
    {"id": "no-secret", "kind": "read", "paths": ["src/secret/**"], "decision": "deny"},
    WRITE_SRC,
    {"id": "no-secret-write", "kind": "write", "paths": ["src/secret/**"], "decision": "deny"},
]
THINK = {"tool_call": {"id": "c1", "title": "Think", "kind": "think"}}  # a tool call: end_turn completes
IDENTITY = "-c user.name=agent -c user.email=agent@example.invalid -c commit.gpgsign=false"
_GIT_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def run(
    tmp_path: Path,
    ws: Workspace,
    scripts: dict[str, str],
    mode: str,
    *,
    rules: list[dict[str, Any]] = RULES,
    workspace: Path | None = None,
    **sandbox: Any,
) -> tuple[dict, list]:
    """The tasks, each one turn that runs its script, through the CLI with the kernel's commit and push on
    (`workspace`: a directory below the worktree's root instead of the root)."""
    turns = {task: [turn(THINK, {"run": {"script": script}})] for task, script in scripts.items()}
    path = write_yaml(tmp_path / "scenario.yaml", scenario(turns))
    tasks = [{"id": task, "title": f"Task {task}"} for task in scripts]
    config = loop_config(workspace or ws, path, rules=rules, tasks=tasks, commit={"message": "{id}: {title}"},
                         sandbox={"mode": mode, **sandbox}, transcripts=str(tmp_path / "transcripts"))  # fmt: skip
    done = subprocess.run([CLI, "run", str(write_yaml(tmp_path / "loop.yaml", config)), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KERNEL_ONLY_MARK": KERNEL_MARK})  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, read_transcript(Path(report["transcript"]))


def commit_records(records: list[dict]) -> dict[str, dict]:
    return {r["task"]: r for r in records if r["type"] == "commit"}


def named(record: dict) -> dict[str, str]:
    """What the commit record names as not committed: path -> why."""
    return {entry["path"]: entry["why"] for entry in record.get("not_committed", [])}


def origin(ws: Workspace, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={ws.origin}", *args], capture_output=True, env=_GIT_ENV,
                          check=True).stdout  # fmt: skip


def pushed_tree(ws: Workspace) -> dict[str, bytes]:
    """The origin's main: path -> contents (a gitlink: `gitlink`)."""
    tree = {}
    for entry in origin(ws, "ls-tree", "-r", "-z", "main").split(b"\0"):
        if entry:
            meta, path = entry.split(b"\t", 1)
            _, kind, oid = meta.split()
            tree[os.fsdecode(path)] = origin(ws, "cat-file", "blob", oid.decode()) if kind == b"blob" else b"gitlink"
    return tree


def pushed_history(ws: Workspace) -> bytes:
    """Every commit the origin holds, with its patch: whatever reached it, in any commit."""
    return origin(ws, "log", "--all", "-p", "--format=%H%n%B")


def nothing_leaked(tmp_path: Path, *markers: Path) -> None:
    """No program the kernel's git ran: its marker files never appear, and the kernel's environment is in no
    file anywhere under the test's directory (the worktree, the origin, the transcripts)."""
    for marker in markers:
        assert not marker.exists(), f"{marker.name} was written: the kernel's git ran it"
    for top, _, files in os.walk(tmp_path):
        for name in files:
            path = Path(top, name)
            if path.is_file() and not path.is_symlink():
                assert KERNEL_MARK.encode() not in path.read_bytes(), f"the kernel's environment reached {path}"


def nested_repo(directory: str, *, filter_marker: Path, fsmonitor_marker: Path) -> str:
    """Shell that makes `directory` a repository of its own, committed and clean, whose config then gets a
    clean filter (its attributes select it for every file) and an fsmonitor: programs any git that recurses
    into it would run, with its environment."""
    return f"""set -e
mkdir -p {directory} && cd {directory}
git init -q && echo a > f && echo '* filter=x' > .gitattributes
git add -A && git {IDENTITY} commit -qm nested
git config filter.x.clean "sh -c 'env > {filter_marker}; cat'"
git config core.fsmonitor "sh -c 'env > {fsmonitor_marker}'"
cd - >/dev/null"""


# --- 1: no recursion into a repository the agent made -----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_nested_repository_is_never_committed_and_its_filter_never_runs(tmp_path, mode):
    """Task 1 makes src/evil a repository with a clean filter; before this issue the kernel committed it as a
    gitlink, and task 2's edit in it made the kernel's `git status` run the filter outside the sandbox."""
    ws = make_workspace(tmp_path / "ws")
    filtered, monitored = tmp_path / "filter-ran", tmp_path / "fsmonitor-ran"
    first = nested_repo("src/evil", filter_marker=filtered, fsmonitor_marker=monitored) + "\necho ok > src/ok.txt"
    second = "printf 'b\\n' > src/evil/f && touch src/evil/f && echo more > src/two.txt"  # same size: git hashes it

    report, records = run(tmp_path, ws, {"T1": first, "T2": second}, mode)

    nothing_leaked(tmp_path, filtered, monitored)
    # issue 30: a repository the task made is a refused change: the task ends BlockedPolicy, nothing of it is
    # committed or pushed, and task 2 never runs
    assert report["terminal"] == "BlockedPolicy" and report["reason"]["source"] == "change", report
    assert [p["path"] for p in report["reason"]["paths"]] == ["src/evil/"]
    assert "gitlink" in report["reason"]["paths"][0]["why"]
    assert set(pushed_tree(ws)) == {"README.md"} and not commit_records(records)
    assert [t["id"] for t in report["tasks"]] == ["T1"]


@LOOP_SLOW
@pytest.mark.parametrize("mode", MODES)
def test_the_kernels_git_never_recurses_into_a_submodule_an_earlier_run_left(tmp_path, mode):
    """A gitlink already in HEAD (what the kernel committed before this issue), its repository's config holding
    a clean filter: the task edits a file in it. Neither the kernel's commit (git) nor its boundary reads
    (libgit2) run the filter, and the gitlink the origin holds does not move."""
    filtered, monitored = tmp_path / "filter-ran", tmp_path / "fsmonitor-ran"
    ws = make_workspace(tmp_path / "ws")
    setup = nested_repo(f"{ws.path}/src/evil", filter_marker=filtered, fsmonitor_marker=monitored)
    subprocess.run(["bash", "-c", setup], check=True, env=_GIT_ENV, cwd=ws.path)
    ws.git("add", "src/evil")
    ws.git("commit", "-qm", "a submodule entry")
    ws.git("push", "-q")
    gitlink = ws.git("rev-parse", "HEAD:src/evil").strip()
    edit = "printf 'b\\n' > src/evil/f && touch src/evil/f && echo ok > src/ok.txt"

    report, records = run(tmp_path, ws, {"T1": edit}, mode)

    nothing_leaked(tmp_path, filtered, monitored)
    assert origin(ws, "rev-parse", "main:src/evil").decode().strip() == gitlink
    # issue 30: a change inside a submodule is one the kernel never commits: refused, nothing of the task lands
    assert report["terminal"] == "BlockedPolicy", report
    overlay = mode != "off"  # the overlay names the repository the change is in; git's status, the gitlink
    why = ("inside a repository of its own (a submodule or a nested repository): the kernel's commit never changes"
           " one") if overlay else "a submodule (gitlink): the kernel's commit never changes one"  # fmt: skip
    assert [(p["path"], p["why"]) for p in report["reason"]["paths"]] == [("src/evil", why)]
    assert "src/ok.txt" not in pushed_tree(ws) and not commit_records(records)


# --- 2: the commit follows the policy, not the agent's ignore files ----------------------------------------


def secret_workspace(tmp_path: Path) -> Workspace:
    """src/secret/ is ignored by the committed .gitignore and read-denied; its key is there, untracked. So is
    src/cache/ (ignored, not denied) with a build product in it."""
    ws = make_workspace(tmp_path / "ws", ignore=["src/secret/", "src/cache/"])
    ws.write("src/secret/key.txt", SECRET + "\n")
    ws.write("src/cache/build.out", "built\n")
    return ws


@LOOP_SLOW
@pytest.mark.parametrize("mode", MODES)
def test_a_gitignore_negation_never_commits_the_read_denied_secret(tmp_path, mode):
    """Before this issue `git add -A` followed the agent's `src/.gitignore` and pushed the secret."""
    ws = secret_workspace(tmp_path)
    script = "printf '!secret/\\n!cache/\\n' > src/.gitignore && echo ok > src/ok.txt"

    report, records = run(tmp_path, ws, {"T1": script}, mode)

    assert report["terminal"] == "Idle", report
    assert SECRET.encode() not in pushed_history(ws)
    tree = pushed_tree(ws)
    assert "src/secret/key.txt" not in tree and "src/cache/build.out" not in tree
    assert tree["src/ok.txt"] == b"ok\n" and tree["src/.gitignore"] == b"!secret/\n!cache/\n"  # the rules allow
    t1 = commit_records(records)["T1"]
    assert t1["committed"] and t1["pushed"]
    assert named(t1) == {
        "src/secret/key.txt": "read-denied by rule no-secret",
        "src/cache/build.out": "ignored when the task started (an ignore file written since un-ignores it)",
    }
    assert (ws.path / "src/secret/key.txt").read_text() == SECRET + "\n"  # left where it was


def test_a_path_no_write_rule_allows_is_not_committed_when_the_agent_wrote_it_itself(tmp_path):
    """With the sandbox off the OS stops nothing: the agent's own tools write outside src/."""
    ws = make_workspace(tmp_path / "ws", files={"docs/guide.md": "guide\n"})
    script = "mkdir -p docs src && echo planted > docs/planted.md && echo edited >> README.md && rm docs/guide.md" \
             " && echo ok > src/ok.txt"  # fmt: skip

    report, records = run(tmp_path, ws, {"T1": script}, "off")

    # issue 30: the refused changes end the task BlockedPolicy, and nothing of it (src/ok.txt) is committed
    assert report["terminal"] == "BlockedPolicy", report
    assert {p["path"]: p["why"] for p in report["reason"]["paths"]} == dict.fromkeys(
        ["README.md", "docs/guide.md", "docs/planted.md"], "no write rule allows it"
    )
    tree = pushed_tree(ws)
    assert tree == {"README.md": b"A workspace for loop-harness.\n", "docs/guide.md": b"guide\n"}
    assert not commit_records(records)


@pytest.mark.parametrize("mode", MODES)
def test_allowed_changes_are_committed_and_pushed_exactly(tmp_path, mode):
    """New, modified, deleted and renamed files under src/ (names with a space, glob characters, a newline)
    are committed and pushed; beside them, a nested repository the same task made is not."""
    ws = make_workspace(tmp_path / "ws", files={"src/mod.txt": "old\n", "src/del.txt": "gone\n",
                                                "src/old.txt": "moved\n", "src/keep.txt": "kept\n"})  # fmt: skip
    script = (
        "echo new > src/new.txt && echo changed > src/mod.txt && rm src/del.txt && mv src/old.txt src/renamed.txt"
        " && printf x > 'src/sp ace*[x].txt' && printf y > $'src/new\\nline.txt' && printf z > 'src/:(glob)z'"
    )  # (a nested repository beside them ends the task BlockedPolicy since issue 30: test_change_set.py)

    report, records = run(tmp_path, ws, {"T1": script}, mode)

    assert report["terminal"] == "Idle", report
    assert pushed_tree(ws) == {
        "README.md": b"A workspace for loop-harness.\n",
        "src/keep.txt": b"kept\n",
        "src/mod.txt": b"changed\n",
        "src/new.txt": b"new\n",
        "src/renamed.txt": b"moved\n",
        "src/sp ace*[x].txt": b"x",
        "src/new\nline.txt": b"y",
        "src/:(glob)z": b"z",
    }
    t1 = commit_records(records)["T1"]
    assert (t1["committed"], t1["pushed"], t1["message"]) == (True, True, "T1: Task T1")
    assert "not_committed" not in t1
    assert ws.git("log", "-1", "--format=%H").strip() == t1["sha"]


@LOOP_SLOW
@pytest.mark.parametrize("mode", MODES)
def test_a_filter_the_operator_configured_is_not_run_by_the_kernels_commit(tmp_path, mode):
    """The repository's own config (the operator's, read-only to the agent) defines a filter driver, as git-lfs
    does, and diff drivers; an agent-written `.gitattributes` selects them for its files. The kernel's commit
    runs none of them and stores the files as they are."""
    ws = make_workspace(tmp_path / "ws")
    markers = {what: tmp_path / f"{what}-ran" for what in ("clean", "smudge", "textconv", "diff")}
    for key, what in (("filter.lfsish.clean", "clean"), ("filter.lfsish.smudge", "smudge"),
                      ("diff.x.textconv", "textconv"), ("diff.x.command", "diff")):  # fmt: skip
        ws.git("config", key, f"sh -c 'env > {markers[what]}; cat'")
    ws.git("config", "filter.lfsish.required", "true")  # a failing filter would stop git: not one that is off
    script = "mkdir -p src && printf '* filter=lfsish diff=x\\n' > src/.gitattributes && echo data > src/data.txt"

    report, records = run(tmp_path, ws, {"T1": script}, mode)

    assert report["terminal"] == "Idle", report
    nothing_leaked(tmp_path, *markers.values())
    tree = pushed_tree(ws)
    assert tree["src/data.txt"] == b"data\n" and tree["src/.gitattributes"] == b"* filter=lfsish diff=x\n"
    t1 = commit_records(records)["T1"]
    assert t1["committed"] and t1["pushed"] and "not_committed" not in t1


@pytest.mark.parametrize("sandbox", [{"mode": "off"}, {"mode": "workspace-write", "git_writable": True}])
def test_what_the_agent_staged_itself_is_not_committed(tmp_path, sandbox):
    """An agent that can write the index stages the denied secret (`add -f`, past the ignore file) and a
    nested repository as a gitlink; the kernel's commit takes only what it judged, from HEAD."""
    ws = secret_workspace(tmp_path)
    script = (
        f"git add -f src/secret/key.txt; mkdir -p src/evil && cd src/evil && git init -q && echo a > f"
        f" && git add f && git {IDENTITY} commit -qm nested && cd ../.. && git add src/evil"
        " && echo ok > src/ok.txt && git status --porcelain"
    )

    report, records = run(tmp_path, ws, {"T1": script}, **sandbox)

    assert SECRET.encode() not in pushed_history(ws)
    # issue 30: the gitlink it staged is a refused change (the staged secret is not the task's: it was there,
    # ignored, when the task started): the task ends BlockedPolicy and nothing of it is committed or pushed
    assert report["terminal"] == "BlockedPolicy", report
    overlay = sandbox["mode"] != "off" and sandbox.get("worktree", "overlay") == "overlay"
    assert [(p["path"], p["why"]) for p in report["reason"]["paths"]] == [
        ("src/evil/", "a repository of its own: committed, it would be a gitlink (a submodule entry)")
        if overlay
        else ("src/evil", "a submodule (gitlink): the kernel's commit never changes one")
    ]  # the overlay sees the repository it made; git's status, the gitlink it staged
    assert set(pushed_tree(ws)) == {"README.md", ".gitignore"} and not commit_records(records)


@pytest.mark.parametrize("mode", MODES)
def test_a_repository_the_agent_makes_at_the_workspace_is_not_the_one_the_kernel_runs_git_in(tmp_path, mode):
    """The workspace is a directory below the worktree's root: a `.git` the agent makes there is the first one
    git would find from the workspace. Its config names a program for pushing to its remote and a filter; the
    kernel's git works in the repository the run started on, so it runs neither."""
    ws = make_workspace(tmp_path / "ws", files={"app/README.md": "app\n"})
    pushed, filtered = tmp_path / "receivepack-ran", tmp_path / "filter-ran"
    script = f"""set -e
git init -q -b main .
git config remote.origin.url {tmp_path}/nowhere.git
git config remote.origin.receivepack "sh -c 'env > {pushed}; exit 1'"
git config branch.main.remote origin && git config branch.main.merge refs/heads/main
echo ok > ok.txt && git add -A && git {IDENTITY} commit -qm agent
git config filter.x.clean "sh -c 'env > {filtered}; cat'"
echo '* filter=x' > .gitattributes && echo more > more.txt"""
    rules = [READ_ALL, {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"}]

    report, records = run(tmp_path, ws, {"T1": script}, mode, rules=rules, workspace=ws.path / "app")

    nothing_leaked(tmp_path, pushed, filtered)
    if mode != "off":  # the overlay: a `.git` written at the workspace is a protected path, never landed
        assert report["terminal"] == "BlockedPolicy", report
        assert report["reason"]["paths"][0]["path"] == ".git" and "agent" not in ws.pushed_log()
        return
    assert report["terminal"] == "Idle", report
    assert "agent" not in ws.pushed_log()
    assert commit_records(records)["T1"].get("pushed") is True, records


def test_a_commondir_the_agent_plants_in_a_writable_git_stops_the_kernels_git(tmp_path):
    """With `git_writable` the agent may write `.git/commondir` (only one that exists is mounted read-only): it
    points git at a repository of its own, a copy of the real one whose config names a receive-pack program
    for the remote the branch tracks. A main repository has no `commondir`: the kernel runs no git there."""
    ws = make_workspace(tmp_path / "ws")
    pushed = tmp_path / "receivepack-ran"
    script = f"""set -e
common=$TMPDIR/common && git init -q --bare "$common" && cp -r .git/objects .git/refs "$common"/
git --git-dir="$common" config remote.origin.url {tmp_path}/nowhere.git
git --git-dir="$common" config remote.origin.receivepack "sh -c 'env > {pushed}; exit 1'"
git --git-dir="$common" config branch.main.remote origin
git --git-dir="$common" config branch.main.merge refs/heads/main
echo "$common" > .git/commondir
mkdir -p src && echo ok > src/ok.txt"""

    report, records = run(tmp_path, ws, {"T1": script}, "workspace-write", git_writable=True)

    assert report["tasks"][0]["terminal"] == "Completed", report
    nothing_leaked(tmp_path, pushed)
    assert (ws.path / ".git/commondir").exists(), "the agent planted it"
    t1 = commit_records(records)["T1"]
    assert not t1["committed"] and "commondir" in t1["error"] and "pushed" not in t1
    assert origin(ws, "log", "--format=%s", "main").decode() == "initial commit\n"


@pytest.mark.parametrize("hook", ["pre-commit", "post-commit", "reference-transaction", "post-index-change",
                                  "pre-push", "prepare-commit-msg"])  # fmt: skip
def test_a_hook_the_agent_planted_never_runs_with_the_kernels_git(tmp_path, hook):
    """With the sandbox off the agent writes `.git/hooks` itself (under the sandbox it is read-only, even with
    `git_writable`): the kernel's git runs no hook (it held before this issue too)."""
    ws = make_workspace(tmp_path / "ws")
    ran = tmp_path / "hook-ran"
    script = (
        f"printf '#!/bin/sh\\nenv > {ran}\\n' > .git/hooks/{hook} && chmod +x .git/hooks/{hook}"
        " && mkdir -p src && echo ok > src/ok.txt"
    )

    report, records = run(tmp_path, ws, {"T1": script}, "off")

    assert report["terminal"] == "Idle", report
    assert (ws.path / ".git/hooks" / hook).exists()
    nothing_leaked(tmp_path, ran)
    t1 = commit_records(records)["T1"]
    assert t1["committed"] and t1["pushed"] and pushed_tree(ws)["src/ok.txt"] == b"ok\n"


# --- what held: libgit2 runs no program -------------------------------------------------------------------


def test_libgit2_reads_run_no_program_a_repository_names(tmp_path):
    """The kernel's in-process reads (the boundary's status, the change meter's status and diff) over a submodule
    whose config has a clean filter and an fsmonitor, and an operator filter an agent's `.gitattributes`
    selects: libgit2 runs no filter command and has no fsmonitor or hooks (it passes before this issue too)."""
    filtered, monitored, operator = tmp_path / "filter-ran", tmp_path / "fsmonitor-ran", tmp_path / "operator-ran"
    ws = make_workspace(tmp_path / "ws")
    setup = nested_repo(f"{ws.path}/src/evil", filter_marker=filtered, fsmonitor_marker=monitored)
    subprocess.run(["bash", "-c", setup], check=True, env=_GIT_ENV, cwd=ws.path)
    ws.git("add", "src/evil")
    ws.git("commit", "-qm", "a submodule entry")
    ws.git("config", "filter.lfsish.clean", f"sh -c 'env > {operator}; cat'")
    ws.git("config", "core.fsmonitor", f"sh -c 'env > {operator}'")
    ws.write("src/.gitattributes", "* filter=lfsish\n")
    ws.write("src/evil/f", "b\n")
    ws.write("src/data.txt", "data\n")
    git_dir = ws.path / ".git"

    state = read_git_state(ws.path, git_dir)  # the boundary's read
    repo = pygit2.Repository(str(git_dir))
    # what the change meter asks of libgit2: status with ignored paths, the start tree against the worktree
    status = repo.status(untracked_files="all", ignored=True)
    diff = (
        repo.revparse_single("HEAD")
        .peel(pygit2.Tree)
        .diff_to_workdir(DiffOption.INCLUDE_UNTRACKED | DiffOption.RECURSE_UNTRACKED_DIRS)
    )
    patches = [patch.text for patch in diff]
    nested = pygit2.Repository(str(ws.path / "src/evil")).diff().patch  # in the submodule, with its own config

    nothing_leaked(tmp_path, filtered, monitored, operator)
    assert {"?? src/.gitattributes", "?? src/data.txt", ".M src/evil"} <= set(state.changes), state.changes
    assert {"src/.gitattributes", "src/data.txt", "src/evil"} <= set(status)
    assert len(patches) >= 3 and nested is not None and "+b" in nested


def test_the_kernel_asks_libgit2_for_no_transport():
    """libgit2 may run `ssh` (or `core.sshCommand`) for a fetch or push over ssh: the kernel never asks it for
    one (its pushes are git's, above); it only reads the repository."""
    harness = Path(__file__).resolve().parents[2] / "harness"
    network = re.compile(r"\.remotes\b|clone_repository|\.fetch\(|\.push\(|ls_remotes|RemoteCallbacks")
    found = [f"{path.name}:{number}" for path in sorted(harness.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if network.search(line)]  # fmt: skip
    assert not found, found
