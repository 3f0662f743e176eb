"""The pytest plugin (entry point `pytest11`): markers, options and fixtures for loop tests.

Markers, registered with strict markers in mind:
    loop-scripted   fast, deterministic: the kernel against the scripted agent
    loop-slow       scripted cases that take seconds each (end to end): left out of `-m loop-scripted`
    LoopInference   the kernel against the real local model (CPU llama.cpp)
    LoopSoak        hundreds of tasks with bounded resources (slow): deselected unless `-m` selects it
    LoopAgent       your own ACP agent (the command `--loop-agent` or the `loop_agent` ini key names)
    LoopE2E         the control server end to end: a real `loop-harness serve` on loopback
    loop-real       real agents' ACP adapters (Codex, Claude Code) against the fake model APIs (`fake_model/`)
    loop_workspace(files={...}, ignore=[...])   what `harness_workspace` starts with

Options: `--loop-agent COMMAND` (your agent); `--loop-endpoint URL|llama-cpp-server`, `--loop-model NAME` and
`--loop-endpoint-args ARGS` run the inference agent (LoopInference) on an OpenAI-compatible server instead of
its local model: `loop_endpoint` is that server (`llama-cpp-server` starts llama-cpp-python's own on the
pinned model for the session, its log shown beside a failing test).

Test modules mark themselves with `pytestmark = LOOP_SCRIPTED` (the hyphen
keeps `pytest.mark.loop-scripted` from being valid Python). Fixtures are
thin wrappers over `harness.testing`, which works without pytest too; it is
imported when a fixture is first used, so that loading the plugin costs an
unrelated test run nothing (the ACP SDK takes about a second to import).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from . import testing
    from .fake_model._messages import FakeMessages
    from .fake_model._responses import FakeResponses
    from .fake_model._script import ScriptSource
    from .record._results import RunResult

__all__ = [
    "LOOP_AGENT",
    "LOOP_E2E",
    "LOOP_INFERENCE",
    "LOOP_REAL",
    "LOOP_SCRIPTED",
    "LOOP_SLOW",
    "LOOP_SOAK",
    "MARKERS",
]

MARKERS = {
    "loop-scripted": "fast loop tests against the scripted ACP agent (every loop branch)",
    "loop-slow": "scripted cases that take seconds each (the CLI end to end, the conformance check, real "
    "adapters, kill -9 recovery): -m loop-scripted leaves them out unless the expression names loop-slow",
    "LoopInference": "the kernel against the real local model on the CPU (pinned GGUF)",
    "LoopSoak": "hundreds of tasks asserting bounded memory, handles, threads and transcript size",
    "LoopAgent": "the kernel against your own ACP agent (--loop-agent COMMAND, or the loop_agent ini key)",
    "LoopE2E": "the control server end to end: a real loop-harness serve on loopback, driven over HTTP",
    "loop-real": "real agents' ACP adapters (Codex, Claude Code, from npm; skipped without node or the registry) "
    "under the kernel, against the fake model APIs on loopback (no key, no network)",
    "loop_workspace": "loop_workspace(files={path: text}, ignore=[pattern]): what harness_workspace starts with",
}
LOOP_SCRIPTED = getattr(pytest.mark, "loop-scripted")
LOOP_SLOW = getattr(pytest.mark, "loop-slow")
LOOP_INFERENCE = pytest.mark.LoopInference
LOOP_SOAK = pytest.mark.LoopSoak
LOOP_AGENT = pytest.mark.LoopAgent
LOOP_E2E = pytest.mark.LoopE2E
LOOP_REAL = getattr(pytest.mark, "loop-real")

_NO_AGENT = (
    "no agent to test: pass --loop-agent 'COMMAND ARGS' to pytest, or set loop_agent = \"COMMAND ARGS\" "
    "under [tool.pytest.ini_options] (or give harness_config agent=[...])"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loop-harness")
    group.addoption("--loop-agent", metavar="COMMAND", help="the ACP agent command (split like a shell does) "
                    "that the loop_agent_command and harness_config fixtures use")  # fmt: skip
    parser.addini("loop_agent", "the ACP agent command that --loop-agent gives on the command line", type="args")
    group.addoption("--loop-endpoint", metavar="URL|llama-cpp-server", help="run the inference agent (the "
                    "LoopInference tests) on an OpenAI-compatible server: its base URL "
                    "(http://127.0.0.1:8080/v1), or llama-cpp-server to start llama-cpp-python's server on the "
                    "pinned model for the session")  # fmt: skip
    group.addoption("--loop-model", metavar="NAME", help="with --loop-endpoint URL: the model the server serves "
                    "(default: the one it lists first)")  # fmt: skip
    group.addoption("--loop-endpoint-args", metavar="ARGS", default="", help="more inference agent options with "
                    "--loop-endpoint, split like a shell does (e.g. '--no-stream --read-timeout 300')")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LoopSoak runs only when a -m expression names it: a plain `pytest`, or `-m "not LoopInference"`,
    leaves the minutes-long soaks out; `-m LoopSoak` (or any expression naming it) decides for itself.
    loop-slow cases are scripted too, but `-m loop-scripted` is the tier run on every change: an expression
    naming loop-scripted and not loop-slow leaves them out (a plain `pytest` runs them)."""
    expression = config.option.markexpr or ""
    _deselect(config, items, "LoopSoak", "LoopSoak" not in expression)
    _deselect(config, items, "loop-slow", "loop-scripted" in expression and "loop-slow" not in expression)


def _deselect(config: pytest.Config, items: list[pytest.Item], marker: str, when: bool) -> None:
    chosen = [item for item in items if item.get_closest_marker(marker) is not None] if when else []
    if chosen:
        config.hook.pytest_deselected(items=chosen)
        items[:] = [item for item in items if item.get_closest_marker(marker) is None]


@pytest.fixture(name="loop_agent_command", scope="session")
def loop_agent_command_fixture(pytestconfig: pytest.Config) -> list[str]:
    """Your agent's command line, from `--loop-agent` or the `loop_agent` ini key; fails the test (never
    skips it) when neither names one."""
    option = pytestconfig.getoption("--loop-agent")
    command = shlex.split(option) if option else [str(part) for part in pytestconfig.getini("loop_agent")]
    if not command:
        pytest.fail(_NO_AGENT, pytrace=False)
    return command


@pytest.fixture(name="harness_model", scope="session")
def harness_model_fixture() -> Path:
    """The default pinned model, resolved and verified once per session (xdist-safe: a file lock).

    A model that cannot be resolved fails the test with the resolver's message: it is never a skip.
    """
    from .models import LockError, ModelHashMismatch, ModelUnavailable, resolve_model

    try:
        return resolve_model()
    except (LockError, ModelUnavailable, ModelHashMismatch) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(name="loop_endpoint_server", scope="session")
def loop_endpoint_server_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[testing.LlamaCppServer | None]:
    """With `--loop-endpoint=llama-cpp-server`, llama-cpp-python's server on the pinned model (`harness_model`)
    on a free loopback port, started once per session (per xdist worker), waited for, and stopped at the end
    (None for any other `--loop-endpoint`, or none). `restart()` gives a test an empty prompt cache."""
    from . import testing

    if request.config.getoption("--loop-endpoint") != testing.LLAMA_CPP_SERVER:
        yield None
        return
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # the cores shared among the workers' servers
    server = testing.LlamaCppServer(request.getfixturevalue("harness_model"),
                                    log=tmp_path_factory.mktemp("llama-cpp-server") / "server.log",
                                    threads=max(1, (os.cpu_count() or 2) // workers))  # fmt: skip
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"--loop-endpoint={testing.LLAMA_CPP_SERVER}: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="loop_endpoint", scope="session")
def loop_endpoint_fixture(
    request: pytest.FixtureRequest, loop_endpoint_server: testing.LlamaCppServer | None
) -> testing.Endpoint | None:
    """The OpenAI-compatible server `--loop-endpoint` names, with `--loop-model` and `--loop-endpoint-args`
    (None without it: the local model). The server `llama-cpp-server` started has its log beside every
    failing test that used it."""
    from . import testing

    option = request.config.getoption("--loop-endpoint")
    if not option:
        return None
    extra = tuple(shlex.split(request.config.getoption("--loop-endpoint-args") or ""))
    if loop_endpoint_server is not None:
        started = loop_endpoint_server.endpoint
        assert started is not None
        return testing.Endpoint(started.url, started.model, (*started.agent_args, *extra), started.log)
    return testing.Endpoint(option.rstrip("/"), request.config.getoption("--loop-model"), extra)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that used a server we started shows the end of its log."""
    report = yield
    endpoint = getattr(item, "funcargs", {}).get("loop_endpoint")
    log = getattr(endpoint, "log", None)
    if report.failed and isinstance(log, Path):
        try:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        except OSError as exc:
            tail = f"(no log: {exc})"
        report.sections.append((f"llama-cpp-server log ({log})", tail))
    return report


@pytest.fixture(name="harness_workspace")
def harness_workspace_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> testing.Workspace:
    """A git worktree on `main`, pushed to a bare `origin` with its upstream set; a test's
    `@pytest.mark.loop_workspace(files={"src/a.py": "..."}, ignore=["out/"])` says what it starts with."""
    from . import testing

    marker = request.node.get_closest_marker("loop_workspace")
    options = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"files", "ignore"}
    if marker is not None and (marker.args or unknown):
        pytest.fail(f"loop_workspace takes files= and ignore= only (got {marker.args or sorted(unknown)})")
    return testing.make_workspace(tmp_path / "ws", **options)


@pytest.fixture(name="make_harness_workspace")
def make_harness_workspace_fixture(tmp_path: Path) -> Callable[..., testing.Workspace]:
    """More workspaces: `make_harness_workspace("second", files={...}, ignore=[...])`."""
    from . import testing

    def make(name: str, *, files: Mapping[str, str] | None = None, ignore: Sequence[str] = ()) -> testing.Workspace:
        return testing.make_workspace(tmp_path / name, files=files, ignore=ignore)

    return make


@pytest.fixture(name="scripted_scenario")
def scripted_scenario_fixture(tmp_path: Path) -> Callable[..., Path]:
    """Write a scenario (a dict) for the scripted agent; returns its path."""
    from . import testing

    def write(data: dict[str, Any], name: str = "scenario.yaml") -> Path:
        return testing.write_yaml(tmp_path / name, data)

    return write


@pytest.fixture(name="scripted_agent")
def scripted_agent_fixture(scripted_scenario: Callable[..., Path]) -> Callable[..., list[str]]:
    """The command line of a scripted agent playing a scenario (a dict), for any ACP client."""
    from . import testing

    def command(data: dict[str, Any], name: str = "agent-scenario.yaml") -> list[str]:
        return testing.scripted_agent_command(scripted_scenario(data, name))

    return command


@pytest.fixture(name="harness_config")
def harness_config_fixture(
    request: pytest.FixtureRequest, tmp_path: Path, harness_workspace: testing.Workspace
) -> Callable[..., Path]:
    """Write a run config on `harness_workspace` and return its path. The agent is the scripted one on
    `scenario`, or `agent=[command...]` (or a whole `agent:` section), or else your agent from
    `--loop-agent`; other keywords as `testing.loop_config` (tasks, rules, limits, queue, ...). Transcripts
    go to `tmp_path/transcripts`, outside the workspace."""
    from . import testing

    def write(
        scenario: Path | None = None,
        name: str = "loop.yaml",
        *,
        agent: Sequence[str] | Mapping[str, Any] | None = None,
        workspace: testing.Workspace | None = None,
        **options: Any,
    ) -> Path:
        if scenario is None and agent is None:
            agent = request.getfixturevalue("loop_agent_command")
        options.setdefault("transcripts", str(tmp_path / "transcripts"))
        config = testing.loop_config(workspace or harness_workspace, scenario, agent=agent, **options)
        return testing.write_yaml(tmp_path / name, config)

    return write


@pytest.fixture(name="run_loop")
def run_loop_fixture() -> Callable[..., RunResult]:
    """Run a config through the kernel; every run's transcript is checked complete and valid."""
    from . import testing

    def run(config: Path, **options: Any) -> RunResult:
        result = testing.run_loop(config, **options)
        testing.assert_transcript_complete(result)
        return result

    return run


@pytest.fixture(name="fake_responses")
def fake_responses_fixture() -> Iterator[Callable[[ScriptSource], FakeResponses]]:
    """Start a stand-in OpenAI Responses API (for Codex) on 127.0.0.1 playing a script: a script file's path,
    or its replies as data (`[[{"shell": "make test"}], [{"say": "done"}]]`). `.url` is the base URL for Codex's
    provider (`.../v1`), `.requests` every request body, `.outputs()` what the commands printed. Each is
    closed at teardown."""
    from .fake_model._responses import FakeResponses
    from .fake_model._script import as_script

    started: list[FakeResponses] = []

    def start(script: ScriptSource) -> FakeResponses:
        started.append(FakeResponses.from_script(as_script(script)))
        return started[-1]

    yield start
    for fake in started:
        fake.close()


@pytest.fixture(name="fake_messages")
def fake_messages_fixture() -> Iterator[Callable[[ScriptSource], FakeMessages]]:
    """Start a stand-in Anthropic Messages API (for Claude Code) on 127.0.0.1 playing a script, as
    `fake_responses` does. `.url` is `ANTHROPIC_BASE_URL` (no `/v1`), `.requests` every request (method, path,
    body, turn), `.turns()` the agent's own turns, `.outputs()` what the commands printed."""
    from .fake_model._messages import FakeMessages
    from .fake_model._script import as_script

    started: list[FakeMessages] = []

    def start(script: ScriptSource) -> FakeMessages:
        started.append(FakeMessages.from_script(as_script(script)))
        return started[-1]

    yield start
    for fake in started:
        fake.close()
