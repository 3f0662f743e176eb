"""Issue 30's table for the real adapters (test_claude_sandbox.py, test_codex_sandbox.py): the rules, the command
the fake model asks for, and what the run must show, shared by both.

Rows 1-3: a command the policy allows (`tools/write.py`) writes, silently, a path the write rules refuse; the
task ends BlockedPolicy naming it and nothing reaches the tree or a commit. Row 4: `write hello.txt`, the file
not there: with the copy-on-write worktree the command writes it and the kernel commits it; with directory
binds the OS refuses it (Read-only file system) and the run still ends Idle with nothing done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HELLO = "echo hello > hello.txt"
WRITER = "python3 tools/write.py"
#: the first three rows: the write rules beside read-all, and the path the change refusal names
TABLE = {
    "deny-glob": ([{"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"},
                   {"id": "no-keys", "kind": "write", "paths": ["**/*.key"], "decision": "deny"}], "src/new.key"),
    "narrow-glob": ([{"id": "write-py", "kind": "write", "paths": ["src/*.py"], "decision": "allow"}], "src/run.sh"),
    "deny-tree-absent": ([{"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"},
                          {"id": "no-secrets", "kind": "write", "paths": ["src/secrets/**"], "decision": "deny"}],
                         "src/secrets/token.txt"),
}  # fmt: skip


def hello_rules(read_all: dict[str, Any], model_api: dict[str, Any]) -> list[dict[str, Any]]:
    return [read_all, {"id": "hello", "kind": "write", "paths": ["hello.txt"], "decision": "allow"},
            {"id": "echo", "kind": "execute", "commands": ["echo hello"], "decision": "allow"}, model_api]  # fmt: skip


def writer_rules(read_all: dict[str, Any], extra: list[dict[str, Any]], model_api: dict[str, Any]) -> list[dict]:
    return [read_all, *extra, {"id": "writer", "kind": "execute", "commands": [WRITER], "decision": "allow"}, model_api]


def writer_files(refused: str) -> dict[str, str]:
    """tools/write.py, writing `refused` (its directory made first)."""
    return {"tools/write.py": f"import os\nos.makedirs(os.path.dirname({refused!r}), exist_ok=True)\n"
                              f"open({refused!r}, 'w').write('x')\n"}  # fmt: skip


def assert_hello(report: dict, records: list[dict], output: str, tmp_path: Path, worktree: str, why: str) -> None:
    assert report["terminal"] == "Idle", why
    hello = tmp_path / "ws/workspace/hello.txt"
    if worktree == "bind":
        assert "Read-only file system" in output and not hello.exists(), why
        return
    assert hello.read_text() == "hello\n", why
    committed = [r for r in records if r["type"] == "commit"]
    assert committed and committed[0]["committed"] is True, why


def assert_refused(report: dict, records: list[dict], refused: str, tmp_path: Path, why: str) -> None:
    assert report["terminal"] == "BlockedPolicy" and report["reason"]["source"] == "change", why
    assert [p["path"] for p in report["reason"]["paths"]] == [refused], why
    assert not (tmp_path / "ws/workspace" / refused).exists()
    assert not [r for r in records if r["type"] == "commit"]
