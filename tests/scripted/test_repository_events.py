"""The repository's inotify queue, which lets the boundary keep a git read taken while the agent closed its
session: reading raises nothing, every change git can make to what the boundary reads raises an event (in
the git dir, a linked worktree's shared one, `info/`, refs in folders made since), and past its watch limit
it says "changed" every time."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from harness.git._preconditions import read_git_state, repository_dirs
from harness.git._repository_events import RepositoryEvents
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.testing import make_workspace

pytestmark = LOOP_SCRIPTED


@pytest.fixture
def repo(tmp_path):
    workspace = make_workspace(tmp_path / "ws")
    events = RepositoryEvents(repository_dirs(workspace.path / ".git"))
    yield workspace, events
    events.close()


def test_the_boundarys_own_read_raises_nothing(repo):
    workspace, events = repo
    for _ in range(3):
        state = read_git_state(workspace.path, workspace.path / ".git")
    assert (state.branch, state.upstream, state.ahead, state.changes) == ("main", "origin/main", 0, ())
    assert not events.changed()


CHANGES = {
    "commit": ["commit", "-q", "--allow-empty", "-m", "x"],
    "stage": ["add", "README.md"],  # after a write below: the index is rewritten
    "switch branch": ["checkout", "-q", "-b", "other"],
    "detach": ["checkout", "-q", "--detach"],
    "upstream config": ["branch", "--unset-upstream"],
    "push": ["push", "-q", "origin", "main:elsewhere"],  # a new remote-tracking ref
    "pack refs": ["pack-refs", "--all"],
    "tag": ["tag", "v1"],
}


@pytest.mark.parametrize("args", CHANGES.values(), ids=CHANGES.keys())
def test_each_change_git_makes_to_what_the_boundary_reads_raises_an_event(repo, args):
    workspace, events = repo
    if args[0] == "add":
        workspace.write("README.md", "changed\n")
        assert not events.changed()  # the worktree is not watched here: WorktreeEvents is
    workspace.git(*args)
    assert events.changed()
    assert not events.changed()  # drained


def test_an_edit_session_file_and_an_exclude_rule_raise_events(repo):
    workspace, events = repo
    git_dir = workspace.path / ".git"
    (git_dir / "MERGE_HEAD").write_text(workspace.git("rev-parse", "HEAD"))
    assert events.changed()
    assert read_git_state(workspace.path, git_dir).edit_session == "merge"
    (git_dir / "info" / "exclude").write_text("README.md\n")
    assert events.changed()


def test_a_ref_in_a_folder_made_since_is_watched(repo):
    workspace, events = repo
    workspace.git("branch", "feature/deep/x")
    assert events.changed()  # and refs/heads/feature/deep is watched from here
    (workspace.path / ".git" / "refs" / "heads" / "feature" / "deep" / "x").write_text("0" * 40 + "\n")
    assert events.changed()


def test_a_linked_worktrees_queue_sees_a_commit_made_in_the_main_one(tmp_path):
    workspace = make_workspace(tmp_path / "ws")
    linked = tmp_path / "linked"
    workspace.git("worktree", "add", "-q", "-b", "side", str(linked))
    git_dir = pygit2.Repository(str(linked)).path
    events = RepositoryEvents(repository_dirs(Path(git_dir)))
    try:
        assert len(events.git_dirs) == 2  # its own (HEAD, index) and the shared one (refs, config)
        assert not events.changed()
        workspace.git("commit", "-q", "--allow-empty", "-m", "on main")
        assert events.changed()
    finally:
        events.close()


def test_more_directories_than_it_may_watch_make_it_say_changed_every_time(tmp_path):
    workspace = make_workspace(tmp_path / "ws")
    for i in range(3):
        workspace.git("branch", f"f{i}/x")
    events = RepositoryEvents(repository_dirs(workspace.path / ".git"), max_watches=4)
    try:
        assert events.blind
        assert events.changed() and events.changed()
    finally:
        events.close()
