"""`loop-harness bench inference`: decode speed through kernel + agent against bare llama-cpp-python.

One run: the kernel drains a small queue with the inference agent, which traces
every completion it asks of the model (prompt, grammar, budget, output,
timings). Then the same completions, in the same order, go through bare
llama-cpp-python in this process (same model file, seed, threads and context),
and the generated texts are checked identical. Reported: decode tokens/s of
each and their ratio (target >= 0.95), median time to first token, and wall
time per task through the kernel.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the inference extra, imported where it is used
    from llama_cpp.llama_types import CreateCompletionStreamResponse

from ..config._config import load_config
from ..kernel._kernel import Kernel
from ..models import resolve_model
from ..testing import DEMO_TASKS, OUT_RULES, inference_agent_command, inference_agent_env, make_workspace, write_yaml

__all__ = ["bench_inference"]


def bench_inference(*, tasks: int = 3, threads: int = 2, rounds: int = 3, as_json: bool = False) -> int:
    """`rounds` times: drain `tasks` tasks through kernel + agent, then replay its completions bare."""
    model_path = resolve_model()
    kernel_rates, bare_rates, kernel_ttft, bare_ttft, task_seconds = [], [], [], [], []
    identical = True
    terminals: list[str] = []
    completions = 0
    for _ in range(rounds):
        traced, result = _through_kernel(tasks, threads)
        bare = _replay(model_path, traced, threads=threads)
        kernel_rates.append(_rate(traced))
        bare_rates.append(_rate(bare))
        kernel_ttft += [t["ttft_s"] for t in traced]
        bare_ttft += [t["ttft_s"] for t in bare]
        task_seconds += [t.seconds for t in result.tasks]
        identical &= all(a["text"] == b["text"] for a, b in zip(traced, bare, strict=True))
        terminals = [t.terminal.value for t in result.tasks]
        completions = len(traced)
    kernel_rate, bare_rate = statistics.median(kernel_rates), statistics.median(bare_rates)
    figures = {
        "tasks": tasks,
        "rounds": rounds,
        "threads": threads,
        "completions_per_round": completions,
        "kernel_decode_tokens_per_s": kernel_rate,
        "bare_decode_tokens_per_s": bare_rate,
        "ratio": round(kernel_rate / bare_rate, 3),
        "kernel_ttft_ms_median": round(statistics.median(kernel_ttft) * 1000, 1),
        "bare_ttft_ms_median": round(statistics.median(bare_ttft) * 1000, 1),
        "identical_outputs": identical,
        "task_seconds_median": round(statistics.median(task_seconds), 2),
        "task_seconds_max": round(max(task_seconds), 2),
        "task_terminals": terminals,
    }
    if as_json:
        print(json.dumps(figures))
    else:
        print(f"{tasks} tasks x {rounds} rounds, {completions} completions per round, {threads} threads (medians)")
        print(f"decode through kernel + agent: {kernel_rate:>7} tokens/s")
        print(f"decode through bare llama:     {bare_rate:>7} tokens/s")
        print(f"ratio kernel / bare:           {figures['ratio']} (target >= 0.95)")
        ttft = f"{figures['kernel_ttft_ms_median']} ms vs {figures['bare_ttft_ms_median']} ms"
        print(f"time to first token:           {ttft}")
        print(f"same outputs on both sides:    {identical}")
        wall = f"{figures['task_seconds_median']} s median, {figures['task_seconds_max']} s max"
        print(f"wall time per task:            {wall} ({', '.join(terminals)})")
    return 0


def _through_kernel(tasks: int, threads: int) -> tuple[list[dict[str, Any]], Any]:
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-") as tmp:
        root = Path(tmp)
        trace = root / "trace.jsonl"
        workspace = make_workspace(root / "ws", ignore=["out/"])
        queue = [{"id": f"T{i}", **DEMO_TASKS[(i - 1) % len(DEMO_TASKS)]} for i in range(1, tasks + 1)]
        command = [*inference_agent_command(threads=threads), "--trace", str(trace)]
        config = {
            "workspace": str(workspace.path),
            "agent": {"command": command, "supports_permission_requests": True, "env": inference_agent_env()},
            "policy": {"rules": OUT_RULES},
            "queue": {"tasks": queue},
            "limits": {"max_iterations": 4, "turn_timeout_s": 600},
            "transcripts": str(root / "runs"),
        }
        result = asyncio.run(Kernel(load_config(write_yaml(root / "loop.yaml", config))).run())
        return [json.loads(line) for line in trace.read_text().splitlines()], result


def _replay(model_path: Path, traced: list[dict[str, Any]], *, threads: int) -> list[dict[str, Any]]:
    """The traced completions again, through llama-cpp-python with no harness around it."""
    from llama_cpp import Llama
    from llama_cpp.llama_grammar import LlamaGrammar

    llama = Llama(model_path=str(model_path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, seed=42,
                  verbose=False)  # fmt: skip
    compiled: dict[str, Any] = {}

    def grammar_for(source: dict[str, str] | None) -> Any:
        if source is None:
            return None
        key = json.dumps(source, sort_keys=True)
        if key not in compiled:
            compiled[key] = (
                LlamaGrammar.from_string(source["gbnf"], verbose=False)
                if "gbnf" in source
                else LlamaGrammar.from_json_schema(source["json_schema"], verbose=False)
            )
        return compiled[key]

    out = []
    for request in traced:
        grammar = request["grammar"]
        started = time.perf_counter()
        first = last = started
        chunks: list[str] = []
        stream: Iterator[CreateCompletionStreamResponse] = llama.create_completion(  # type: ignore[assignment]
            request["prompt"],
            grammar=grammar_for(request["grammar_source"]),
            max_tokens=request["max_tokens"],
            temperature=0.0,
            seed=42,
            stop=[":"] if grammar == "head" else ["<|im_end|>"],
            stream=True,
        )  # fmt: skip  (stream=True: an iterator of chunks, which the union return type does not say)
        for chunk in stream:
            now = time.perf_counter()
            if not chunks:
                first = now
            last = now
            chunks.append(chunk["choices"][0]["text"])
        text = "".join(chunks)
        if grammar == "head" and text and not text.endswith(":"):
            text += ":"
        out.append({"text": text, "tokens": len(chunks), "ttft_s": first - started, "decode_s": last - first})
    llama.close()
    return out


def _rate(completions: list[dict[str, Any]]) -> float:
    # Decode rate over completions long enough to have a decode phase (more than one token).
    long = [c for c in completions if c["tokens"] > 1]
    tokens = sum(c["tokens"] - 1 for c in long)  # the first token's time is the prompt's (TTFT)
    seconds = sum(c["decode_s"] for c in long)
    return round(tokens / seconds, 1) if seconds else 0.0
