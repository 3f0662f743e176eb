"""Two traps a new user hits, each said plainly with the fix:

* `transcripts:` inside the workspace: every run's transcript would dirty the worktree, and an agent allowed
  to write there (`**`) could rewrite the record of its own run. Refused at config load, however the path is
  spelled (relative to a config in the worktree, `..`, a symlink, `~`); a directory beside the worktree is fine.
* no `queue:` at all: draining the default empty queue ends `Idle`, exit 0 (the contract's default), having
  done nothing: the CLI says so on stderr and what to add; a `--prompt` run needs no queue.

Each refusal leaves no transcript and the workspace exactly as it was (`git status --porcelain --ignored`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import ConfigError, load_config
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.testing import Workspace, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED

#: T1 writes src/a.txt (a run that completes it has the kernel commit it: `workspace.commit`); a prompt says hi.
SCENARIO = scenario({"T1": [write_turn("src/a.txt", "a\n")], None: [turn({"message": "hi"})]})


def cli(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "harness", "run", str(config), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def last_json(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.strip().splitlines()[-1])


def tree(ws: Workspace) -> str:
    return ws.git("status", "--porcelain", "--ignored")


def transcripts_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl"))


@pytest.fixture(name="ws")
def ws_fixture(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture(name="agent_scenario")
def agent_scenario_fixture(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "scenario.yaml", SCENARIO)


def assert_refused(done: subprocess.CompletedProcess[str], key: str, *needles: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "config error in " in done.stderr and f"{key}: " in done.stderr, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    error = last_json(done.stdout)["error"]
    assert (error["kind"], error["key"]) == ("config", key)
    return done.stderr


# --- transcripts inside the workspace -----------------------------------------------------------------


def _in_worktree_config(tmp_path: Path, ws: Workspace, scenario_path: Path, transcripts: str) -> Path:
    """The config kept (committed) in the worktree itself, its paths relative to it: the tree is clean."""
    data = loop_config(Path("."), scenario_path, transcripts=transcripts)
    ws.commit("keep the loop config here", {"loop.yaml": json.dumps(data)}, push=True)
    return ws.path / "loop.yaml"


def _beside_config(tmp_path: Path, ws: Workspace, scenario_path: Path, transcripts: str, **options: Any) -> Path:
    return write_yaml(tmp_path / "loop.yaml", loop_config(ws, scenario_path, transcripts=transcripts, **options))


def _symlink_to_a_new_dir_inside(tmp_path: Path, ws: Workspace, scenario_path: Path) -> Path:
    (tmp_path / "runs").symlink_to(ws.path / "transcripts")  # dangling: the directory is not made yet
    return _beside_config(tmp_path, ws, scenario_path, "runs")


def _symlink_to_the_worktree(tmp_path: Path, ws: Workspace, scenario_path: Path) -> Path:
    (tmp_path / "wt").symlink_to(ws.path, target_is_directory=True)
    return _beside_config(tmp_path, ws, scenario_path, "wt/transcripts")


def _workspace_through_a_symlink(tmp_path: Path, ws: Workspace, scenario_path: Path) -> Path:
    (tmp_path / "wt").symlink_to(ws.path, target_is_directory=True)
    data = loop_config(tmp_path / "wt", scenario_path, transcripts=str(ws.path / "transcripts"))
    return write_yaml(tmp_path / "loop.yaml", data)


INSIDE = {
    "relative-to-a-config-in-the-worktree": lambda t, w, s: _in_worktree_config(t, w, s, "transcripts"),
    "dot-slash-in-the-worktree": lambda t, w, s: _in_worktree_config(t, w, s, "./transcripts"),
    "the-worktree-itself": lambda t, w, s: _in_worktree_config(t, w, s, "."),
    "absolute": lambda t, w, s: _beside_config(t, w, s, str(w.path / "transcripts")),
    "dot-dot": lambda t, w, s: _beside_config(t, w, s, "workspace/../workspace/transcripts"),
    "dot-dot-from-inside": lambda t, w, s: _beside_config(t, w, s, "workspace/src/../.runs"),
    "symlink-to-a-dir-inside": _symlink_to_a_new_dir_inside,
    "symlink-to-the-worktree": _symlink_to_the_worktree,
    "workspace-through-a-symlink": _workspace_through_a_symlink,
}


@pytest.mark.parametrize("spelling", list(INSIDE), ids=list(INSIDE))
def test_transcripts_inside_the_workspace_are_refused_at_load(tmp_path, ws, agent_scenario, spelling):
    config = INSIDE[spelling](tmp_path, ws, agent_scenario)
    before = tree(ws)
    assert before == ""

    done = cli(config, "--json")

    stderr = assert_refused(done, "transcripts", "is inside the workspace", "outside the worktree", "beside it")
    assert f"transcripts: {tmp_path.resolve() / 'transcripts'}" in stderr  # the fix, spelled out
    assert transcripts_under(tmp_path) == []
    assert not (ws.path / "transcripts").exists() and not (ws.path / ".runs").exists()
    assert tree(ws) == before
    with pytest.raises(ConfigError) as raised:  # the library refuses it the same way
        load_config(config)
    assert raised.value.key == "transcripts"


def test_transcripts_under_a_tilde_that_is_the_workspace_are_refused(tmp_path, ws, agent_scenario):
    config = _beside_config(tmp_path, ws, agent_scenario, "~/transcripts")

    done = cli(config, "--json", env={"HOME": str(ws.path)})

    assert_refused(done, "transcripts", f"{ws.path / 'transcripts'} is inside the workspace {ws.path}")
    assert transcripts_under(tmp_path) == []
    assert tree(ws) == ""


@pytest.mark.parametrize("how", ["--transcript", "default"])
def test_a_transcript_file_or_default_directory_inside_the_workspace_is_refused(tmp_path, ws, agent_scenario, how):
    """The key is checked at load; --transcript, and the default directory (under $XDG_STATE_HOME, here the
    workspace's), are checked when the run starts, before anything is written."""
    data = loop_config(ws, agent_scenario)
    config = write_yaml(tmp_path / "loop.yaml", data)  # no transcripts key: the default directory
    if how == "--transcript":
        done = cli(config, "--json", "--transcript", str(ws.path / "run.jsonl"))
    else:
        done = cli(config, "--json", env={"XDG_STATE_HOME": str(ws.path / ".state")})

    assert_refused(done, "transcript", "is inside the workspace")
    assert transcripts_under(ws.path) == []
    assert tree(ws) == ""


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_a_transcript_file_that_is_a_link_into_the_workspace_is_refused(tmp_path, ws, agent_scenario, link):
    notes = ws.write("NOTES.md", "mine\n")
    ws.commit("notes", push=True)
    outside = tmp_path / "t.jsonl"
    outside.symlink_to(notes) if link == "symlink" else outside.hardlink_to(notes)

    done = cli(write_yaml(tmp_path / "loop.yaml", loop_config(ws, agent_scenario)), "--json", "--transcript",
               str(outside))  # fmt: skip

    assert_refused(done, "transcript", "inside the workspace" if link == "symlink" else "hard links")
    assert notes.read_text() == "mine\n" and tree(ws) == ""


@pytest.mark.parametrize("where", ["transcripts", "workspace-transcripts", "."])
def test_transcripts_beside_the_workspace_run(tmp_path, ws, agent_scenario, where):
    """Beside the worktree, under a name that merely starts with the worktree's, or its parent: all outside."""
    config = _beside_config(tmp_path, ws, agent_scenario, where, commit={})  # the kernel commits T1's file

    done = cli(config, "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    report = last_json(done.stdout)
    assert (report["terminal"], [t["terminal"] for t in report["tasks"]]) == ("Idle", ["Completed"])
    transcript = Path(report["transcript"])
    assert transcript.parent == (tmp_path / where).resolve() and transcript.is_file()
    assert tree(ws) == ""


# --- a queue run with no queue ------------------------------------------------------------------------


def _no_queue_config(tmp_path: Path, ws: Workspace, scenario_path: Path, **queue: Any) -> Path:
    data = loop_config(ws, scenario_path, transcripts=str(tmp_path / "transcripts"))
    del data["queue"]
    if queue:
        data["queue"] = queue
    return write_yaml(tmp_path / "loop.yaml", data)


NO_QUEUE_FIX = ("has no queue section", "add a queue: section (provider: memory with tasks, or github)",
                "or pass --prompt TEXT")  # fmt: skip


def test_a_queue_run_without_a_queue_says_so(tmp_path, ws, agent_scenario):
    """The contract keeps its default (an empty memory queue: Idle, exit 0), but never silently."""
    config = _no_queue_config(tmp_path, ws, agent_scenario)

    done = cli(config, "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    assert (last_json(done.stdout)["terminal"], last_json(done.stdout)["tasks"]) == ("Idle", [])
    assert "warning: queue: " in done.stderr and all(fix in done.stderr for fix in NO_QUEUE_FIX), done.stderr
    assert tree(ws) == ""


def test_a_config_with_a_queue_gets_no_warning(tmp_path, ws, agent_scenario):
    done = cli(_no_queue_config(tmp_path, ws, agent_scenario, provider="memory", tasks=[]), "--json")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


def test_a_prompt_run_needs_no_queue(tmp_path, ws, agent_scenario):
    config = _no_queue_config(tmp_path, ws, agent_scenario)

    done = cli(config, "--json", "--prompt", "hello")

    assert done.returncode == 1, done.stdout + done.stderr  # EndTurn is not Idle or Completed
    report = last_json(done.stdout)
    assert report["terminal"] == "EndTurn"
    assert Path(report["transcript"]).parent == tmp_path / "transcripts"


def test_an_explicitly_empty_memory_queue_ends_idle(tmp_path, ws, agent_scenario):
    config = _no_queue_config(tmp_path, ws, agent_scenario, provider="memory", tasks=[])

    done = cli(config, "--json")

    assert done.returncode == 0, done.stdout + done.stderr
    report = last_json(done.stdout)
    assert (report["terminal"], report["reason"], report["tasks"]) == (
        "Idle",
        {"kind": "queue_empty", "completed": 0},
        [],
    )
    assert tree(ws) == ""


# --- paths the CLI once crashed on or read as its own working directory -----------------------------------

PATH_TRAPS = {
    "empty-home": ({"sandbox": {"home": ""}}, "sandbox.home", "an empty path"),
    "empty-tmp": ({"sandbox": {"tmp": ""}}, "sandbox.tmp", "an empty path"),
    "unknown-user-home": ({"sandbox": {"home": "~nosuchuser-lh/h"}}, "sandbox.home", "nosuchuser-lh"),
    "unknown-user-hide": ({"sandbox": {"hide": ["~nosuchuser-lh/x"]}}, "sandbox.hide", "nosuchuser-lh"),
    "unknown-user-transcripts": ({"transcripts": "~nosuchuser-lh/t"}, "transcripts", "nosuchuser-lh"),
    "profile-not-text": ({"autonomy": {"profile": ["default"]}}, "autonomy.profile", "is not a profile"),
}


@pytest.mark.parametrize("trap", list(PATH_TRAPS), ids=list(PATH_TRAPS))
def test_a_path_or_profile_that_cannot_be_used_is_a_config_error_naming_its_key(tmp_path, ws, agent_scenario, trap):
    """An empty `sandbox.home` was read as "." (the kernel's working directory, mounted writable as the agent's
    HOME); an unknown `~user` and a non-text profile crashed the load with a traceback."""
    extra, key, needle = PATH_TRAPS[trap]
    config = write_yaml(tmp_path / "loop.yaml", {**loop_config(ws, agent_scenario), **extra})
    assert_refused(cli(config, "--json"), key, needle)
