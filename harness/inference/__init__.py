"""The inference agent: an ACP agent over llama-cpp-python on the CPU, with a pinned GGUF.

    loop-harness agent inference [--model NAME] [--seed N] [--threads N]

serves ACP on stdio. Before anything else it moves fd 1 aside: JSON-RPC goes
to a private duplicate of stdout, and fd 1 (where llama.cpp and any `print`
write) points at stderr, so no model output can reach the protocol stream.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import IO

__all__ = ["serve"]


def serve(
    *, model: str | None, seed: int, threads: int, max_tokens: int, max_steps: int, trace: str | None = None
) -> int:
    """Run the inference agent on stdio until stdin closes. Returns the exit status."""
    rpc = _guard_stdout()
    from ..models import LockError, ModelHashMismatch, ModelUnavailable, resolve_model

    try:
        path = resolve_model(model)  # verified against models.lock before the load
    except (LockError, ModelUnavailable, ModelHashMismatch) as exc:
        print(f"inference agent: {exc}", file=sys.stderr)
        return 2
    from ._agent import InferenceAgent
    from ._model import LocalModel

    local = LocalModel(path, seed=seed, threads=threads, trace=Path(trace) if trace else None)
    agent = InferenceAgent(local, max_tokens=max_tokens, max_steps=max_steps)
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
