"""The inference agent: an ACP agent over a model on the CPU (a pinned GGUF) or any OpenAI-compatible server.

    loop-harness agent inference [--model NAME] [--seed N] [--threads N]
    loop-harness agent inference --endpoint URL [--model NAME] [--no-stream]

serves ACP on stdio. Before anything else it moves fd 1 aside: JSON-RPC goes
to a private duplicate of stdout, and fd 1 (where llama.cpp and any `print`
write) points at stderr, so no model output can reach the protocol stream.
With an endpoint (`--endpoint`, else `$LOOP_HARNESS_ENDPOINT`) no GGUF is
resolved or loaded and llama_cpp is not imported: each model step is a chat
completion on that server (`_endpoint`); the model is `--model`, else
`$LOOP_HARNESS_MODEL`, else the one the server lists first.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import IO

__all__ = ["ENDPOINT_VARIABLE", "MODEL_VARIABLE", "serve"]

#: Where the agent finds its endpoint and model when the flags do not say (the flags win).
ENDPOINT_VARIABLE = "LOOP_HARNESS_ENDPOINT"
MODEL_VARIABLE = "LOOP_HARNESS_MODEL"


def serve(
    *,
    model: str | None,
    seed: int,
    threads: int,
    max_tokens: int,
    max_steps: int,
    trace: str | None = None,
    endpoint: str | None = None,
    stream: bool = True,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
    n_ctx: int | None = None,
) -> int:
    """Run the inference agent on stdio until stdin closes. Returns the exit status."""
    rpc = _guard_stdout()
    endpoint = endpoint or os.environ.get(ENDPOINT_VARIABLE) or None
    model = model or os.environ.get(MODEL_VARIABLE) or None
    from ._agent import InferenceAgent
    from ._model import Model

    backend: Model
    if endpoint is not None:
        from ._endpoint import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, EndpointModel

        remote = EndpointModel(
            endpoint,
            model=model,
            seed=seed,
            stream=stream,
            connect_timeout=connect_timeout or DEFAULT_CONNECT_TIMEOUT,
            read_timeout=read_timeout or DEFAULT_READ_TIMEOUT,
            n_ctx=n_ctx,
            trace=Path(trace) if trace else None,
        )
        why = remote.describe()  # once, at start: the model's name, revision and context size
        if why is not None:
            print(f"inference agent: the endpoint's models could not be read ({why})", file=sys.stderr)
        backend = remote
    else:
        from ..models import LockError, ModelHashMismatch, ModelLock, ModelUnavailable, resolve_model
        from ._model import LocalModel

        try:
            entry = ModelLock.load().get(model)
            path = resolve_model(model)  # verified against models.lock before the load
        except (LockError, ModelUnavailable, ModelHashMismatch) as exc:
            print(f"inference agent: {exc}", file=sys.stderr)
            return 2
        backend = LocalModel(path, seed=seed, threads=threads, n_ctx=n_ctx or 4096,
                             trace=Path(trace) if trace else None, name=entry.name,
                             revision=entry.revision)  # fmt: skip
    agent = InferenceAgent(backend, max_tokens=max_tokens, max_steps=max_steps)
    asyncio.run(_serve(agent, rpc))
    return 0


def _guard_stdout() -> IO[bytes]:
    """A private duplicate of fd 1 for JSON-RPC; fd 1 itself now writes to stderr."""
    sys.stdout.flush()
    rpc = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return rpc


async def _serve(agent: object, rpc: IO[bytes]) -> None:
    from acp import run_agent, stdio_streams

    # acp.stdio_streams() wraps whatever sys.stdout is: give it the private duplicate.
    sys.stdout = rpc
    try:
        reader, writer = await stdio_streams(limit=64 << 20)
    finally:
        sys.stdout = sys.stderr
    await run_agent(agent, writer, reader)  # type: ignore[arg-type]
