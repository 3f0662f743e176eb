"""The OS sandbox (issue 10): what an allowed agent does stays inside the workspace.

Each guarantee is tried by a hostile agent through the CLI, both directly (the agent runs the program itself,
as Codex and Claude Code do) and through a command the policy allows (a script in the worktree the policy
cannot see into). Every test runs the same attack with `sandbox: {mode: off}` too and asserts that it works
there: so each test fails with the sandbox off, and the attack is known to be real.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harness import read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import DEFAULT_RULES, READ_ALL, WRITE_SRC, agent_messages, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn
from tests.helpers.loopback import LoopbackServer

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
MODES = ["workspace-write", "off"]


def box(mode: str) -> dict[str, str]:
    """The sandbox config for a mode: `workspace-write` with directory binds (what these tests pin: the OS
    refuses a write no rule names), `overlay` with the copy-on-write worktree (judged at the boundary)."""
    if mode == "overlay":
        return {"mode": "workspace-write", "worktree": "overlay"}
    return {"mode": mode, "worktree": "bind"} if mode == "workspace-write" else {"mode": mode}


RULES = [
    READ_ALL,
    {"id": "no-secrets", "kind": "read", "paths": ["**/secrets/**"], "decision": "deny"},
    WRITE_SRC,
    {"id": "escape", "kind": "execute", "commands": ["python3 tools/escape.py"], "decision": "allow"},
    {"id": "sleep", "kind": "execute", "commands": ["sleep *"], "decision": "allow"},
]

#: Tries every effect the sandbox bounds and prints one line per attempt ("<what>: done" or "...: blocked").
ESCAPE = """\
import glob, os, socket
WRITES = {writes!r}
def attempt(what, action):
    try:
        action()
        print(what + ": done")
    except Exception as exc:
        print(what + ": blocked (" + type(exc).__name__ + ")")
def append(path):
    def action():
        with open(path, "a") as out:
            out.write("planted\\n")
    return action
for what, path in WRITES.items():
    attempt("write " + what, append(os.path.expandvars(path)))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2).close())
def read_secret():
    if "TOPSECRET" not in open("src/secrets/key").read():
        raise PermissionError("masked")
attempt("read secret", read_secret)
def kernel_seen():
    for name in glob.glob("/proc/[0-9]*/environ"):
        try:
            if {mark!r} in open(name, "rb").read().decode(errors="replace"):
                return
        except OSError:
            pass
    raise LookupError("not seen")
attempt("see kernel", kernel_seen)
"""


@pytest.fixture(name="listener")
def listener_fixture():
    """A loopback TCP port that accepts connections: what `connect` tries to reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def hostile_run(tmp_path: Path, mode: str, via: str, port: int) -> tuple[subprocess.CompletedProcess, str, Path]:
    """A run whose agent runs tools/escape.py, itself (`via="agent"`) or as an allowed terminal command."""
    workspace = tmp_path / "ws" / "workspace"
    config = tmp_path / "loop.yaml"
    transcripts = tmp_path / "transcripts"
    writes = {
        "outside": str(tmp_path / "outside.txt"),
        "git hook": str(workspace / ".git/hooks/pre-commit"),
        "git config": str(workspace / ".git/config"),
        "nested git": str(workspace / "src/nested/.git/config"),  # a repository inside, under a write rule
        "unruled path": str(workspace / "docs/planted.txt"),
        "config": str(config),
        "role": str(tmp_path / "role.yaml"),
        "transcripts": str(transcripts / "planted.jsonl"),
        "home": "$HOME/planted",
        "tmp": "$TMPDIR/planted",
    }
    mark = secrets.token_hex(8)
    script = ESCAPE.format(writes=writes, port=port, mark=mark)
    ws = make_workspace(tmp_path / "ws", files={"tools/escape.py": script, "src/secrets/key": "TOPSECRET\n",
                                                "docs/readme.md": "docs\n"}, ignore=["src/nested/"])  # fmt: skip
    (workspace / "src/nested/.git").mkdir(parents=True)
    (workspace / "src/nested/.git/config").write_text("[core]\n")
    step = (
        {"run": {"script": "python3 tools/escape.py"}}
        if via == "agent"
        else {"terminal": {"command": "python3", "args": ["tools/escape.py"]}}
    )
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(step)]}))
    write_yaml(tmp_path / "role.yaml", {"prompt": "Be careful."})
    write_yaml(config, loop_config(ws, path, rules=RULES, sandbox=box(mode), transcripts=str(transcripts),
                                   role="role.yaml"))  # fmt: skip
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KERNEL_ONLY_MARK": mark})  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = "\n".join(agent_messages(Path(report["transcript"])))
    return done, said, workspace


def outcome(said: str, what: str) -> str:
    line = next(line for line in said.splitlines() if line.startswith(what + ": "))
    return line.split(": ", 1)[1].split(" ")[0]


@pytest.mark.parametrize("via", ["agent", "terminal"])
@pytest.mark.parametrize("mode", [*MODES, "overlay"])
def test_an_allowed_program_cannot_write_outside_its_rules_read_masks_or_see_the_kernel(tmp_path, listener, mode, via):
    done, said, workspace = hostile_run(tmp_path, mode, via, listener)

    on = mode != "off"
    expected = "blocked" if on else "done"
    for what in ("outside", "git hook", "git config", "nested git", "config", "role", "transcripts"):
        assert outcome(said, f"write {what}") == expected, (what, said)
    # an unruled path in the worktree: the OS refuses it with directory binds; the overlay takes it, and the
    # boundary refuses the task for it (nothing reaches the tree, as the assert on docs/planted.txt says)
    assert outcome(said, "write unruled path") == ("done" if mode in ("off", "overlay") else "blocked"), said
    if mode == "overlay":  # the task lands nothing (refused, or not completed): its changes are set aside
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["reason"].get("source") == "change" or report["reason"].get("set_aside"), report
    assert outcome(said, "connect") == expected, said
    assert outcome(said, "read secret") == expected, said
    assert outcome(said, "see kernel") == expected, said
    assert outcome(said, "write home") == "done", said
    if on:  # the private temp dir (outside, TMPDIR may be unset)
        assert outcome(said, "write tmp") == "done", said
    assert (tmp_path / "outside.txt").exists() is not on
    assert (workspace / ".git/hooks/pre-commit").exists() is not on
    assert ("planted" in (workspace / ".git/config").read_text()) is not on
    assert (workspace / "docs/planted.txt").exists() is not on
    assert ("planted" in (tmp_path / "loop.yaml").read_text()) is not on


@LOOP_SLOW
def test_the_transcript_records_the_sandbox_argv_and_mounts(tmp_path, listener):
    done, _, workspace = hostile_run(tmp_path, "workspace-write", "agent", listener)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    records = read_transcript(Path(report["transcript"]))
    sandbox = next(r for r in records if r["type"] == "sandbox")
    assert sandbox["mode"] == "workspace-write"
    assert sandbox["argv"][0] == sandbox["bwrap"] and "--unshare-net" in sandbox["argv"]
    mounts = {(m["how"], m["path"]) for m in sandbox["mounts"]}
    real = os.path.realpath(workspace)
    assert ("rw", f"{real}/src") in mounts
    assert ("ro", f"{real}/.git") in mounts
    assert ("mask-dir", f"{real}/src/secrets") in mounts
    assert ("rw", real) not in mounts  # only what write rules name is writable
    starts = [r for r in records if r["type"] == "agent_start"]
    assert starts[0]["argv"][: len(sandbox["argv"])] == sandbox["argv"]


@LOOP_SLOW
@pytest.mark.parametrize("mode", MODES)
def test_nothing_the_agent_started_outlives_a_killed_kernel(tmp_path, mode):
    """SIGKILL of the kernel: no teardown runs. A `setsid` grandchild of the agent and a background terminal
    must still die with it."""
    tag = str(3_000_000 + secrets.randbelow(1_000_000))  # a unique `sleep` argument to find them by
    steps = [
        {"run": {"script": f"setsid sleep {tag}1 >/dev/null 2>&1 < /dev/null & echo started"}},
        {"terminal": {"command": "sleep", "args": [f"{tag}2"], "wait": False}},
        {"message": "both started"},
        {"hang": True},
    ]
    ws = make_workspace(tmp_path / "ws")
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(*steps)]}))
    transcript = tmp_path / "transcripts" / "run.jsonl"
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=RULES, sandbox=box(mode)))
    kernel = subprocess.Popen([CLI, "run", str(config), "--transcript", str(transcript)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "both started" not in (transcript.read_text() if transcript.exists() else ""):
            assert time.monotonic() < deadline and kernel.poll() is None, "the agent never started both"
            time.sleep(0.05)
        while len(sleepers(tag)) < 2:  # bwrap execs the terminal's sleep a moment after create answers
            assert time.monotonic() < deadline, sleepers(tag)
            time.sleep(0.05)
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
        deadline = time.monotonic() + 5
        while sleepers(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = sleepers(tag)
        assert (left == []) is (mode != "off"), left
    finally:
        kernel.kill()
        kernel.wait()
        for process in sleepers(tag):
            process.kill()


def sleepers(tag: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[:1] == ["sleep"] and cmdline[-1].startswith(tag) and process.info["status"] != "zombie":
            found.append(process)
    return found


@pytest.mark.parametrize(
    ("bwrap", "cause"),
    [("/nonexistent/bwrap", "could not run"), ("false", "failed (1)"), ("no-such-bwrap-here", "no bwrap found")],
)
def test_a_sandbox_that_cannot_start_blocks_the_run_and_says_how_to_opt_out(tmp_path, bwrap, cause):
    ws = make_workspace(tmp_path / "ws")
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn({"message": "never"})]}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, sandbox={"mode": "workspace-write",
                                                                               "bwrap": bwrap}))  # fmt: skip
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=60)

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["terminal"] == "BlockedPrecondition"
    assert report["reason"]["check"] == "sandbox_available"
    assert cause in report["reason"]["detail"]
    assert "sandbox: {mode: off}" in report["reason"]["detail"]
    assert not [r for r in read_transcript(Path(report["transcript"])) if r["type"] == "agent_start"]


def test_read_only_mode_leaves_the_worktree_unwritable_but_home_writable(tmp_path, listener):
    ws = make_workspace(tmp_path / "ws")
    script = "echo x >> README.md; echo x > $HOME/h && echo home-ok"
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn({"run": {"script": script}})]}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=RULES, sandbox={"mode": "read-only"}))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=60)
    said = "\n".join(agent_messages(Path(json.loads(done.stdout.strip().splitlines()[-1])["transcript"])))
    assert "README.md: Read-only file system" in said
    assert "home-ok" in said
    assert (ws.path / "README.md").read_text() == "A workspace for loop-harness.\n"


@LOOP_SLOW
def test_a_private_home_and_temp_dir_are_removed_when_the_run_ends(tmp_path, listener):
    done, said, _ = hostile_run(tmp_path, "workspace-write", "agent", listener)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    sandbox = next(r for r in read_transcript(Path(report["transcript"])) if r["type"] == "sandbox")
    assert outcome(said, "write home") == "done"
    assert not Path(sandbox["home"]).exists() and not Path(sandbox["tmp"]).exists()


#: Fetches each URL as the agent's own tools would (urllib honours HTTP_PROXY) and connects to each port
#: directly (past any proxy); one line per attempt.
FETCH = """\
import socket, sys, urllib.request
for url in sys.argv[1].split(","):
    try:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        print("fetch " + url + ": done " + body)
    except Exception as exc:
        print("fetch " + url + ": blocked (" + str(exc)[:80] + ")")
for port in sys.argv[2].split(","):
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        print("direct " + port + ": done")
    except OSError as exc:
        print("direct " + port + ": blocked (" + type(exc).__name__ + ")")
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello-from-" + self.headers["Host"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("via", ["agent", "terminal"])
@pytest.mark.parametrize("mode", MODES)
def test_commands_reach_only_the_hosts_a_network_rule_allows_through_the_proxy(tmp_path, mode, via):
    """`localhost` is allowed, `127.0.0.1` is not: the same server, reached by its allowed name only, and
    never directly. With the sandbox off everything connects."""
    server = LoopbackServer(_Hello)
    try:
        port = server.url.rsplit(":", 1)[1]
        urls = f"http://localhost:{port}/,http://127.0.0.1:{port}/"
        ws = make_workspace(tmp_path / "ws", files={"tools/fetch.py": textwrap.dedent(FETCH)})
        args = ["tools/fetch.py", urls, port]
        step = ({"run": {"script": "python3 " + " ".join(args)}} if via == "agent"
                else {"terminal": {"command": "python3", "args": args}})  # fmt: skip
        rules = [*RULES, {"id": "fetch", "kind": "execute", "commands": ["python3 tools/fetch.py *"],
                          "decision": "allow"},
                 {"id": "local-api", "kind": "network", "hosts": ["localhost"], "decision": "allow"}]  # fmt: skip
        path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(step)]}))
        config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules, sandbox=box(mode)))
        done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    finally:
        server.close()
    transcript = Path(json.loads(done.stdout.strip().splitlines()[-1])["transcript"])
    said = "\n".join(agent_messages(transcript))
    assert outcome(said, f"fetch http://localhost:{port}/") == "done", said
    assert f"hello-from-localhost:{port}" in said
    on = mode != "off"
    assert outcome(said, f"fetch http://127.0.0.1:{port}/") == ("blocked" if on else "done"), said
    assert outcome(said, f"direct {port}") == ("blocked" if on else "done"), said
    if on:
        assert "403" in said
        egress = [(r["host"], r["allowed"]) for r in read_transcript(transcript) if r["type"] == "egress"]
        assert ("localhost", True) in egress and ("127.0.0.1", False) in egress


@LOOP_SLOW
def test_a_sandboxed_agent_still_reaches_the_host_tools(tmp_path):
    """The host tools are served on the kernel's loopback; the agent's sandbox relays their port."""
    ws = make_workspace(tmp_path / "ws")
    mcp = {"agent": {"mcp_http": True}}
    steps = [{"mcp_list": {}}, {"mcp_call": {"tool": "get_issue"}}]
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(*steps)]}, **mcp))
    tasks = [{"id": "T1", "title": "Add a greeting", "body": "say hi"}]
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, tasks=tasks, sandbox=box("workspace-write")))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    transcript = Path(json.loads(done.stdout.strip().splitlines()[-1])["transcript"])
    said = "\n".join(agent_messages(transcript))
    assert "say hi" in said, said
    assert next(r for r in read_transcript(transcript) if r["type"] == "sandbox")["network"]["host_tools"]


ESCAPE = textwrap.dedent(ESCAPE)


def commit_run(tmp_path: Path, sandbox: dict, workspace_commit: dict | None) -> tuple[dict, str, object]:
    """Two tasks; each writes a file, then tries to commit and push it itself (as a careful agent would)."""
    from scripted_agents.presets import commit_step, write_turn

    ws = make_workspace(tmp_path / "ws")
    turns = {task: [turn(*write_turn(f"src/{task}.txt", f"{task}\n")["steps"], commit_step(task))]
             for task in ("T1", "T2")}  # fmt: skip
    path = write_yaml(tmp_path / "scenario.yaml", scenario(turns))
    tasks = [{"id": "T1", "title": "One"}, {"id": "T2", "title": "Two"}]
    config = loop_config(ws, path, rules=DEFAULT_RULES, tasks=tasks, sandbox=sandbox)
    if workspace_commit is not None:
        config["workspace"] = {"path": config["workspace"], "commit": workspace_commit}
    done = subprocess.run([CLI, "run", str(write_yaml(tmp_path / "loop.yaml", config)), "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, "\n".join(agent_messages(Path(report["transcript"]))), ws


def test_under_a_read_only_git_the_kernel_commits_and_pushes_each_completed_task(tmp_path):
    report, said, ws = commit_run(tmp_path, {"mode": "workspace-write"}, {"message": "{id}: {title}"})

    assert report["terminal"] == "Idle", report
    assert "Read-only file system" in said  # the agent's own `git commit` failed cleanly
    assert ws.pushed_log()[:2] == ["T2: Two", "T1: One"]
    assert ws.git("status", "--porcelain") == ""
    assert ws.git("fsck", "--no-progress") == ""
    assert not (ws.path / ".git" / "index.lock").exists()
    commits = [r for r in read_transcript(Path(report["transcript"])) if r["type"] == "commit"]
    assert [(c["task"], c["committed"], c["pushed"]) for c in commits] == [("T1", True, True), ("T2", True, True)]


def test_without_the_commit_step_a_read_only_git_stops_the_queue_after_the_first_task(tmp_path):
    report, said, _ = commit_run(tmp_path, {"mode": "workspace-write"}, None)
    assert report["terminal"] == "BlockedPrecondition"
    assert report["reason"]["check"] == "git_clean_tree"
    assert "Read-only file system" in said


@LOOP_SLOW
def test_git_writable_lets_the_agent_commit_but_never_touch_hooks_or_config(tmp_path):
    """The agent's own commits stand; the kernel only pushes them (the upstream is outside the sandbox)."""
    report, said, ws = commit_run(tmp_path, {"mode": "workspace-write", "git_writable": True}, {"message": "-"})
    assert report["terminal"] == "Idle", (report, said)
    assert ws.pushed_log()[:2] == ["T2", "T1"]
    sandbox = next(r for r in read_transcript(Path(report["transcript"])) if r["type"] == "sandbox")
    real = os.path.realpath(ws.path)
    mounts = {(m["how"], m["path"]) for m in sandbox["mounts"]}
    assert {("rw", f"{real}/.git"), ("ro", f"{real}/.git/hooks"), ("ro", f"{real}/.git/config")} <= mounts


@pytest.mark.parametrize(
    ("changes", "key", "words"),
    [
        ({"commit": {"push": True}}, "commit", "workspace.commit"),
        ({"workspace": {"commit": {}}}, "workspace", "`path`"),
        ({"workspace": {"path": ".", "commit": {"message": "{task}"}}}, "commit.message", "{id} and {title}"),
        ({"workspace": {"path": ".", "commit": {"author": "nobody"}}}, "commit.author", "pattern"),
        ({"sandbox": {"mode": "danger-full-access"}}, "sandbox.mode", "workspace-write"),
        ({"sandbox": {"network": True}}, "sandbox.network", "Extra inputs"),
    ],
)
def test_a_bad_sandbox_or_commit_setting_names_its_key(tmp_path, changes, key, words):
    from harness import ConfigError
    from harness.config._config import parse_config

    data = {"workspace": str(tmp_path), "agent": {"command": ["x"]}, **changes}
    with pytest.raises(ConfigError) as raised:
        parse_config(data, base_dir=tmp_path)
    assert raised.value.key == key and words in str(raised.value), raised.value


def test_workspace_as_a_mapping_keeps_its_path_and_turns_the_commit_step_on(tmp_path):
    from harness.config._config import parse_config

    config = parse_config({"workspace": {"path": ".", "commit": None}, "agent": {"command": ["x"]}}, base_dir=tmp_path)
    assert config.workspace == tmp_path and config.commit is not None and config.commit.push is True
    plain = parse_config({"workspace": ".", "agent": {"command": ["x"]}}, base_dir=tmp_path)
    assert plain.commit is None and plain.sandbox.mode == "workspace-write"  # on by default


@pytest.mark.parametrize("mode", MODES)
def test_a_search_of_the_tree_is_allowed_and_never_reads_the_masked_files(tmp_path, mode):
    """With a read deny in place, `grep -r` over the whole tree is allowed inside the sandbox (the denied files
    are masked: an empty file, an empty directory) and finds nothing there; without it, it is refused."""
    ws = make_workspace(tmp_path / "ws", files={"src/secrets/key": "TOPSECRET\n", "src/.env": "TOPSECRET=1\n",
                                                "docs/readme.md": "not secret\n"})  # fmt: skip
    rules = [*RULES, {"id": "env", "kind": "read", "paths": ["**/.env"], "decision": "deny"},
             {"id": "grep", "kind": "execute", "commands": ["grep *"], "decision": "allow"}]  # fmt: skip
    step = {"terminal": {"command": "grep", "args": ["-rn", "-e", "TOPSECRET", "-e", "not secret", "."]}}
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(step)]}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules, sandbox=box(mode)))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = "\n".join(agent_messages(Path(report["transcript"])))
    if mode == "off":
        assert report["terminal"] == "BlockedPolicy", report
        assert report["reason"]["refusal"]["kind"] == "denied"
        return
    assert "./docs/readme.md:1:not secret" in said, said
    assert "TOPSECRET" not in said.replace("-e TOPSECRET", ""), said
    decisions = [r["decision"] for r in read_transcript(Path(report["transcript"])) if r["type"] == "policy"]
    assert decisions and set(decisions) == {"allow"}, decisions


@pytest.mark.parametrize("mode", MODES)
def test_a_gitdir_target_inside_a_writable_worktree_stays_read_only(tmp_path, mode):
    """`.git` is a `gitdir:` file pointing at `.gitdata` in the worktree, and a write rule opens all of it: the
    repository it names is still read-only inside."""
    ws = make_workspace(tmp_path / "ws")
    (ws.path / ".git").rename(ws.path / ".gitdata")
    (ws.path / ".git").write_text("gitdir: .gitdata\n")
    with (ws.path / ".gitdata" / "info" / "exclude").open("a") as exclude:
        exclude.write(".gitdata/\n")
    assert ws.git("status", "--porcelain") == ""
    script = "echo planted > .gitdata/hooks/pre-commit; echo planted >> .gitdata/config; echo fine > src.txt"
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn({"run": {"script": script}})]}))
    rules = [{"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
             {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"}]  # fmt: skip
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules, sandbox=box(mode)))
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    said = "\n".join(agent_messages(Path(json.loads(done.stdout.strip().splitlines()[-1])["transcript"])))
    on = mode != "off"
    assert (ws.path / ".gitdata/hooks/pre-commit").exists() is not on, said
    assert ("planted" in (ws.path / ".gitdata/config").read_text()) is not on, said
    assert (ws.path / "src.txt").read_text() == "fine\n"  # the rest of the worktree is writable


@pytest.mark.parametrize("via", ["agent", "terminal"])
@pytest.mark.parametrize("mode", MODES)
def test_a_descriptor_the_kernel_inherited_never_reaches_the_agent_or_its_commands(tmp_path, mode, via):
    """Whoever starts the kernel may leave a descriptor open and inheritable (make's jobserver pipe, a CI runner's
    log): neither the agent nor a command run for it may write to it, sandbox or not. (The stock loop spawns with
    `close_fds`; uvloop, tried for issue 15, does not: there 3 of these 4 cases failed.)"""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    os.set_blocking(read_end, False)
    # The agent's own descriptors are its script's parent's; a terminal command's are its own.
    probe = (f'fd=/proc/$1/fd/{write_end}; if [ -e "$fd" ]; then echo fd: open; echo leaked > "$fd"; '
             f"else echo fd: closed; fi\n")  # fmt: skip
    ws = make_workspace(tmp_path / "ws", files={"tools/fd.sh": probe})
    terminal = {"terminal": {"command": "bash", "args": ["tools/fd.sh", "self"]}}
    step = {"run": {"script": "bash tools/fd.sh $PPID"}} if via == "agent" else terminal
    rules = [*RULES, {"id": "probe", "kind": "execute", "commands": ["bash tools/fd.sh self"], "decision": "allow"}]
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": [turn(step)]}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=rules, sandbox=box(mode),
                                                            transcripts=str(tmp_path / "runs")))  # fmt: skip
    try:
        done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120,
                              pass_fds=(write_end,))  # fmt: skip
    finally:
        os.close(write_end)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    said = "\n".join(agent_messages(Path(report["transcript"])))
    records = read_transcript(Path(report["transcript"]))
    assert records[-1]["type"] == "terminal"
    assert outcome(said, "fd") == "closed", said
    try:
        written = os.read(read_end, 100)  # b"": every write end is closed, and nothing came through
    except BlockingIOError:
        written = b"<a process still holds the write end>"
    finally:
        os.close(read_end)
    assert written == b""
