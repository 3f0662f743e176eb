"""The worktree's inotify queue, which lets a change measure skip its git read when nothing happened: every
kind of write an agent can make raises an event (in a new directory, a moved one, after the queue
overflowed), `.git` raises none, and a meter with the queue reports what a meter without it reports."""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import pygit2
import pytest

from harness.budget._changes import ChangeCount, ChangeMeter
from harness.git._worktree_events import WorktreeEvents
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.testing import make_workspace

pytestmark = LOOP_SCRIPTED


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "deep" / "a.txt").write_text("a\n")
    (root / ".git").mkdir()
    events = WorktreeEvents(root)
    yield root, events
    events.close()


def test_a_quiet_tree_raises_nothing_and_a_write_deep_inside_raises_once(tree):
    root, events = tree
    assert not events.changed()
    (root / "src" / "deep" / "a.txt").write_text("b\n")
    assert events.changed()
    assert not events.changed()  # drained


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (r / "src" / "new.txt").write_text("x"),
        lambda r: (r / "src" / "deep" / "a.txt").unlink(),
        lambda r: (r / "src" / "deep" / "a.txt").rename(r / "src" / "b.txt"),
        lambda r: os.chmod(r / "src" / "deep" / "a.txt", 0o755),
        lambda r: os.truncate(r / "src" / "deep" / "a.txt", 0),
        lambda r: (r / "src" / "link").symlink_to("/etc/passwd"),
        lambda r: os.mkfifo(r / "src" / "pipe"),
        lambda r: shutil.rmtree(r / "src" / "deep"),
    ],
    ids=["create", "unlink", "rename", "chmod", "truncate", "symlink", "fifo", "rmtree"],
)
def test_every_kind_of_change_raises_an_event(tree, change):
    root, events = tree
    change(root)
    assert events.changed()


def test_a_file_in_a_directory_made_since_is_seen(tree):
    root, events = tree
    (root / "src" / "x" / "y").mkdir(parents=True)
    assert events.changed()  # the new directories are watched from here on
    (root / "src" / "x" / "y" / "late.txt").write_text("late")
    assert events.changed()


def test_a_moved_directory_is_still_watched_under_its_new_name(tree):
    root, events = tree
    (root / "src" / "deep").rename(root / "moved")
    assert events.changed()
    (root / "moved" / "new").mkdir()  # its watch must know the new path to watch this one
    assert events.changed()
    (root / "moved" / "new" / "f.txt").write_text("f")
    assert events.changed()


def test_dot_git_raises_nothing(tree):
    root, events = tree
    (root / ".git" / "index").write_bytes(b"DIRC")
    assert not events.changed()


def test_after_an_overflow_a_directory_whose_event_was_lost_is_watched(tree):
    root, events = tree
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    burst = root / "src" / "burst"
    burst.mkdir()
    assert events.changed()  # watched from here on
    for i in range(limit // 2 + 10):  # two events a file (create, close_write): the queue overflows
        (burst / str(i)).touch()
    (root / "src" / "lost").mkdir()  # its event did not fit
    assert events.changed()
    (root / "src" / "lost" / "f.txt").write_text("f")
    assert events.changed()


def test_inside_an_ignored_directory_nothing_counts_but_its_parent_still_does(tree):
    root, events = tree
    (root / "out" / "cache").mkdir(parents=True)
    assert events.changed()
    events.ignore(frozenset({"out/"}))
    (root / "out" / "cache" / "blob").write_bytes(b"x" * 100)  # a build's output: not the task's change
    (root / "out" / "new").mkdir()
    assert not events.changed()
    (root / "out2").mkdir()  # a new entry beside it: counted
    assert events.changed()


def write_through_an_ignored_hard_link(root, events) -> None:
    """Link tracked src/deep/a.txt as out/a.txt, ignore out/, and append through the ignored name."""
    (root / "out").mkdir()
    os.link(root / "src" / "deep" / "a.txt", root / "out" / "a.txt")
    events.changed()
    events.ignore(frozenset({"out/"}))
    with open(root / "out" / "a.txt", "a") as other_name:
        other_name.write("appended through the ignored name\n")


def test_a_tracked_file_written_through_a_hard_link_in_an_ignored_directory_counts(tree):
    root, events = tree
    write_through_an_ignored_hard_link(root, events)
    assert events.changed()


def test_a_write_through_a_hard_link_whose_name_is_then_replaced_still_counts(tree):
    """The link count is read after the write: an agent that writes through the link, then unlinks it (and
    leaves a fresh file of one link under the same name) must not hide the write to the tracked file."""
    root, events = tree
    write_through_an_ignored_hard_link(root, events)
    (root / "out" / "a.txt").unlink()
    (root / "out" / "a.txt").write_text("a fresh file, one link\n")
    assert events.changed()
    with open(root / "out" / "b.txt", "w") as plain:  # a build's own output, linked nowhere: still nothing
        plain.write("built\n")
    assert not events.changed()


def test_directories_made_and_removed_inside_an_ignored_directory_give_their_watches_back(tmp_path):
    """A build that makes and removes directories in `out/` all day must not use up the watches (past them,
    every measure would read git)."""
    (tmp_path / "out").mkdir()
    events = WorktreeEvents(tmp_path, max_watches=4)  # the root, out/ and room for two more
    try:
        for round_ in range(10):
            (tmp_path / "out" / f"obj{round_}").mkdir()
            events.ignore(frozenset())  # un-ignored (a .gitignore edit): walked again, obj watched
            events.ignore(frozenset({"out/"}))
            events.changed()
            (tmp_path / "out" / f"obj{round_}").rmdir()
            assert not events.changed()  # inside out/: nothing counts, but the watch is given back
        assert not events.blind
    finally:
        events.close()


def test_a_directory_ignored_no_more_is_watched_whole_again(tree):
    root, events = tree
    (root / "out").mkdir()
    events.changed()
    events.ignore(frozenset({"out/"}))
    (root / "out" / "made_while_ignored").mkdir()
    assert not events.changed()
    events.ignore(frozenset())  # a .gitignore edit un-ignored it
    (root / "out" / "made_while_ignored" / "f.txt").write_text("f")
    assert events.changed()


def test_more_directories_than_it_may_watch_make_it_say_changed_every_time(tmp_path):
    for name in "abcde":
        (tmp_path / name).mkdir()
    events = WorktreeEvents(tmp_path, max_watches=3)
    try:
        assert events.blind
        assert events.changed() and events.changed()
    finally:
        events.close()


def test_a_shared_mapping_raises_its_event_only_when_the_mapping_goes(tree):
    """The limit the module states, measured: the task boundary's full git read is what sees such a write."""
    root, events = tree
    path = root / "src" / "deep" / "a.txt"
    path.write_bytes(b"a" * 4096)
    events.changed()
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, 4096)
    os.close(fd)
    mapping[:5] = b"hello"
    mapping.flush()
    assert not events.changed()
    mapping.close()
    assert events.changed()


# --- the change meter with the queue ---------------------------------------------------------------


@pytest.fixture
def metered(tmp_path):
    ws = make_workspace(tmp_path / "ws", files={"src/old.txt": "a\nb\n"}, ignore=["build/"])
    meter = ChangeMeter(ws.path, ws.path / ".git", WorktreeEvents(ws.path))
    yield ws, meter
    meter.close()


def clean_boundary(ws, meter):
    """The task boundary's read, as the run makes it: the queue drained first, the tree found clean."""
    meter.before_boundary_read()
    meter.boundary(clean=True, ignored=frozenset(), head=pygit2.Repository(str(ws.path / ".git")).head.target)


def test_a_measure_with_no_event_reads_no_git_and_one_after_a_silent_write_does(metered):
    ws, meter = metered
    meter.start()
    assert meter.measure() == ChangeCount(0, 0)
    reads = meter.git_reads
    assert meter.measure() == ChangeCount(0, 0) and meter.git_reads == reads  # nothing happened: the queue said so
    (ws.path / "src" / "old.txt").write_text("a\nB\nc\n")  # no announcement, no kernel call
    assert meter.measure() == ChangeCount(1, 3) and meter.git_reads == reads + 1
    assert meter.measure() == meter.diff_now()


def test_a_clean_boundary_read_starts_the_task_without_a_git_read_and_misses_nothing_after_it(metered):
    ws, meter = metered
    clean_boundary(ws, meter)
    (ws.path / "src" / "between.txt").write_text("1\n2\n")  # after the boundary read, before the task
    meter.start()
    assert meter.git_reads == 0
    assert meter.measure() == ChangeCount(1, 2)


def test_head_moved_with_no_worktree_event_is_measured(metered):
    ws, meter = metered
    meter.start()
    assert meter.measure() == ChangeCount(0, 0)
    other = ws.git("commit-tree", "-p", "HEAD", "-m", "elsewhere", ws.git("write-tree").strip()).strip()
    reads = meter.git_reads
    ws.git("update-ref", "HEAD", other)  # .git only: no worktree event
    meter.measure()
    assert meter.git_reads == reads + 1


def test_a_meter_with_the_queue_counts_what_one_without_it_counts(metered):
    ws, meter = metered
    plain = ChangeMeter(ws.path, ws.path / ".git")
    meter.start()
    plain.start()
    steps = [
        lambda: (ws.path / "src" / "old.txt").write_text("a\n"),
        lambda: (ws.path / "src" / "n" / "m").mkdir(parents=True),
        lambda: (ws.path / "src" / "n" / "m" / "f.txt").write_text("1\n2\n3\n"),
        lambda: (ws.path / "build").mkdir(),
        lambda: (ws.path / "build" / "o").write_text("x" * 1000),
        lambda: (ws.path / "src" / "n").rename(ws.path / "src" / "k"),
        lambda: (ws.path / "src" / "k" / "m" / "f.txt").write_bytes(b"\0bin"),
        lambda: (ws.path / "README.md").unlink(),
    ]
    for step in steps:
        step()
        assert meter.measure() == plain.measure()
        assert meter.measure() == plain.measure()  # the second from the queue


def test_a_commit_between_the_boundary_read_and_the_task_start_counts_against_the_task(metered):
    ws, meter = metered
    clean_boundary(ws, meter)
    ws.commit("slipped in", {"src/slipped.py": "a\nb\nc\n"})
    meter.start()
    assert meter.measure() == ChangeCount(1, 3)


def test_a_directory_made_inside_an_ignored_one_is_watched_for_a_hard_link_written_there(tree):
    """A build directory made after the last look (out/d) is watched too: a tracked file linked into it and
    written through that name counts, as it would directly beneath out/."""
    root, events = tree
    (root / "out").mkdir()
    events.changed()
    events.ignore(frozenset({"out/"}))
    (root / "out" / "d").mkdir()
    os.link(root / "src" / "deep" / "a.txt", root / "out" / "d" / "alias")
    events.changed()  # the link was made: out/d is watched from here
    with open(root / "out" / "d" / "alias", "a") as other_name:
        other_name.write("appended\n")
    assert events.changed()
    (root / "out" / "d" / "plain").write_text("a build's output\n")
    assert not events.changed()  # but a build's own writes there still say nothing


def test_a_dot_git_directory_below_the_root_is_watched(tree):
    """Only the repository's own `.git` is left to RepositoryEvents: a `src/.git` (a nested repository, or a
    directory made to hide in) is watched like any other, a tracked file's hard link in it too."""
    root, events = tree
    hide = root / "src" / "tmpd"
    hide.mkdir()
    os.link(root / "src" / "deep" / "a.txt", hide / "alias")
    hide.rename(root / "src" / ".git")
    assert events.changed()
    with open(root / "src" / ".git" / "alias", "a") as other_name:
        other_name.write("appended\n")
    assert events.changed()
