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

__all__ = ["TOKEN_VARIABLE", "State", "StateError", "Workspace"]

TOKEN_VARIABLE = "LOOP_HARNESS_SERVER_TOKEN"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    queue TEXT,            -- the host connection, as a run config's queue: section (JSON); NULL: none
    policy TEXT NOT NULL,  -- the policy: section (JSON)
    created REAL NOT NULL
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

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "host": self.queue, "policy": self.policy,
                "has_host_connection": self.queue is not None}  # fmt: skip


class State:
    def __init__(self, directory: Path, connection: sqlite3.Connection, token: str) -> None:
        self.directory = directory
        self.token = token
        self._db = connection
        self._lock = threading.Lock()  # one writer at a time inside this process; SQLite serialises processes

    @classmethod
    def open(cls, directory: Path) -> State:
        directory.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(directory / "state.db", check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # an acknowledged change survives a power cut
        connection.executescript(_SCHEMA)
        return cls(directory, connection, _token(directory))

    def close(self) -> None:
        self._db.close()

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

    def add_workspace(self, path: str, queue: dict[str, Any] | None, policy: dict[str, Any]) -> Workspace:
        workspace = Workspace(uuid.uuid4().hex[:12], path, queue, policy, time.time())
        with self._lock:
            try:
                self._db.execute("INSERT INTO workspaces VALUES (?, ?, ?, ?, ?)", (
                    workspace.id, path, None if queue is None else json.dumps(queue), json.dumps(policy),
                    workspace.created))  # fmt: skip
            except sqlite3.IntegrityError:
                existing = self._db.execute("SELECT id FROM workspaces WHERE path = ?", (path,)).fetchone()
                raise StateError("workspace_exists", f"{path} is already registered as {existing[0]}",
                                 workspace=existing[0]) from None  # fmt: skip
        return workspace

    def workspaces(self) -> list[Workspace]:
        rows = self._db.execute("SELECT id, path, queue, policy, created FROM workspaces ORDER BY created, id")
        return [_workspace(row) for row in rows.fetchall()]

    def workspace(self, workspace_id: str) -> Workspace:
        row = self._db.execute("SELECT id, path, queue, policy, created FROM workspaces WHERE id = ?",
                               (workspace_id,)).fetchone()  # fmt: skip
        if row is None:
            raise StateError("no_such_workspace", f"no workspace {workspace_id!r}", status=404)
        return _workspace(row)


def _workspace(row: tuple[Any, ...]) -> Workspace:
    return Workspace(row[0], row[1], None if row[2] is None else json.loads(row[2]), json.loads(row[3]), row[4])


def _token(directory: Path) -> str:
    """The bearer token: the environment's, else the state directory's (made on first start, owner-only)."""
    given = os.environ.get(TOKEN_VARIABLE)
    if given:
        return given
    path = directory / "token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
