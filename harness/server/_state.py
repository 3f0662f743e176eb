"""The server's state in SQLite (WAL): the autonomy switch and the registered workspaces.

Everything a restart must keep lives here, written in one transaction per change, so a server killed at any
moment comes back to the last change it acknowledged. The bearer token is a file beside the database (0600),
made on first start unless `LOOP_HARNESS_SERVER_TOKEN` gives one.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

__all__ = ["TOKEN_VARIABLE", "State", "StateError", "Workspace"]

TOKEN_VARIABLE = "LOOP_HARNESS_SERVER_TOKEN"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    queue TEXT,            -- the host connection, as a run config's queue: section (JSON); NULL: none
    policy TEXT NOT NULL,  -- the policy: section (JSON)
    created REAL NOT NULL,
    binding TEXT,          -- the bound agent module's request (JSON); NULL: unbound
    active INTEGER NOT NULL DEFAULT 0,  -- activated: a loop drains its queue (or did, when the server died)
    sandbox TEXT           -- the sandbox: section (JSON); NULL: the run default (workspace-write)
);
CREATE TABLE IF NOT EXISTS runs (  -- the session history, keyed by workspace
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL REFERENCES workspaces(id),
    module TEXT NOT NULL,
    transcript TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL,            -- NULL while it runs (or when the server died under it)
    terminal TEXT,
    reason TEXT,           -- JSON
    tasks TEXT             -- JSON: each task's id, terminal and reason
);
"""


class StateError(Exception):
    """A change the state refuses: `kind` is the typed reason an API answer carries."""

    def __init__(self, kind: str, message: str, status: int = 409, **detail: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Workspace:
    id: str
    path: str
    queue: dict[str, Any] | None
    policy: dict[str, Any]
    created: float
    binding: dict[str, Any] | None = None
    active: bool = False
    sandbox: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "host": self.queue, "policy": self.policy,
                "has_host_connection": self.queue is not None, "binding": self.binding,
                "active": self.active, "sandbox": self.sandbox}  # fmt: skip


class State:
    def __init__(self, directory: Path, connection: sqlite3.Connection, token: str) -> None:
        self.directory = directory
        self.token = token
        self._db = connection
        self._server_lock: FileLock | None = None
        self._lock = threading.Lock()  # one writer at a time inside this process; SQLite serialises processes

    @classmethod
    def open(cls, directory: Path) -> State:
        """Open (or make) the state directory, owner-only, for this server alone: a second server on the same
        directory would end the first one's loops as restarted, so it is refused (StateError)."""
        directory = directory.expanduser().resolve()  # agents' configs name it: hide takes absolute paths
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # the database holds bindings' env (API keys) and the token sits beside it
        lock = FileLock(directory / "server.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise StateError("state_in_use", f"another server uses {directory}: give each server its own --state",
                             status=409) from None  # fmt: skip
        connection = sqlite3.connect(directory / "state.db", check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # an acknowledged change survives a power cut
        connection.executescript(_SCHEMA)
        state = cls(directory, connection, _token(directory))
        state._server_lock = lock
        return state

    def close(self) -> None:
        self._db.close()
        if self._server_lock is not None:
            self._server_lock.release()

    # --- the autonomy switch -------------------------------------------------------------------

    @property
    def autonomy_enabled(self) -> bool:
        row = self._db.execute("SELECT value FROM settings WHERE key = 'autonomy'").fetchone()
        return bool(row and json.loads(row[0]))

    def set_autonomy(self, enabled: bool) -> None:
        """Seed 000: enabling needs a host connection on at least one workspace (a typed 409 otherwise)."""
        with self._lock:
            if enabled and not any(w.queue is not None for w in self.workspaces()):
                raise StateError("no_host_connection", "autonomy needs a host connection on at least one workspace: "
                                 "register one with a queue (memory or github) first")  # fmt: skip
            self._db.execute("INSERT INTO settings VALUES ('autonomy', ?) ON CONFLICT(key) DO UPDATE SET "
                             "value = excluded.value", (json.dumps(enabled),))  # fmt: skip

    # --- workspaces ----------------------------------------------------------------------------

    def add_workspace(
        self, path: str, queue: dict[str, Any] | None, policy: dict[str, Any], sandbox: dict[str, Any] | None = None
    ) -> Workspace:
        workspace = Workspace(uuid.uuid4().hex[:12], path, queue, policy, time.time(), sandbox=sandbox)
        with self._lock:
            try:
                self._db.execute("INSERT INTO workspaces (id, path, queue, policy, created, sandbox) VALUES "
                                 "(?, ?, ?, ?, ?, ?)", (workspace.id, path, _json(queue), json.dumps(policy),
                                                        workspace.created, _json(sandbox)))  # fmt: skip
            except sqlite3.IntegrityError:
                existing = self._db.execute("SELECT id FROM workspaces WHERE path = ?", (path,)).fetchone()
                raise StateError("workspace_exists", f"{path} is already registered as {existing[0]}",
                                 workspace=existing[0]) from None  # fmt: skip
        return workspace

    def workspaces(self) -> list[Workspace]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM workspaces ORDER BY created, id")
        return [_workspace(row) for row in rows.fetchall()]

    def workspace(self, workspace_id: str) -> Workspace:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM workspaces WHERE id = ?", (workspace_id,)).fetchone()
        if row is None:
            raise StateError("no_such_workspace", f"no workspace {workspace_id!r}", status=404)
        return _workspace(row)

    def set_binding(self, workspace_id: str, binding: dict[str, Any] | None) -> None:
        self.workspace(workspace_id)
        self._db.execute("UPDATE workspaces SET binding = ? WHERE id = ?", (_json(binding), workspace_id))

    def set_active(self, workspace_id: str, active: bool) -> None:
        self._db.execute("UPDATE workspaces SET active = ? WHERE id = ?", (int(active), workspace_id))

    # --- the session history -------------------------------------------------------------------

    def begin_run(self, run_id: str, workspace_id: str, module: str, transcript: str) -> None:
        self._db.execute("INSERT INTO runs (id, workspace, module, transcript, started) VALUES (?, ?, ?, ?, ?)",
                         (run_id, workspace_id, module, transcript, time.time()))  # fmt: skip

    def end_run(self, run_id: str, terminal: str, reason: dict[str, Any], tasks: list[dict[str, Any]]) -> None:
        self._db.execute("UPDATE runs SET ended = ?, terminal = ?, reason = ?, tasks = ? WHERE id = ?",
                         (time.time(), terminal, json.dumps(reason), json.dumps(tasks), run_id))  # fmt: skip

    def runs(self, workspace_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT id, module, transcript, started, ended, terminal, reason, tasks FROM runs "
                                "WHERE workspace = ? ORDER BY started, id", (workspace_id,)).fetchall()  # fmt: skip
        keys = ("id", "module", "transcript", "started", "ended", "terminal", "reason", "tasks")
        return [{k: json.loads(v) if k in ("reason", "tasks") and v is not None else v for k, v in zip(keys, row,
                 strict=True)} for row in rows]  # fmt: skip

    def restarted(self) -> list[str]:
        """At start: every loop persisted active, and every session not ended (a prompt session too), ended
        `Failed {kind: restarted}`, its workspace inactive; the workspaces whose loop that was (their leftover
        agents are the caller's to end)."""
        with self._lock:
            active = [row[0] for row in self._db.execute("SELECT id FROM workspaces WHERE active = 1 UNION "
                                                         "SELECT workspace FROM runs WHERE ended IS NULL")]  # fmt: skip
            self._db.execute("UPDATE runs SET ended = ?, terminal = 'Failed', reason = ? WHERE ended IS NULL",
                             (time.time(), json.dumps({"kind": "restarted"})))  # fmt: skip
            self._db.execute("UPDATE workspaces SET active = 0 WHERE active = 1")
        return active


_COLUMNS = "id, path, queue, policy, created, binding, active, sandbox"


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _workspace(row: tuple[Any, ...]) -> Workspace:
    queue, binding, sandbox = (None if value is None else json.loads(value) for value in (row[2], row[5], row[7]))
    return Workspace(row[0], row[1], queue, json.loads(row[3]), row[4], binding, bool(row[6]), sandbox)


def _token(directory: Path) -> str:
    """The bearer token: the environment's, else the state directory's (made on first start, owner-only)."""
    given = os.environ.pop(TOKEN_VARIABLE, None)  # read once: nothing this process starts inherits it
    if given:
        return given
    path = directory / "token"
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise StateError("token_unsafe", f"{path} must be the server user's own, mode 0600 (it is "
                             f"{oct(info.st_mode & 0o777)}, owner {info.st_uid})")  # fmt: skip
        token = path.read_text().strip()
        if not token:
            raise StateError("token_unsafe", f"{path} is empty: delete it to have a new one made")
        return token
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
