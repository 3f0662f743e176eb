"""The model-server scripts (`examples/model-servers/`) build the command they document: run with DRY_RUN=1,
since vLLM and Ollama need a GPU box or a daemon this machine does not have."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "model-servers"


def dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DRY_RUN": "1", **env})  # fmt: skip


@pytest.mark.parametrize(
    ("model", "parser"),
    [
        ("Qwen/Qwen2.5-Coder-7B-Instruct", "hermes"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json"),
        ("mistralai/Devstral-Small-2505", "mistral"),
        ("ibm-granite/granite-3.3-8b-instruct", "granite"),
    ],
)
def test_vllm_serves_with_the_tool_call_parser_of_the_models_family_at_the_pinned_revision(model, parser):
    done = dry_run("serve-vllm.sh", model, "0123abc", "coder")
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:3] == ["vllm", "serve", model]
    for flag, value in [("--revision", "0123abc"), ("--served-model-name", "coder"), ("--tool-call-parser", parser),
                        ("--host", "127.0.0.1"), ("--tensor-parallel-size", "1")]:  # fmt: skip
        assert words[words.index(flag) + 1] == value, (flag, done.stdout)
    assert "--enable-auto-tool-choice" in words


def test_vllm_across_gpus_and_an_explicit_parser():
    done = dry_run("serve-vllm.sh", "org/unknown-model", "r1", TOOL_PARSER="pythonic", TENSOR_PARALLEL="4",
                   PIPELINE_PARALLEL="2")  # fmt: skip
    words = done.stdout.split()
    assert words[words.index("--tool-call-parser") + 1] == "pythonic"
    assert words[words.index("--tensor-parallel-size") + 1] == "4"
    assert words[words.index("--pipeline-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("script", "args", "said"),
    [
        ("serve-vllm.sh", ["Qwen/Qwen2.5-Coder-7B-Instruct"], "MODEL REVISION"),  # no revision: no unpinned serve
        ("serve-vllm.sh", ["org/unknown-model", "r1"], "set TOOL_PARSER"),
        ("serve-ollama.sh", [], "MODEL"),
    ],
)
def test_a_script_missing_what_it_needs_says_so_and_exits_2(script, args, said):
    done = dry_run(script, *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_ollama_pulls_the_model_it_pins():
    done = dry_run("serve-ollama.sh", "qwen2.5-coder:7b")
    assert done.returncode == 0, done.stderr
    assert "ollama pull qwen2.5-coder:7b" in done.stdout
