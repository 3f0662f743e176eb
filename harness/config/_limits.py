"""`autonomy:` — workload budgets, stall detection and question auto-answer, resolved per key (docs/budgets.md).

Each value comes from the first of: the environment (`LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT=50`,
read by pydantic-settings), the config file, the profile the file or environment names, the shipped
default. `resolve_autonomy` keeps the source of every key, for `loop-harness limits` and the run's first
transcript record, and a budget stop names the source of the limit it hit.

Budgets count per task: a task is what a person would otherwise have prompted by hand, so each task
starts with fresh accounting (as a new prompt does in an interactive session).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from ._exceptions import ConfigError

__all__ = [
    "ENV_PREFIX",
    "PROFILES",
    "AutonomyConfig",
    "ResolvedAutonomy",
    "resolve_autonomy",
]

ENV_PREFIX = "LOOP_HARNESS_AUTONOMY__"
Profile = Literal["default", "long", "strict"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Rate(_Strict):
    count: int = Field(ge=1)  # tool calls allowed ...
    window_seconds: float = Field(gt=0)  # ... in any window this long


class ModelTurns(_Strict):
    per_segment: int = Field(ge=1)  # prompt rounds before the kernel starts a new segment
    total: int = Field(ge=1)  # prompt rounds in the task, across segments
    continuations: int = Field(ge=0)  # new segments the kernel may start on its own


class ToolCalls(_Strict):
    per_segment: int = Field(ge=1)  # tool calls the agent announces in one segment
    rate: Rate | None  # null: no rate cap
    per_tool: dict[str, int] = Field(default_factory=dict)  # an ACP tool kind (execute, edit, ...) or a title

    def model_post_init(self, _: Any) -> None:
        for key, cap in self.per_tool.items():
            if cap < 0 or not key.strip():
                raise ValueError(f"per_tool.{key}: a cap is a count of 0 or more, keyed by a tool kind or title")


class Changes(_Strict):
    files_total: int = Field(ge=1)  # files changed since the task started
    lines_total: int = Field(ge=1)  # lines changed since the task started


class Budget(_Strict):
    model_turns: ModelTurns
    tool_calls: ToolCalls
    changes: Changes


class Stall(_Strict):
    tool_only_turns: int = Field(ge=1)  # turns in a row that called tools and said nothing: stop
    tool_only_nudge: int = Field(ge=1)  # ... after this many, one nudge to report
    failed_mutation_attempts: int = Field(ge=1)  # edit/delete/move calls that failed, in the task
    max_consecutive_errors: int = Field(ge=1)  # tool calls in a row that failed
    repeated_cycles: int = Field(ge=2)  # the same 1-4 tool calls (name and arguments) this many times in a row


class Questions(_Strict):
    auto_answer: bool  # answer an agent's question by the answer heuristic; false: BlockedAwaitingInput


class AutonomyConfig(_Strict):
    profile: Profile
    budget: Budget
    stall: Stall
    questions: Questions


#: The shipped defaults (profile `default`). The keys and profiles tables in docs/budgets.md are this mapping.
DEFAULTS: dict[str, Any] = {
    "profile": "default",
    "budget": {
        "model_turns": {"per_segment": 10, "total": 20, "continuations": 1},
        "tool_calls": {"per_segment": 200, "rate": {"count": 60, "window_seconds": 10}, "per_tool": {}},
        "changes": {"files_total": 50, "lines_total": 5000},
    },
    "stall": {
        "tool_only_turns": 8,
        "tool_only_nudge": 4,
        "failed_mutation_attempts": 10,
        "max_consecutive_errors": 5,
        "repeated_cycles": 4,
    },
    "questions": {"auto_answer": True},
}

#: What a profile seeds over the defaults; fields the file or environment set still win.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "long": {
        "budget": {
            "model_turns": {"per_segment": 50, "total": 500, "continuations": 9},
            "tool_calls": {"per_segment": 1000, "rate": {"count": 40, "window_seconds": 10}},
            "changes": {"files_total": 100, "lines_total": 10000},
        },
        "stall": {
            "tool_only_turns": 50,
            "tool_only_nudge": 20,
            "failed_mutation_attempts": 30,
            "max_consecutive_errors": 3,
        },
    },
    "strict": {
        "budget": {
            "model_turns": {"per_segment": 5, "total": 10, "continuations": 1},
            "tool_calls": {"per_segment": 50, "rate": {"count": 20, "window_seconds": 10}},
            "changes": {"files_total": 10, "lines_total": 500},
        },
        "stall": {
            "tool_only_turns": 4,
            "tool_only_nudge": 2,
            "failed_mutation_attempts": 3,
            "max_consecutive_errors": 3,
            "repeated_cycles": 3,
        },
    },
}


class _FromEnvironment(BaseSettings):
    """Only the names pydantic-settings reads: values are validated with the rest, after merging."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False)
    profile: Any = None
    budget: dict[str, Any] | None = None
    stall: dict[str, Any] | None = None
    questions: dict[str, Any] | None = None


@dataclass(frozen=True)
class ResolvedAutonomy:
    """The limits a run uses, where each came from, and what looks wrong about them."""

    config: AutonomyConfig
    sources: Mapping[str, str]  # "budget.tool_calls.per_segment" -> "default" | "profile long" | "file" | "env NAME"
    warnings: tuple[str, ...]

    def source(self, key: str) -> str:
        """The source of `key`, or of the nearest mapping above it that was set whole (`rate: null`)."""
        while key not in self.sources and "." in key:
            key = key.rsplit(".", 1)[0]
        return self.sources.get(key, "default")

    def rows(self) -> Iterator[tuple[str, Any, str]]:
        """(key, value, source) for every leaf, in the config's order."""
        for key, value in _leaves(self.config.model_dump()):
            yield key, value, self.source(key)


def resolve_autonomy(written: Any, *, max_iterations: int = 20, turn_timeout_s: float = 120.0) -> ResolvedAutonomy:
    """Merge default < profile < file < environment (`os.environ`) per key; a bad value is a ConfigError
    naming its key (and the environment variable, when it came from one)."""
    if written is None:
        written = {}
    if not isinstance(written, dict):
        raise ConfigError("autonomy", f"a mapping (got {type(written).__name__})")
    from_env, env_names = _environment()
    profile = from_env.get("profile", written.get("profile", "default"))
    if not isinstance(profile, str) or profile not in PROFILES:
        key_source = env_names.get("profile", "")
        raise ConfigError("autonomy.profile", f"{profile!r} is not a profile ({', '.join(PROFILES)}) {key_source}")
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    layers = [("default", DEFAULTS), (f"profile {profile}", PROFILES[profile]), ("file", written), ("env", from_env)]
    for name, layer in layers:
        _merge(merged, sources, layer, name, env_names, prefix="")
    try:
        config = AutonomyConfig.model_validate(merged)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        where = sources.get(key, "")
        message = error["msg"] + (f" (from {where})" if where.startswith("env") else "")
        raise ConfigError(f"autonomy.{key}", message) from None
    return ResolvedAutonomy(config, sources, tuple(_warnings(config, max_iterations, turn_timeout_s)))


def _environment() -> tuple[dict[str, Any], dict[str, str]]:
    """The `autonomy` keys the environment sets (nested by `__`), and each key's variable name."""
    names: dict[str, str] = {}
    for name in os.environ:
        if not name.upper().startswith(ENV_PREFIX):
            continue
        key = ".".join(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if key.split(".")[0] not in _FromEnvironment.model_fields:
            raise ConfigError(f"autonomy.{key}", f"{name} names no autonomy key ({', '.join(DEFAULTS)})")
        names[key] = name
    if not names:
        return {}, {}
    values = EnvSettingsSource(_FromEnvironment, case_sensitive=False)()
    values = {k: v for k, v in values.items() if v is not None}
    return _parse_nulls(values), names


def _parse_nulls(value: Any) -> Any:
    """`null`/`none` in the environment switches a cap off, as `null` in the file does."""
    if isinstance(value, dict):
        return {k: _parse_nulls(v) for k, v in value.items()}
    if isinstance(value, str) and value.strip().lower() in ("null", "none"):
        return None
    return value


def _merge(
    into: dict[str, Any], sources: dict[str, str], layer: Mapping[str, Any], name: str,
    env_names: Mapping[str, str], *, prefix: str,
) -> None:  # fmt: skip
    for key, value in layer.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], sources, value, name, env_names, prefix=f"{path}.")
            continue
        into[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value  # layers stay as they are
        for known in [k for k in sources if k.startswith(f"{path}.")]:
            del sources[known]  # set whole here: what was beneath it is this layer's now
        for leaf, _ in _leaves(value, prefix=path) if isinstance(value, Mapping) and value else [(path, value)]:
            sources[leaf] = f"env {env_names.get(leaf, '')}".strip() if name == "env" else name


def _leaves(value: Any, *, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, inner in value.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(inner, dict) and inner and key != "per_tool":
            yield from _leaves(inner, prefix=path)
        elif isinstance(inner, dict) and inner:
            yield from ((f"{path}.{k}", v) for k, v in inner.items())
        else:
            yield path, inner


def _warnings(config: AutonomyConfig, max_iterations: int, turn_timeout_s: float) -> Iterator[str]:
    """Caps that can never be reached, because another stops the task first."""
    turns, calls, stall = config.budget.model_turns, config.budget.tool_calls, config.stall
    if turns.per_segment > turns.total:
        yield (f"budget.model_turns.per_segment ({turns.per_segment}) is above budget.model_turns.total "
               f"({turns.total}): a segment never ends before the total")  # fmt: skip
    reachable = turns.per_segment * (turns.continuations + 1)
    if reachable < turns.total:
        yield (f"budget.model_turns.total ({turns.total}) is never reached: {turns.continuations + 1} segment(s) "
               f"of {turns.per_segment} end the task at {reachable}")  # fmt: skip
    if max_iterations < min(turns.per_segment, turns.total):
        yield (f"limits.max_iterations ({max_iterations}) stops a task before budget.model_turns.per_segment "
               f"({turns.per_segment})")  # fmt: skip
    for tool, cap in calls.per_tool.items():
        if cap > calls.per_segment:
            yield (f"budget.tool_calls.per_tool.{tool} ({cap}) is above budget.tool_calls.per_segment "
                   f"({calls.per_segment})")  # fmt: skip
    if calls.rate is not None:
        fits = calls.rate.count * math.ceil(turn_timeout_s / calls.rate.window_seconds)
        if fits < calls.per_segment:
            yield (f"limits.turn_timeout_s ({turn_timeout_s:g}) ends a turn before budget.tool_calls.per_segment "
                   f"({calls.per_segment}): at the rate cap ({calls.rate.count} per {calls.rate.window_seconds:g} s) "
                   f"at most {fits} calls fit in one turn")  # fmt: skip
    if stall.tool_only_nudge >= stall.tool_only_turns:
        yield (f"stall.tool_only_nudge ({stall.tool_only_nudge}) is not below stall.tool_only_turns "
               f"({stall.tool_only_turns}): the nudge is never sent")  # fmt: skip
    if stall.tool_only_turns > turns.total:
        yield f"stall.tool_only_turns ({stall.tool_only_turns}) is above budget.model_turns.total ({turns.total})"
