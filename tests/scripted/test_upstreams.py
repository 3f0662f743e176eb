"""Which ref a branch tracks is resolved by libgit2 again whenever a configuration file changed, and only then;
the ref itself is read at every boundary."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pygit2

from harness.git._preconditions import check_git, read_git_state
from harness.git._upstreams import Upstreams
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

TRACKED = "refs/remotes/origin/main"


def aged(*files: Path) -> None:
    """Modified a minute ago: past the window in which a timestamp may not show the next change."""
    old = time.time() - 60
    for f in files:
        os.utime(f, (old, old))


def upstreams_of(workspace) -> tuple[pygit2.Repository, Upstreams, Path]:
    repo = pygit2.Repository(str(workspace.path))
    config = Path(repo.path) / "config"
    aged(config)
    return repo, Upstreams(repo, [Path(repo.path)]), config


def test_the_answer_is_kept_until_the_configuration_changes(harness_workspace):
    repo, upstreams, _config = upstreams_of(harness_workspace)
    assert upstreams.name("main") == TRACKED
    assert upstreams.name("main") == TRACKED
    assert upstreams.resolved == 1  # the second came from the kept answer

    harness_workspace.git("branch", "--unset-upstream")  # git rewrites .git/config
    assert upstreams.name("main") is None
    assert upstreams.resolved == 2
    state = read_git_state(harness_workspace.path, Path(repo.path), repo, upstreams)
    stop = check_git(state)
    assert stop is not None and stop.reason["check"] == "git_upstream"


def test_a_recently_modified_file_is_not_trusted(harness_workspace):
    """Timestamps are coarse: a file written in the last two seconds may change again unseen, so nothing is kept."""
    _repo, upstreams, config = upstreams_of(harness_workspace)
    config.write_text(config.read_text())  # modified now
    assert upstreams.name("main") == TRACKED
    assert upstreams.name("main") == TRACKED
    assert upstreams.resolved == 2


def test_a_configuration_with_an_include_is_resolved_every_time(harness_workspace, tmp_path):
    """An included file is not watched: the answer is never kept."""
    _repo, upstreams, config = upstreams_of(harness_workspace)
    extra = tmp_path / "extra.gitconfig"
    extra.write_text("[core]\n\tquotepath = false\n")
    with config.open("a") as f:
        f.write(f"[include]\n\tpath = {extra}\n")
    aged(config, extra)
    upstreams.name("main")
    upstreams.name("main")
    assert upstreams.resolved == 2


def test_a_push_is_seen_at_the_next_read_with_the_name_kept(harness_workspace):
    repo, upstreams, _config = upstreams_of(harness_workspace)
    harness_workspace.commit("local", {"notes.txt": "x\n"})
    git_dir = Path(repo.path)
    assert read_git_state(harness_workspace.path, git_dir, repo, upstreams).ahead == 1
    harness_workspace.git("push", "-q", "origin", "main")
    assert read_git_state(harness_workspace.path, git_dir, repo, upstreams).ahead == 0
    assert upstreams.resolved == 1


def test_a_config_file_swapped_behind_a_symlink_is_read_again(harness_workspace, tmp_path):
    """The stamp is the file's, followed through a link: pointing the link elsewhere is a change."""
    _repo, upstreams, config = upstreams_of(harness_workspace)
    first, second = tmp_path / "first.config", tmp_path / "second.config"
    first.write_text(config.read_text())
    second.write_text(config.read_text().replace("merge = refs/heads/main", "merge = refs/heads/other"))
    aged(first, second)
    config.unlink()
    config.symlink_to(first)
    assert upstreams.name("main") == TRACKED
    assert upstreams.name("main") == TRACKED
    assert upstreams.resolved == 1  # kept: the link's target is old
    config.unlink()
    config.symlink_to(second)
    assert upstreams.name("main") == "refs/remotes/origin/other"
    aged(second)
    upstreams.name("main")
    second.write_text(second.read_text().replace("refs/heads/other", "refs/heads/third"))  # the target, edited
    assert upstreams.name("main") == "refs/remotes/origin/third"


def test_a_config_file_dated_in_the_future_is_never_trusted(harness_workspace):
    _repo, upstreams, config = upstreams_of(harness_workspace)
    later = time.time() + 3600
    os.utime(config, (later, later))
    upstreams.name("main")
    upstreams.name("main")
    assert upstreams.resolved == 2
