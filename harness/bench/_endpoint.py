"""`loop-harness bench endpoint`: the inference agent's endpoint backend against a bare client, on one server.

One llama.cpp server on the pinned GGUF (llama-cpp-python's, started by the bench on a free loopback port), or
the user's (`--endpoint URL --model NAME`). Three comparisons, in one run:

1. Completion tokens/s. The kernel drains `tasks` tasks with the inference agent on the server (sandbox on: the
   agent reaches it through the kernel's proxy), and the agent traces every request it makes (`--trace`: the
   body as sent, the answer, the server's `usage`, its timings). Then a bare client (httpx, no proxy, no
   agent, no kernel) posts the same bodies, in the same order, to the same server. Each side's figure is the
   server's `usage.completion_tokens` summed over its requests, per second of request time. Without streaming
   (llama-cpp-python's server cannot stream a tool call the model chose, so the agent asks with `--no-stream`
   there) a request's time is the whole answer, prompt evaluation included; with streaming it is the first
   chunk to the last (decode only), and the tokens the first chunk's. The bench's own server is restarted
   before each side (the same cold prompt cache for both); the answers are compared.
2. Time to first token. Streaming: request to the first chunk carrying content or a tool call, both sides.
   Without streaming nothing comes before the whole answer, so the figure both sides share is the answer's
   latency, and the bare client also streams the same bodies to time the first chunk where the server
   streams them (llama-cpp-python's: only answers that are messages; a tool call ends that stream with an
   error, counted, and not timed).
3. One loop against `loops` loops at once on the server (the soak's loops, `soak.SoakRunner`, counting only):
   each loop drains `tasks` tasks; aggregate tasks/s and completion tokens/s, and their ratio.

The agent takes at most `STEPS` model steps a prompt turn (`--max-steps`): the bench measures requests, not the
model's aim, and through llama-cpp-python's server one request takes seconds to minutes on a CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from ..config._config import load_config
from ..kernel._kernel import Kernel
from ..testing import (
    DEMO_TASKS,
    OUT_RULES,
    Endpoint,
    LlamaCppServer,
    inference_agent_command,
    inference_agent_env,
    make_workspace,
    write_yaml,
)

__all__ = ["bench_endpoint"]

_READ_TIMEOUT = 300.0  # a whole answer from a busy CPU server
STEPS = 2


@dataclass
class _Server:
    """The server the bench measures: its endpoint, and ours to restart (None: the user's)."""

    endpoint: Endpoint
    ours: LlamaCppServer | None
    stream: bool

    def fresh(self) -> None:
        """An empty prompt cache before a side, where the server is ours."""
        if self.ours is not None:
            self.ours.restart()


def bench_endpoint(*, tasks: int = 1, rounds: int = 2, loops: int = 4, threads: int = 2, url: str | None = None,
                   model: str | None = None, stream: bool = True, as_json: bool = False) -> int:  # fmt: skip
    """Exit 0 with the figures printed; 2 when the server could not be reached or started."""
    with tempfile.TemporaryDirectory(prefix="loop-harness-bench-endpoint-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        try:
            server = _start(stack, root, url, model, stream, threads)
        except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:  # ValueError: models.lock's LockError
            print(f"bench endpoint: {exc}", file=sys.stderr)
            return 2
        steps = ("--max-steps", str(STEPS))
        server.endpoint = replace(server.endpoint, agent_args=(*server.endpoint.agent_args, *steps))
        sides = _kernel_against_bare(server, root, tasks, rounds, threads)
        together = _loops(server.endpoint, tasks, loops, threads)
    figures = {
        "server": "llama-cpp-python, started by the bench" if server.ours else server.endpoint.url,
        "model": server.endpoint.model,
        "stream": server.stream,
        "threads": threads if server.ours else None,
        "max_steps": STEPS,
        **sides,
        **together,
    }
    if as_json:
        print(json.dumps(figures))
    else:
        _print(figures)
    return 0


def _start(stack: contextlib.ExitStack, root: Path, url: str | None, model: str | None, stream: bool,
           threads: int) -> _Server:  # fmt: skip
    if url is not None:
        answer = httpx.get(f"{url.rstrip('/')}/models", timeout=5.0, trust_env=False)  # up, before anything runs
        answer.raise_for_status()
        args = () if stream else ("--no-stream", "--read-timeout", str(int(_READ_TIMEOUT)))
        return _Server(Endpoint(url.rstrip("/"), model, args), None, stream)
    from ..models import resolve_model

    ours = LlamaCppServer(resolve_model(), log=root / "llama-cpp-server.log", threads=threads)
    endpoint = stack.enter_context(ours)  # its endpoint has the agent ask with --no-stream: it cannot stream calls
    return _Server(endpoint, ours, False)


# --- 1 and 2: the kernel + endpoint backend against a bare client ---------------------------------------------


_MEASURED = {
    True: "completion tokens (the server's usage) per second from the first chunk to the last (decode)",
    False: "completion tokens (the server's usage) per second of whole answers (no streaming: prompt evaluation "
    "included)",
}


def _kernel_against_bare(server: _Server, root: Path, tasks: int, rounds: int, threads: int) -> dict[str, Any]:
    kernel_rates, bare_rates, kernel_first, bare_first, kernel_answer, bare_answer = [], [], [], [], [], []
    probes: list[float] = []
    probed = refused = requests = 0
    identical = True
    terminals: list[str] = []
    for number in range(rounds):
        server.fresh()
        traced, terminals = _through_kernel(server.endpoint, root / f"round{number}", tasks, threads)
        server.fresh()
        bare = _replay(server.endpoint, traced)
        kernel_rates.append(_rate(traced, server.stream))
        bare_rates.append(_rate(bare, server.stream))
        kernel_answer += [t["seconds"] for t in traced]
        bare_answer += [b["seconds"] for b in bare]
        kernel_first += [t["ttft_s"] for t in traced]
        bare_first += [b["ttft_s"] for b in bare]
        identical &= all(_output(t) == _output(b) for t, b in zip(traced, bare, strict=True))
        requests = len(traced)
        if not server.stream and number == 0:  # where the server streams these bodies at all
            firsts, refused = _stream_probe(server.endpoint, traced)
            probes, probed = firsts, len(traced)
    kernel_rate, bare_rate = round(statistics.median(kernel_rates), 1), round(statistics.median(bare_rates), 1)
    figures: dict[str, Any] = {
        "tasks": tasks,
        "rounds": rounds,
        "requests_per_round": requests,
        "measured": _MEASURED[server.stream],
        "kernel_tokens_per_s": kernel_rate,
        "bare_tokens_per_s": bare_rate,
        "ratio": round(kernel_rate / bare_rate, 3) if bare_rate else None,
        "kernel_answer_ms_median": _ms(kernel_answer),
        "bare_answer_ms_median": _ms(bare_answer),
        "kernel_ttft_ms_median": _ms(kernel_first) if server.stream else None,
        "bare_ttft_ms_median": _ms(bare_first) if server.stream else None,
        "identical_outputs": identical,
        "task_terminals": terminals,
    }
    if not server.stream:
        figures["bare_streamed_ttft"] = {"requests": probed, "streamed": len(probes), "refused": refused,
                                         "ttft_ms_median": _ms(probes) if probes else None}  # fmt: skip
    return figures


def _through_kernel(endpoint: Endpoint, root: Path, tasks: int, threads: int) -> tuple[list[dict[str, Any]], list[str]]:
    """A kernel run of `tasks` tasks by the inference agent on the endpoint; its trace and the tasks' terminals."""
    home = root / "agent-home"  # kept writable inside the sandbox: where the agent writes its trace
    home.mkdir(parents=True)
    trace = home / "trace.jsonl"
    workspace = make_workspace(root / "ws", ignore=["out/"])
    queue = [{"id": f"T{i}", **DEMO_TASKS[(i - 1) % len(DEMO_TASKS)]} for i in range(1, tasks + 1)]
    agent: dict[str, Any] = {
        "command": [*inference_agent_command(threads=threads, endpoint=endpoint), "--trace", str(trace)],
        "supports_permission_requests": True,
        "env": inference_agent_env(),
    }
    if endpoint.model:
        agent["endpoint"] = {"url": endpoint.url, "model": endpoint.model}
    config = {
        "workspace": str(workspace.path),
        "agent": agent,
        "policy": {"rules": [*OUT_RULES, endpoint.network_rule()]},
        "queue": {"tasks": queue},
        "limits": {"max_iterations": 4, "turn_timeout_s": 600, "cancel_grace_s": 30},
        "transcripts": str(root / "runs"),
        "sandbox": {"home": str(home)},
    }
    result = asyncio.run(Kernel(load_config(write_yaml(root / "loop.yaml", config))).run())
    traced = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    if not traced:
        raise RuntimeError(f"the kernel's run made no request ({result.terminal.value}: {result.reason})")
    return traced, [t.terminal.value for t in result.tasks]


def _replay(endpoint: Endpoint, traced: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traced bodies again, from a bare httpx client (no proxy), each timed as the agent timed it."""
    out = []
    with httpx.Client(timeout=_READ_TIMEOUT, trust_env=False) as client:
        for request in traced:
            body = request["body"]
            started = time.perf_counter()
            if body.get("stream"):
                answer = _read_stream(client, endpoint, body, started)
            else:
                response = client.post(f"{endpoint.url}/chat/completions", json=body)
                response.raise_for_status()
                seconds = time.perf_counter() - started
                answer = {**_whole(response.json()), "seconds": seconds, "ttft_s": seconds, "decode_s": 0.0}
            out.append(answer)
    return out


def _read_stream(client: httpx.Client, endpoint: Endpoint, body: dict[str, Any], started: float) -> dict[str, Any]:
    text: list[str] = []
    call: dict[str, Any] = {"name": "", "arguments": []}
    first = last = None
    chunks = tokens = 0
    with client.stream("POST", f"{endpoint.url}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            tokens = (chunk.get("usage") or {}).get("completion_tokens") or tokens
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                carried = bool(delta.get("content") or delta.get("tool_calls"))
                text.append(delta.get("content") or "")
                for fragment in delta.get("tool_calls") or []:
                    function = fragment.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["arguments"].append(function.get("arguments") or "")
                if carried:
                    now = time.perf_counter()
                    first, last, chunks = first or now, now, chunks + 1
    end = time.perf_counter()
    return {"text": "".join(text), "tool": call["name"] or None,
            "arguments": "".join(call["arguments"]) if call["name"] else None,
            "completion_tokens": tokens or chunks, "seconds": end - started,
            "ttft_s": (first or end) - started, "decode_s": (last or end) - (first or end)}  # fmt: skip


def _whole(answer: dict[str, Any]) -> dict[str, Any]:
    message = answer["choices"][0].get("message") or {}
    calls = message.get("tool_calls") or []
    function = calls[0].get("function") or {} if calls else {}
    return {"text": message.get("content") or "", "tool": function.get("name"), "arguments": function.get("arguments"),
            "completion_tokens": (answer.get("usage") or {}).get("completion_tokens") or 0}  # fmt: skip


def _stream_probe(endpoint: Endpoint, traced: list[dict[str, Any]]) -> tuple[list[float], int]:
    """Each traced body streamed: the seconds to the first chunk of those the server streams, and how many it
    would not (an error status, or a stream that breaks off before any chunk)."""
    firsts: list[float] = []
    refused = 0
    with httpx.Client(timeout=_READ_TIMEOUT, trust_env=False) as client:
        for request in traced:
            body = {**request["body"], "stream": True, "stream_options": {"include_usage": True}}
            started = time.perf_counter()
            try:
                answer = _read_stream(client, endpoint, body, started)
            except (httpx.HTTPError, ValueError):
                refused += 1
                continue
            if answer["completion_tokens"]:
                firsts.append(answer["ttft_s"])
            else:
                refused += 1
    return firsts, refused


def _output(answer: dict[str, Any]) -> tuple[Any, ...]:
    return answer["text"], answer["tool"], answer["arguments"]


def _rate(answers: list[dict[str, Any]], stream: bool) -> float:
    if stream:  # decode: the first token's time is the prompt's (TTFT)
        long = [a for a in answers if a["completion_tokens"] > 1]
        tokens, seconds = sum(a["completion_tokens"] - 1 for a in long), sum(a["decode_s"] for a in long)
    else:
        tokens, seconds = sum(a["completion_tokens"] for a in answers), sum(a["seconds"] for a in answers)
    return round(tokens / seconds, 1) if seconds else 0.0


def _ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 1)


# --- 3: one loop against several at once --------------------------------------------------------------------


def _loops(endpoint: Endpoint, tasks: int, loops: int, threads: int) -> dict[str, Any]:
    """One loop, then `loops` loops at once, each draining `tasks` tasks: the soak's loops, counting only."""
    from soak import SoakRunner  # the soak's N loops (issue 33, item 3): loaded when this bench runs

    def drain(n: int) -> dict[str, Any]:
        result = SoakRunner(tasks=tasks * n, loops=n, agent="inference", endpoint=endpoint, judge=False,
                            threads=threads).run()  # fmt: skip
        return {**result.throughput, "terminals": result.terminals}

    alone, together = drain(1), drain(loops)
    return {
        "loops": loops,
        "tasks_per_loop": tasks,
        "one_loop": alone,
        "n_loops": together,
        "loops_tasks_ratio": _ratio(together["tasks_per_second"], alone["tasks_per_second"]),
        "loops_tokens_ratio": _ratio(together["tokens_per_second"], alone["tokens_per_second"]),
    }


def _ratio(many: float | None, one: float | None) -> float | None:
    return round(many / one, 2) if many and one else None


def _print(f: dict[str, Any]) -> None:
    threads = f" ({f['threads']} threads)" if f["threads"] else ""
    print(f"server: {f['server']}{threads}, model {f['model']}, {'streaming' if f['stream'] else 'no streaming'}")
    print(f"{f['tasks']} tasks x {f['rounds']} rounds, {f['requests_per_round']} requests per round (medians; at "
          f"most {f['max_steps']} model steps a prompt turn)")  # fmt: skip
    print(f"measured: {f['measured']}")
    print(f"through kernel + endpoint backend: {f['kernel_tokens_per_s']:>7} tokens/s")
    print(f"bare client, same requests:        {f['bare_tokens_per_s']:>7} tokens/s")
    print(f"ratio kernel / bare:               {f['ratio']} (target >= 0.95)")
    print(f"answer latency:                    {f['kernel_answer_ms_median']} ms vs {f['bare_answer_ms_median']} ms")
    if f["stream"]:
        print(f"time to first token:               {f['kernel_ttft_ms_median']} ms vs {f['bare_ttft_ms_median']} ms")
    else:
        probe = f["bare_streamed_ttft"]
        print("time to first token:               not observable through the backend without streaming (the answer "
              "comes whole)")  # fmt: skip
        print(f"  bare client, the same bodies streamed: {probe['streamed']} of {probe['requests']} streamed, "
              f"first chunk after {probe['ttft_ms_median']} ms (median); {probe['refused']} refused")  # fmt: skip
    print(f"same answers on both sides:        {f['identical_outputs']} ({', '.join(f['task_terminals'])})")
    one, many = f["one_loop"], f["n_loops"]
    print(f"1 loop: {one['tasks_per_second']} tasks/s, {one['tokens_per_second']} tokens/s; {f['loops']} loops at "
          f"once: {many['tasks_per_second']} tasks/s, {many['tokens_per_second']} tokens/s in aggregate "
          f"(ratio {f['loops_tasks_ratio']} tasks, {f['loops_tokens_ratio']} tokens; {f['tasks_per_loop']} tasks a "
          f"loop)")  # fmt: skip
