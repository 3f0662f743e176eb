"""Building blocks for tests, benchmarks and demos, usable with or without pytest.

ws = make_workspace(tmp_path)                       # a git worktree pushed to a bare origin
scenario = write_yaml(tmp_path / "s.yaml", {...})    # a scripted agent scenario
config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, scenario, tasks=[...]))
config = write_yaml(tmp_path / "mine.yaml", loop_config(ws, agent=["python", "my_agent.py"]))  # any ACP agent
result = run_loop(config)                           # RunResult: terminal, reason, tasks, transcript

with LlamaCppServer(model_path, log=tmp_path / "server.log") as endpoint:   # an OpenAI-compatible server
    command = inference_agent_command(endpoint=endpoint)                       # the inference agent on it
with serve_endpoint("llama-cpp-server", log=tmp_path / "server.log") as endpoint:  # or a URL: the user's
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .config._config import load_config
from .kernel._kernel import Kernel
from .record._records import RecordType, transcript_schema
from .record._results import RunResult
from .record._transcript import read_transcript

__all__ = [
    "DEFAULT_RULES",
    "DEMO_TASKS",
    "LLAMA_CPP_SERVER",
    "OUT_RULES",
    "READ_ALL",
    "WRITE_OUT",
    "WRITE_SRC",
    "Endpoint",
    "LlamaCppServer",
    "Workspace",
    "agent_messages",
    "agent_section",
    "assert_transcript_complete",
    "assert_transcript_valid",
    "inference_agent_command",
    "inference_agent_env",
    "loop_config",
    "make_workspace",
    "records",
    "run_loop",
    "scripted_agent_command",
    "serve_endpoint",
    "write_yaml",
]

READ_ALL: dict[str, Any] = {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"}
WRITE_OUT: dict[str, Any] = {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"}
WRITE_SRC: dict[str, Any] = {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"}
#: Read anything, write under out/ (ignored by git, so tasks leave the tree clean): the benches and the soak.
OUT_RULES: list[dict[str, Any]] = [READ_ALL, WRITE_OUT]
#: Tasks the pinned 135M model carries out (it drops the out/ prefix from some other file names).
DEMO_TASKS: list[dict[str, str]] = [
    {"title": "Write a greeting", "body": "Create the file out/hello.txt containing the word hello."},
    {"title": "Write a farewell", "body": "Create the file out/bye.txt containing the word goodbye."},
    {"title": "Say thanks", "body": "Create the file out/thanks.txt containing the word thanks."},
]

DEFAULT_RULES: list[dict[str, Any]] = [
    READ_ALL,
    WRITE_SRC,
    {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"},
    {"id": "no-net", "kind": "network", "hosts": ["*"], "decision": "deny"},
]

# Git must not read the user's global config (signing, hooks, default branch) in tests.
_GIT_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


@dataclass
class Workspace:
    """A git worktree on branch `main` with a bare `origin` it is pushed to."""

    path: Path
    origin: Path

    def git(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, env=_GIT_ENV, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def write(self, relative: str, content: str) -> Path:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return target

    def commit(self, message: str, files: Mapping[str, str] | None = None, *, push: bool = False) -> None:
        for relative, content in (files or {}).items():
            self.write(relative, content)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        if push:
            self.git("push", "-q")

    def pushed_log(self) -> list[str]:
        """Commit subjects on origin/main, newest first."""
        self.git("fetch", "-q")
        return self.git("log", "--format=%s", "origin/main").split("\n")[:-1]


def make_workspace(root: Path, *, files: Mapping[str, str] | None = None, ignore: Sequence[str] = ()) -> Workspace:
    """Create `root/origin.git` (bare) and `root/workspace` (pushed to it, upstream set).

    The first workspace with given files is built with git; later ones are copies of it (a test suite
    makes thousands: a copy is a tenth of the nine git commands), with their own `origin` URL and index."""
    root = root.resolve()
    origin, path = root / "origin.git", root / "workspace"
    template = _template(tuple(sorted((files or {}).items())), tuple(ignore))
    if template is None or origin.exists() or path.exists():
        return _build_workspace(root, files=files, ignore=ignore)
    root.mkdir(parents=True, exist_ok=True)
    # copies get new times (shutil.copy): the index's stat data is then refreshed, as a fresh commit leaves it
    shutil.copytree(template / "origin.git", origin, symlinks=True, copy_function=shutil.copy)
    shutil.copytree(template / "workspace", path, symlinks=True, copy_function=shutil.copy)
    workspace = Workspace(path, origin)
    workspace.git("remote", "set-url", "origin", str(origin))
    workspace.git("update-index", "-q", "--refresh")
    return workspace


_TEMPLATES: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], Path] = {}
_MAX_TEMPLATES = 256  # distinct file sets kept; beyond, workspaces are built with git


def _template(files: tuple[tuple[str, str], ...], ignore: tuple[str, ...]) -> Path | None:
    """The workspace copied for these files (built once per process, removed at exit)."""
    key = (files, ignore)
    if key not in _TEMPLATES:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            return None
        place = Path(tempfile.mkdtemp(prefix="loop-harness-template-"))
        atexit.register(shutil.rmtree, place, ignore_errors=True)
        _build_workspace(place, files=dict(files), ignore=ignore)
        _TEMPLATES[key] = place
    return _TEMPLATES[key]


def _build_workspace(root: Path, *, files: Mapping[str, str] | None, ignore: Sequence[str]) -> Workspace:
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    origin = root / "origin.git"
    path = root / "workspace"
    _git("init", "-q", "--bare", "-b", "main", str(origin))
    _git("init", "-q", "-b", "main", str(path))
    workspace = Workspace(path, origin)
    for key, value in (
        ("user.name", "loop-harness"),
        ("user.email", "loop@harness.invalid"),
        ("commit.gpgsign", "false"),
    ):
        workspace.git("config", key, value)
    contents = {"README.md": "A workspace for loop-harness.\n", **(files or {})}
    if ignore:
        contents[".gitignore"] = "".join(f"{pattern}\n" for pattern in ignore)
    workspace.commit("initial commit", contents)
    workspace.git("remote", "add", "origin", str(origin))
    workspace.git("push", "-q", "-u", "origin", "main")
    return workspace


def scripted_agent_command(scenario: Path) -> list[str]:
    return [sys.executable, "-m", "scripted_agents", str(scenario)]


def inference_agent_command(
    *, seed: int = 42, threads: int = 2, model: str | None = None, endpoint: Endpoint | None = None
) -> list[str]:
    """The inference agent's command line: on the pinned local model (`model`, a models.lock name), or on
    `endpoint` (an OpenAI-compatible server; `model` is then ignored for the endpoint's own)."""
    command = [sys.executable, "-m", "harness", "agent", "inference", "--seed", str(seed), "--threads", str(threads)]
    if endpoint is not None:
        named = ["--model", endpoint.model] if endpoint.model else []
        return [*command, "--endpoint", endpoint.url, *named, *endpoint.agent_args]
    return [*command, "--model", model] if model else command


#: The `--loop-endpoint` keyword that starts llama-cpp-python's own server on the pinned model.
LLAMA_CPP_SERVER = "llama-cpp-server"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server for the inference agent: its base URL (`.../v1`), the model name to ask
    for (None: the one it lists first), more agent options it needs, and its log when we started it."""

    url: str
    model: str | None = None
    agent_args: tuple[str, ...] = ()
    log: Path | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    def network_rule(self) -> dict[str, Any]:
        """The rule the sandbox's proxy needs to let the agent reach the server."""
        return {"id": "model-endpoint", "kind": "network", "hosts": [self.host], "decision": "allow"}


class LlamaCppServer:
    """llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, the `inference` extra's
    `[server]` dependencies) on `model`, on a free loopback port, with the `chatml-function-calling` chat
    format. `start()` waits until `GET /v1/models` answers (the process's death or `startup_timeout` fails it,
    quoting the log); `stop()` terminates it, then kills it. Everything it prints goes to `log`.

    Its chat format cannot stream a tool call the model chose itself (llama-cpp-python 0.3.36 raises "Automatic
    streaming tool choice is not supported" once the reply has begun, and the stream breaks off), so the
    endpoint it returns has the agent ask with `--no-stream` (and wait up to 300 s for a whole answer)."""

    def __init__(
        self,
        model: Path,
        *,
        log: Path,
        threads: int = 2,
        n_ctx: int = 4096,
        seed: int = 42,
        alias: str = "local",
        startup_timeout: float = 120.0,
    ) -> None:
        self.model, self.log, self.threads, self.n_ctx, self.seed = model, log, threads, n_ctx, seed
        self.alias, self.startup_timeout = alias, startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint: Endpoint | None = None
        self.port: int | None = None

    def start(self) -> Endpoint:
        import httpx

        port = self.port = self.port or _free_loopback_port()  # a restart keeps the URL
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", self.alias,
                   "--chat_format", "chatml-function-calling", "--host", "127.0.0.1", "--port", str(port),
                   "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads), "--n_threads_batch",
                   str(self.threads), "--seed", str(self.seed), "--verbose", "False",
                   # its default keeps the logits of every prompt token: a cold prompt took 3x as long
                   "--logits_all", "False"]  # fmt: skip
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_dies_with_us())  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-cpp-python's server exited with status {self.process.returncode} before "
                                   f"it served {url}/models; its log ({self.log}):\n{self.log_tail()}")  # fmt: skip
            try:
                if httpx.get(f"{url}/models", timeout=1.0, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-cpp-python's server did not serve {url}/models within "
                                   f"{self.startup_timeout:g} s; its log ({self.log}):\n{self.log_tail()}")  # fmt: skip
            time.sleep(0.1)
        # a whole answer comes after all its tokens: on a busy CPU that outlasts the agent's default 120 s
        self.endpoint = Endpoint(url, self.alias, ("--no-stream", "--read-timeout", "300"), self.log)
        return self.endpoint

    def restart(self) -> Endpoint:
        """Stop and start again on the same port: an empty prompt cache (what it served before can change
        what greedy decoding picks next, as llama.cpp's own tests note)."""
        self.stop()
        return self.start()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_endpoint(
    spec: str, *, model: str | None = None, agent_args: Sequence[str] = (), log: Path, threads: int = 2
) -> Iterator[Endpoint]:
    """The server `spec` names, as `--endpoint` and `--loop-endpoint` take it, for the block: `llama-cpp-server`
    starts llama-cpp-python's on the pinned model (its log to `log`, `threads` CPU threads) and stops it after;
    a base URL is the user's server, `model` the model to ask it for. `agent_args` are more inference agent
    options (after those the server needs). Raises what `resolve_model` and `LlamaCppServer.start` raise."""
    if spec != LLAMA_CPP_SERVER:
        yield Endpoint(spec.rstrip("/"), model, tuple(agent_args))
        return
    from .models import resolve_model

    with LlamaCppServer(resolve_model(), log=log, threads=threads) as started:
        yield Endpoint(started.url, started.model, (*started.agent_args, *agent_args), started.log)


def _dies_with_us() -> Callable[[], None]:
    """What the server's process runs before exec: SIGKILL to it when the thread that started it dies, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG), so a test session or a bench killed from outside leaves no server
    running in its own session. The libc call is looked up here: only it runs in the forked child."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def inference_agent_env() -> dict[str, str]:
    """What the inference agent needs from our environment (it gets a trimmed one)."""
    keys = ("LOOP_HARNESS_MODEL_CACHE", "LOOP_HARNESS_MODELS_LOCK", "XDG_CACHE_HOME", "HF_HUB_OFFLINE", "HF_ENDPOINT")
    return {k: os.environ[k] for k in keys if k in os.environ}


def write_yaml(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def loop_config(
    workspace: Workspace | Path,
    scenario: Path | None = None,
    *,
    agent: Sequence[str] | Mapping[str, Any] | None = None,
    tasks: Sequence[Mapping[str, Any]] = ({"id": "T1", "title": "Add a greeting"},),
    rules: Sequence[Mapping[str, Any]] = DEFAULT_RULES,
    supports_permission_requests: bool = True,
    queue: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A run config as a dict: the given tasks and rules, and either the scripted agent on `scenario` or
    `agent` (any ACP agent: its command line, or a whole `agent:` section); `commit` turns on the kernel's
    commit after each completed task (`workspace.commit`)."""
    path = workspace.path if isinstance(workspace, Workspace) else workspace
    return {
        "workspace": str(path) if commit is None else {"path": str(path), "commit": dict(commit)},
        "agent": agent_section(scenario, agent, supports_permission_requests),
        "policy": {"rules": [dict(r) for r in rules]},
        "queue": {"provider": "memory", "tasks": [dict(t) for t in tasks], **(queue or {})},
        "limits": {"turn_timeout_s": 20, "cancel_grace_s": 1, **(limits or {})},
        **extra,
    }


def agent_section(
    scenario: Path | None,
    agent: Sequence[str] | Mapping[str, Any] | None = None,
    supports_permission_requests: bool = True,
) -> dict[str, Any]:
    """The config's `agent:` section for the scripted agent on `scenario`, or for `agent` (a command line or
    a section of its own, which is taken as it is)."""
    if (scenario is None) == (agent is None):
        raise TypeError("name exactly one agent: a scripted scenario, or agent=[command...] for any ACP agent")
    if isinstance(agent, Mapping):
        return dict(agent)
    if isinstance(agent, str):  # a str is a sequence of characters: say so rather than run "p" "y" "t"...
        raise TypeError(f"agent= takes the command as a list (shlex.split({agent!r})), not a string")
    command = scripted_agent_command(scenario) if scenario is not None else [str(a) for a in agent or ()]
    return {"command": command, "supports_permission_requests": supports_permission_requests}


def run_loop(
    config: Path,
    *,
    task_id: str | None = None,
    prompt: str | None = None,
    transcript_path: Path | None = None,
    observer: Callable[[dict[str, Any]], None] | None = None,
    setup: Callable[[Kernel], None] | None = None,
    **kernel_kwargs: Any,
) -> RunResult:
    """Load `config`, run the kernel once (blocking), and return its result."""
    kernel = Kernel(load_config(config), transcript_path=transcript_path, observer=observer, **kernel_kwargs)
    if setup is not None:
        setup(kernel)
    return asyncio.run(kernel.run(task_id=task_id, prompt=prompt))


def assert_transcript_complete(result: RunResult) -> list[dict[str, Any]]:
    """The transcript is valid JSONL, every line valid against the shipped schema (JSON-RPC well formed
    throughout), numbered without gaps, and it ends with the run's terminal."""
    records = assert_transcript_valid(result.transcript)
    assert records, f"{result.transcript} is empty"
    assert records[0]["type"] == "run_start", records[0]
    last = records[-1]
    assert last["type"] == "terminal", f"the last record is {last['type']!r}, not the terminal"
    assert last["terminal"] == result.terminal.value and last["reason"] == result.reason
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1)), "records are missing or out of order"
    return records


def assert_transcript_valid(path: Path) -> list[dict[str, Any]]:
    """Every line of the transcript at `path` is a record the shipped JSON Schema accepts; returns them."""
    records = read_transcript(path)
    validator = _schema_validator()
    for record in records:
        errors = sorted(validator.iter_errors(record), key=lambda e: list(e.absolute_path))
        assert not errors, f"{path}: record {record.get('seq')} ({record.get('type')}): {errors[0].message}"
    return records


def agent_messages(transcript: Path | Sequence[Mapping[str, Any]]) -> list[str]:
    """The text of every `agent_message_chunk` the agent sent, in order (a transcript's path, or its records):
    what a hostile test agent printed of its attempts."""
    found = read_transcript(transcript) if isinstance(transcript, Path) else transcript
    return [r["msg"]["params"]["update"]["content"]["text"] for r in found
            if r["type"] == "rpc" and r["msg"].get("method") == "session/update"
            and r["msg"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]  # fmt: skip


def records(result: RunResult | Path, type: RecordType | str, **match: Any) -> list[dict[str, Any]]:
    """The transcript records of `type` whose fields equal every `match` (a run's result, or a path).

    `records(result, "policy", decision="refuse")`, `records(result, RecordType.TURN, prompt_kind="task")`."""
    path = result.transcript if isinstance(result, RunResult) else result
    wanted = RecordType(type)  # a misspelt type is an error, not an empty list
    return [r for r in read_transcript(path) if r["type"] == wanted and all(r.get(k) == v for k, v in match.items())]


@functools.cache
def _schema_validator() -> Any:
    import jsonschema  # only where transcripts are checked

    return jsonschema.Draft202012Validator(transcript_schema())


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, env=_GIT_ENV)
