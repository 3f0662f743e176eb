"""LoopInference wiring: configs that bind the kernel to the real inference agent.

The agent runs on the pinned local model, or, with `--loop-endpoint URL|llama-cpp-server`, on that
OpenAI-compatible server (`loop_endpoint`): the command gains `--endpoint/--model`, and every config a
network rule for the server's host, which the agent inside the sandbox reaches through the kernel's proxy.
"""

from __future__ import annotations

import os

import pytest

from harness import testing

WRITE_OUT = [
    {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
    {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"},
    {"id": "inspect", "kind": "execute", "commands": ["ls", "ls *", "cat *", "git status*", "git log*"],
     "decision": "allow"},
]  # fmt: skip


def inference_threads() -> int:
    """CPU threads per agent: the cores shared among pytest-xdist workers (oversubscribed llama.cpp
    threads spin against each other and run many times slower)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 2) // workers)


@pytest.fixture(name="inference_agent_threads")
def inference_agent_threads_fixture() -> int:
    return inference_threads()


@pytest.fixture(name="inference_command")
def inference_command_fixture(request, loop_endpoint):
    """`inference_command(seed=42, threads=N)`: the agent's command line, on the local model (resolved first)
    or on `--loop-endpoint`."""
    if loop_endpoint is None:
        request.getfixturevalue("harness_model")

    def command(*, seed: int = 42, threads: int | None = None) -> list[str]:
        threads = threads or inference_threads()
        return testing.inference_agent_command(seed=seed, threads=threads, endpoint=loop_endpoint)

    return command


@pytest.fixture(name="inference_network")
def inference_network_fixture(loop_endpoint):
    """The network rules the agent needs: the endpoint's host, or none for the local model."""
    return [] if loop_endpoint is None else [loop_endpoint.network_rule()]


@pytest.fixture(name="inference_workspace")
def inference_workspace_fixture(tmp_path):
    """A workspace whose out/ is ignored by git, so the model's files leave the tree clean."""
    return testing.make_workspace(tmp_path / "ws", ignore=["out/"])


@pytest.fixture(name="inference_endpoint")
def inference_endpoint_fixture(loop_endpoint):
    """`agent.endpoint` for `--loop-endpoint` with a model name, so that `run_start` records the model the
    server served (None on the local model, or on a server whose model the agent picks itself)."""
    if loop_endpoint is None or not loop_endpoint.model:
        return None
    return {"url": loop_endpoint.url, "model": loop_endpoint.model}


@pytest.fixture(name="inference_config")
def inference_config_fixture(tmp_path, inference_command, inference_network, inference_workspace, inference_endpoint):
    """Write a run config binding the kernel to the inference agent."""

    def write(tasks, *, rules=WRITE_OUT, seed=42, name="loop.yaml", workspace=None, agent_args=(), **options):
        workspace = workspace or inference_workspace
        config = {
            "workspace": str(workspace.path),
            "agent": {
                "command": [*inference_command(seed=seed), *agent_args],
                "supports_permission_requests": True,
                "env": testing.inference_agent_env(),
                **({"endpoint": inference_endpoint} if inference_endpoint else {}),
            },
            "policy": {"rules": [*rules, *inference_network]},
            "queue": {"tasks": tasks},
            # a prompt evaluation is one uninterruptible llama_decode: the grace must cover it
            "limits": {"max_iterations": 4, "turn_timeout_s": 300, "cancel_grace_s": 30, **options.pop("limits", {})},
            "transcripts": str(tmp_path / "transcripts"),
            **options,
        }
        return testing.write_yaml(tmp_path / name, config)

    return write
