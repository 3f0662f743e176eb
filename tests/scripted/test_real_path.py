"""`real_path` (how the policy resolves every path an agent names) agrees with `os.path.realpath` on every
spelling an attacker would try: links in the middle and at the end, `..` after a link, loops, names not
there yet, a fifo (which must not block), a file unlinked while open, /proc's magic links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness._paths import real_path
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="tree")
def tree_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "a.txt").write_text("a")
    (root / "outside").mkdir()
    (root / "outside" / "secret").write_text("s")
    (root / "src" / "up").symlink_to("..")  # a link back up
    (root / "src" / "out").symlink_to(root / "outside")  # a link out, absolute
    (root / "src" / "rel").symlink_to("deep/../../outside/secret")  # `..` after a real directory, in a link
    (root / "src" / "dangling").symlink_to("nowhere/at/all")
    (root / "src" / "loop1").symlink_to("loop2")
    (root / "src" / "loop2").symlink_to("loop1")
    (root / "src" / "via").symlink_to("deep")
    os.mkfifo(root / "src" / "fifo")
    (root / "src" / "x (deleted)").write_text("named like the link of an unlinked file")
    (root / "src" / "to-deleted").symlink_to("x (deleted)")
    (root / "src" / "new\nline").write_text("a newline in the name")
    return root


SPELLINGS = [
    "src/a.txt", "src/", "src/.", "src/deep/..", "src/via/..", "src/via/../a.txt", "src/up/src/a.txt",
    "src/up/up/up", "src/out/secret", "src/out/../src", "src/rel", "src/dangling", "src/dangling/x",
    "src/loop1", "src/loop1/x", "src/new-file", "src/new-dir/new-file", "src/a.txt/..", "src/a.txt/x",
    "src//deep///", "src/fifo", "src/fifo/..", "src/x (deleted)", "src/to-deleted", "src/new\nline",
]  # fmt: skip


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_agrees_with_realpath(tree: Path, spelling: str) -> None:
    path = f"{tree}/{spelling}"
    assert real_path(path) == os.path.realpath(path)


def test_proc_links_resolve_where_realpath_sends_them(tree: Path) -> None:
    for path in ("/proc/self/cwd", "/proc/self/root/etc", f"/proc/self/root{tree}/src/out/secret", "/proc/self/fd/0"):
        assert real_path(path) == os.path.realpath(path)


def test_a_file_unlinked_while_open_is_not_named_deleted(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The descriptor of a file unlinked between the open and the read of its link reads `... (deleted)`:
    that is never an answer."""
    victim = tree / "src" / "gone.txt"
    victim.write_text("x")
    opened = os.open

    def open_then_unlink(path: str, flags: int, *args: int, **kwargs: int) -> int:
        fd = opened(path, flags, *args, **kwargs)
        if path == str(victim):
            victim.unlink()
        return fd

    monkeypatch.setattr(os, "open", open_then_unlink)
    assert real_path(str(victim)) == str(victim)
