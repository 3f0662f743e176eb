"""Exactly the files write rules name land (issue 30, item 2): the worktree is a copy-on-write overlay.

Inside the sandbox the agent may write anywhere in the worktree but the read-only and masked paths; every write
lands in the overlay's upper layer, which is exactly what the task changed. At the boundary the kernel judges
it and applies it to the real worktree whole, or refuses it whole, setting it aside beside the transcript. So a
rule for one new file (`setup.cfg`), a root glob (`*.md`), a narrow glob (`src/*.py`) and a deny inside an
allowed tree each behave as the policy says. Before this issue `write setup.cfg` for a file not there yet was
refused by the OS (EROFS) and the task still ended Completed, exit 0, with nothing done.

Everything that acts for the agent sees its view: `terminal/*` commands join its sandbox (a command reads what
the agent wrote, and what it writes lands with the task), and so do the kernel's `fs/*` calls. Through the CLI,
a silent-writing scripted agent, the kernel's commit and push to a real bare origin.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import READ_ALL, WRITE_SRC, agent_messages, make_workspace
from tests.scripted.test_change_set import (
    NO_KEYS,
    WRITE_PY,
    assert_set_aside,
    nothing_pushed,
    pushed_history,
    refused,
    run,
    worktree_status,
)

pytestmark = LOOP_SCRIPTED

SETUP_CFG = {"id": "setup-cfg", "kind": "write", "paths": ["setup.cfg"], "decision": "allow"}
ROOT_MD = {"id": "root-md", "kind": "write", "paths": ["*.md"], "decision": "allow"}
MODES = ["overlay", "bind"]  # the overlay, and the directory binds it replaces (for the contrast)


@pytest.mark.parametrize("mode", MODES)
def test_a_rule_for_one_file_not_there_yet_lets_the_agent_write_it(tmp_path, mode):
    """The issue's fourth row: `write setup.cfg`, the file absent. With the overlay it is written, committed and
    pushed; with directory binds the OS refuses it (EROFS) and the run still ends Idle with nothing done."""
    ws = make_workspace(tmp_path / "ws")

    report, records, code = run(tmp_path, ws, {"T1": ["echo '[metadata]' > setup.cfg"]},
                                rules=[READ_ALL, SETUP_CFG], mode=mode)  # fmt: skip

    assert (report["terminal"], code) == ("Idle", 0), report
    if mode == "bind":
        assert "Read-only file system" in "".join(agent_messages(records))
        assert "setup.cfg" not in pushed_history(ws)
        return
    assert "A\tsetup.cfg" in pushed_history(ws)
    assert (ws.path / "setup.cfg").read_text() == "[metadata]\n" and worktree_status(ws) == ""


@LOOP_SLOW
def test_a_root_glob_grants_its_names_and_no_other(tmp_path):
    """`write *.md`: a new NOTES.md and an edit of README.md land; a notes.txt beside them refuses the task, and
    none of the three reaches the tree (the task lands whole or not at all)."""
    ws = make_workspace(tmp_path / "ws")

    report, _, code = run(tmp_path, ws, {"T1": ["echo notes > NOTES.md && echo more >> README.md"]},
                          rules=[READ_ALL, ROOT_MD], mode="overlay")  # fmt: skip
    assert (report["terminal"], code) == ("Idle", 0), report
    assert "A\tNOTES.md" in pushed_history(ws) and "M\tREADME.md" in pushed_history(ws)

    ws2 = make_workspace(tmp_path / "ws2")
    report, _, code = run(tmp_path / "second", ws2, {"T1": ["echo n > NOTES.md && echo t > notes.txt"]},
                          rules=[READ_ALL, ROOT_MD], mode="overlay")  # fmt: skip
    assert refused(report) == {"notes.txt": {"path": "notes.txt", "why": "no write rule allows it"}}
    assert code == 1 and worktree_status(ws2) == "" and not (ws2.path / "NOTES.md").exists()
    nothing_pushed(ws2)
    assert_set_aside(report, {"notes.txt": "file", "NOTES.md": "file"})


@LOOP_SLOW
def test_a_narrow_glob_and_a_deny_inside_an_allowed_tree(tmp_path):
    """`write src/*.py`: src/new.py lands; `write src/**` with `deny write **/*.key`: src/x.key refuses."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    report, _, code = run(tmp_path, ws, {"T1": ["echo new > src/new.py"]}, rules=[READ_ALL, WRITE_PY], mode="overlay")
    assert (report["terminal"], code) == ("Idle", 0) and "A\tsrc/new.py" in pushed_history(ws)

    ws2 = make_workspace(tmp_path / "ws2", files={"src/keep.py": "kept\n"})
    report, _, code = run(tmp_path / "second", ws2, {"T1": ["echo k > src/x.key"]},
                          rules=[READ_ALL, WRITE_SRC, NO_KEYS], mode="overlay")  # fmt: skip
    assert refused(report)["src/x.key"]["rule_ids"] == ["no-keys"] and code == 1
    assert not (ws2.path / "src/x.key").exists()


def test_commands_and_the_kernels_files_see_the_agents_view(tmp_path):
    """What the agent wrote itself (in the overlay only, not yet in the worktree) is what a `terminal/*` command
    reads and what `fs/read_text_file` returns; what the command and `fs/write_text_file` write lands with the
    task."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    steps = ["echo mine > src/mine.txt",
             {"terminal": {"command": "bash", "args": ["-c", "cat src/mine.txt; echo from-command > src/command.txt"]}},
             {"read": {"path": "src/mine.txt", "expect": "mine\n"}},
             {"read": {"path": "src/command.txt", "expect": "from-command\n"}},
             {"write": {"path": "src/kernel.txt", "content": "from fs/write\n"}},
             "cat src/kernel.txt"]  # fmt: skip

    report, records, code = run(tmp_path, ws, {"T1": steps},
                                rules=[READ_ALL, WRITE_SRC, {"id": "sh", "kind": "execute",
                                                             "commands": ["cat *", "echo *"], "decision": "allow"}],
                                mode="overlay")  # fmt: skip

    assert (report["terminal"], code) == ("Idle", 0), report
    said = "\n".join(agent_messages(records))
    assert "-> exit 0\nmine\n" in said, said  # the command read the agent's file (in the overlay only)
    assert "read mismatch" not in said
    assert "from fs/write" in said  # the agent's own shell sees the kernel's write
    history = pushed_history(ws)
    for name in ("src/mine.txt", "src/command.txt", "src/kernel.txt"):
        assert f"A\t{name}" in history


def test_the_agent_spans_tasks_each_task_lands_only_its_own_changes(tmp_path):
    """One agent process, one overlay, three tasks: a file made, then deleted, then made again; each task's
    commit holds exactly its change (what the upper layer kept from an applied task is not the next one's)."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    steps = {"T1": ["echo one > src/a.txt"], "T2": ["rm src/a.txt && echo two > src/b.txt"],
             "T3": ["echo three > src/a.txt && chmod +x src/b.txt"]}  # fmt: skip

    report, _, code = run(tmp_path, ws, steps, rules=[READ_ALL, WRITE_SRC], mode="overlay")

    assert (report["terminal"], code) == ("Idle", 0), report
    commits = pushed_history(ws).split("\n\n")
    assert commits[:4] == ["T3: Task T3", "A\tsrc/a.txt\nM\tsrc/b.txt\nT2: Task T2",
                           "D\tsrc/a.txt\nA\tsrc/b.txt\nT1: Task T1",
                           "A\tsrc/a.txt\ninitial commit"], commits  # fmt: skip
    assert (ws.path / "src/a.txt").read_text() == "three\n" and os.access(ws.path / "src/b.txt", os.X_OK)


def test_a_task_that_fails_lands_nothing_and_its_changes_are_set_aside(tmp_path):
    """A task that ends otherwise than Completed (its agent crashed) leaves the worktree as it was: what it
    wrote is beside the transcript, named in the reason."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})

    steps = ["echo half > src/half.txt && rm src/keep.py", {"crash": {"exit_code": 3}}]
    report, _, code = run(tmp_path, ws, {"T1": steps}, rules=[READ_ALL, WRITE_SRC], mode="overlay")

    assert report["terminal"] == "Failed" and code != 0, report
    assert worktree_status(ws) == "" and (ws.path / "src/keep.py").exists()
    aside = Path(report["reason"]["set_aside"])
    listed = {e["path"]: e["kind"] for e in json.loads((aside / "changes.json").read_text())}
    assert listed == {"src/half.txt": "file", "src/keep.py": "deleted"}, listed
    nothing_pushed(ws)


@pytest.mark.parametrize("mode", MODES)
def test_a_line_cap_trips_mid_turn_on_what_the_agent_wrote_itself(tmp_path, mode):
    """The change meter reads the overlay: a silent 600-line write trips a 100-line cap during the turn (the
    worktree itself is untouched until the boundary, so a meter reading it would see nothing)."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    steps = ["seq 1 600 > src/big.txt", {"terminal": {"command": "true", "args": []}}, "echo after > src/after.txt"]

    report, _, code = run(tmp_path, ws, {"T1": steps}, rules=[READ_ALL, WRITE_SRC, {
        "id": "t", "kind": "execute", "commands": ["true"], "decision": "allow"}], mode=mode,
        autonomy={"budget": {"changes": {"lines_total": 100}}})  # fmt: skip

    assert (report["terminal"], code) == ("MaxIterations", 1), report
    reason = report["reason"]
    assert (reason["stop_code"], reason["key"]) == ("LINE_CHANGE_LIMIT", "budget.changes.lines_total"), reason
    assert reason["current"] >= 600, reason  # the 600 lines it wrote itself (the worktree itself had none)
    nothing_pushed(ws)
    assert worktree_status(ws) == ("" if mode == "overlay" else "?? src/after.txt\n?? src/big.txt\n")
    assert not [r for r in read_transcript(Path(report["transcript"])) if r["type"] == "commit"]


def test_a_command_joins_the_agents_sandbox_with_no_power(tmp_path):
    """`Sandbox.wrap` for a command once the agent's sandbox runs: the command is a process of that sandbox (its
    pid namespace: the agent is there, the kernel is not; its overlay), with every capability dropped, no user
    namespace of its own to make, the seccomp filter on (a setuid bit refused), and its exit status its own."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n"})
    sandbox = _planned(tmp_path, ws.path)
    agent = _spawn(sandbox, ["sh", "-c", f"echo agent > {ws.path}/src/agent.txt; exec sleep 30"], ws.path)
    try:
        asyncio.run(sandbox.overlay.attach())
        probe = ("cat src/agent.txt; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; ps -eo comm | sort | tr '\\n' ' ';"
                 " echo; unshare -U true 2>/dev/null && echo userns-made;"
                 " touch s && chmod u+s s || echo setuid-refused; exit 7")  # fmt: skip
        argv, env, fds = sandbox.wrap(["sh", "-c", probe], cwd=str(ws.path), env=dict(os.environ))
        try:
            done = subprocess.run(argv, env=env, pass_fds=fds, capture_output=True, text=True, timeout=60, cwd="/")
        finally:
            for fd in fds:
                os.close(fd)
        argv, env, fds = sandbox.wrap(["sh", "-c", "kill -TERM $$"], cwd=str(ws.path), env=dict(os.environ))
        try:  # a command a signal ends: the kernel sees that signal, as it would outside
            signalled = subprocess.run(argv, env=env, pass_fds=fds, timeout=60, cwd="/")
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        agent.kill()
        agent.wait()
        sandbox.overlay.close()
    out = done.stdout
    assert done.returncode == 7, (done.returncode, out, done.stderr)
    assert signalled.returncode == -signal.SIGTERM
    assert out.startswith("agent\n"), out  # the agent's write, which only its overlay holds
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out, out
    assert "sleep" in out and "pytest" not in out and "python" not in out, out  # the agent's processes only
    assert "userns-made" not in out and "setuid-refused" in out, out
    assert not (ws.path / "src/agent.txt").exists() and (ws.path / "s").exists() is False


def _planned(tmp_path: Path, worktree: Path):
    from harness.config._config import RuleConfig, SandboxConfig
    from harness.sandbox._sandbox import find_bwrap, plan_sandbox

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rules = [RuleConfig.model_validate(r) for r in (READ_ALL, WRITE_SRC)]
    return plan_sandbox(SandboxConfig(worktree="overlay"), bwrap=find_bwrap(None), worktree=worktree, rules=rules,
                        protected_globs=[],
                        protected_files=[], git_dirs=[], run_dir=run_dir, agent_env={})  # fmt: skip


def _spawn(sandbox, argv: list[str], cwd: Path) -> subprocess.Popen:
    argv, env, fds = sandbox.wrap(argv, cwd=str(cwd), env=dict(os.environ), tools=True)
    try:
        return subprocess.Popen(argv, env=env, pass_fds=fds, cwd=cwd)
    finally:
        for fd in fds:
            os.close(fd)


# --- the apply, on an upper layer written as overlayfs writes one ------------------------------------------


def _overlay_on(tmp_path: Path, files: dict[str, str]):
    from harness.sandbox._overlay import WorktreeOverlay

    worktree = tmp_path / "tree"
    for name, text in files.items():
        (worktree / name).parent.mkdir(parents=True, exist_ok=True)
        (worktree / name).write_text(text)
    overlay = WorktreeOverlay(str(worktree), tmp_path / "layers")
    overlay.upper = tmp_path / "upper"
    overlay.upper.mkdir()
    return worktree, overlay


def test_the_apply_never_writes_into_an_inode_or_through_a_link_the_tree_holds(tmp_path):
    """The tree holds a file hard-linked to one outside and a symlink to another; the upper layer changes both
    names: each is written afresh, and neither outside file changes."""
    outside, other = tmp_path / "outside.txt", tmp_path / "other.txt"
    outside.write_text("outside\n")
    other.write_text("other\n")
    worktree, overlay = _overlay_on(tmp_path, {"src/keep.txt": "keep\n"})
    os.link(outside, worktree / "src/linked.txt")
    os.symlink(other, worktree / "src/pointer.txt")
    for name in ("src/linked.txt", "src/pointer.txt"):
        (overlay.upper / name).parent.mkdir(parents=True, exist_ok=True)
        (overlay.upper / name).write_text("new\n")

    changes = overlay.task_changes()
    assert [(c.path, c.kind) for c in changes] == [("src/linked.txt", "file"), ("src/pointer.txt", "file")]
    overlay.apply(changes)

    assert outside.read_text() == "outside\n" and other.read_text() == "other\n"
    for name in ("src/linked.txt", "src/pointer.txt"):
        assert (worktree / name).read_text() == "new\n" and not (worktree / name).is_symlink()
        assert os.stat(worktree / name).st_nlink == 1
    assert overlay.task_changes() == []  # applied: no longer the next task's change


def test_an_opaque_directory_and_a_whiteout_take_away_what_the_tree_held(tmp_path):
    """A directory replaced whole (opaque: what the tree held beneath it goes, but what the upper layer holds
    again) and a deletion (a whiteout): what they take away is listed for the judgement, then gone."""
    worktree, overlay = _overlay_on(tmp_path, {"d/x": "x\n", "d/y": "y\n", "gone/a": "a\n", "gone/b/c": "c\n"})
    (overlay.upper / "d").mkdir()
    (overlay.upper / "d/y").write_text("y again\n")
    os.setxattr(overlay.upper / "d", "user.overlay.opaque", b"y")
    try:
        os.mknod(overlay.upper / "gone", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    except PermissionError:
        pytest.skip("a whiteout is a device node: mknod needs CAP_MKNOD here")

    changes = {c.path: c for c in overlay.task_changes()}
    assert (changes["d"].kind, changes["d"].opaque, changes["gone"].kind) == ("dir", True, "deleted")
    assert overlay.deleted_beneath(changes["d"], 100) == ["d/x"]
    assert sorted(overlay.deleted_beneath(changes["gone"], 100)) == ["gone/a", "gone/b/c"]
    overlay.apply(list(changes.values()))

    assert sorted(os.listdir(worktree / "d")) == ["y"] and (worktree / "d/y").read_text() == "y again\n"
    assert not (worktree / "gone").exists()


def test_a_symlink_is_judged_where_the_os_will_resolve_it_not_by_its_text(tmp_path):
    """Links the tree holds and links the task makes are followed before `..`, as the kernel follows them:
    `../docs/etc/passwd` through a committed `docs/etc -> /etc`, and `d/../../outside.txt` through a link the
    task made itself (`src/d -> ../docs`), both lead outside though their text reads as inside. A fifo is never
    landed either."""
    ws = make_workspace(tmp_path / "ws", files={"src/keep.py": "kept\n", "docs/readme.md": "docs\n"})
    os.symlink("/etc", ws.path / "docs/etc")
    ws.git("add", "docs/etc")
    ws.git("commit", "-qm", "a link out")
    ws.git("push", "-q")
    write_docs = {"id": "write-docs", "kind": "write", "paths": ["docs/**"], "decision": "allow"}
    script = ("ln -s ../docs/etc/passwd src/p.txt && ln -s ../docs src/d && ln -s d/../../outside.txt src/q.txt"
              " && mkfifo src/pipe && echo ok > src/ok.txt")  # fmt: skip

    report, _, code = run(tmp_path, ws, {"T1": [script]}, rules=[READ_ALL, WRITE_SRC, write_docs], mode="overlay")

    named = {p: e["why"] for p, e in refused(report).items()}
    assert named == {"src/p.txt": "it resolves outside the workspace, to /etc/passwd",
                     "src/q.txt": f"it resolves outside the workspace, to {tmp_path / 'ws' / 'outside.txt'}",
                     "src/pipe": "a special file (a fifo, a socket, a device): never landed"}, named  # fmt: skip
    assert code == 1 and worktree_status(ws) == ""
    nothing_pushed_since = pushed_history(ws).split("\n", 1)[0]
    assert nothing_pushed_since == "a link out"
