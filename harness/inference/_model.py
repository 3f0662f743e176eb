"""The agent's model backends: one interface, `Model.step`, and the local backend, `LocalModel`.

A backend plays one model step over the session's structured history (`_prompting`'s OpenAI-shaped
messages, no system message: each backend adds its own) and returns a `ModelStep`: a tool call with parsed
arguments, a message, or why neither (`length`, `cancelled`, `invalid`). A backend that cannot give a step at
all (an endpoint that is down or answers garbage) raises `StepError`, which ends the prompt turn with a
JSON-RPC error naming the cause. `LocalModel` is one `Llama` per process, loaded once; the endpoint backend
(`_endpoint.EndpointModel`) is any OpenAI-compatible server.

`LocalModel.step` renders the history as ChatML and plays a grammar-constrained step (a tool call or a
message), streaming tokens so a cancel is honoured between tokens and a token budget ends the step as
`length`. Greedy decoding (temperature 0) with a fixed seed and thread count makes a step reproducible;
llama-cpp-python keeps the KV cache of the longest common prompt prefix, so each step of a session only
evaluates what is new.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # llama_cpp is imported at run time only once the fd guard is in place
    from llama_cpp.llama_types import CreateCompletionStreamResponse

from ._prompting import NOT_JSON, TOOLS, chatml_messages, head_grammar_text, render_chatml

__all__ = ["LocalModel", "Model", "ModelStep", "StepError"]


@dataclass
class ModelStep:
    kind: str  # "tool", "message", "length" (token budget spent), "cancelled", "invalid" (unusable arguments)
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0  # request to first token (prompt evaluation)
    decode_s: float = 0.0  # first token to last token
    call_id: str | None = None  # the server's id for the call (an endpoint's), if it gave one
    why_invalid: str = NOT_JSON  # what the model is told of an invalid call


class StepError(Exception):
    """The backend could not give a step at all; the message names the cause."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data or {}


class Model(Protocol):
    """What the agent needs of a backend."""

    loads: int  # model loads in this process (0 for an endpoint: the server holds the model)
    n_ctx: int  # the context size `usage_update` reports

    @property
    def info(self) -> dict[str, Any]:
        """`{name, endpoint, revision}`: what the agent reports in its `initialize` answer."""
        ...

    async def step(
        self,
        messages: list[dict[str, Any]],
        tools: dict[str, dict[str, Any]],
        *,
        max_tokens: int,
        cancel: threading.Event,
    ) -> ModelStep:
        """One model step within `max_tokens`; `cancel` set ends it as `cancelled`. Raises `StepError`."""
        ...


class LocalModel:
    def __init__(
        self,
        path: Path,
        *,
        seed: int = 42,
        threads: int = 2,
        n_ctx: int = 4096,
        trace: Path | None = None,
        name: str | None = None,
        revision: str | None = None,
    ) -> None:
        from llama_cpp import Llama  # imported here: only once the fd guard is in place
        from llama_cpp.llama_grammar import LlamaGrammar

        self._grammar_type = LlamaGrammar
        self.llama = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            seed=seed,
            verbose=False,
        )
        self.seed = seed
        self.n_ctx = n_ctx
        self.loads = 1
        self._info = {"name": name or path.name, "endpoint": None, "revision": revision}
        # With a trace file, every completion (prompt, grammar, budget, text, timings) is appended
        # as a JSON line: `loop-harness bench inference` replays them through bare llama-cpp-python.
        self._trace = trace.open("a", encoding="utf-8") if trace else None
        self._lock = threading.Lock()  # a Llama is not thread-safe
        self._grammars: dict[str, Any] = {}  # compiled once per (head set or tool schema)
        self._tools: dict[str, dict[str, Any]] = dict(TOOLS)

    @property
    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def count_tokens(self, text: str) -> int:
        return len(self.llama.tokenize(text.encode(), add_bos=False, special=True))

    async def step(
        self,
        messages: list[dict[str, Any]],
        tools: dict[str, dict[str, Any]],
        *,
        max_tokens: int,
        cancel: threading.Event,
    ) -> ModelStep:
        """The history rendered as ChatML, then one step in a worker thread (llama.cpp blocks)."""
        prompt = render_chatml(chatml_messages(messages, tools))
        return await asyncio.to_thread(self.complete_step, prompt, max_tokens=max_tokens, cancel=cancel, tools=tools)

    def complete_step(
        self, prompt: str, *, max_tokens: int, cancel: threading.Event, tools: dict[str, dict[str, Any]] | None = None
    ) -> ModelStep:
        """One model step on a ChatML prompt: a tool call with parsed arguments, or a message; within
        `max_tokens`."""
        with self._lock:
            self._tools = tools or TOOLS
            step = ModelStep("message", prompt_tokens=self.count_tokens(prompt))
            head = self._complete(step, prompt, grammar="head", max_tokens=min(16, max_tokens), cancel=cancel)
            if step.kind in ("cancelled", "length"):
                return step
            budget = max_tokens - step.completion_tokens
            if head.startswith("functions."):
                step.kind, step.tool = "tool", head[len("functions.") : -1]
                body = self._complete(step, f"{prompt}{head}\n", grammar=step.tool, max_tokens=budget, cancel=cancel)
                step.raw_arguments = body
                if step.kind == "tool":
                    try:  # the grammar allows raw control characters inside strings
                        step.arguments = json.loads(body, strict=False)
                    except ValueError:
                        step.kind = "invalid"
            else:
                step.text = self._complete(step, f"{prompt}{head}\n", grammar=None, max_tokens=budget, cancel=cancel)
            return step

    def _source(self, which: str | None) -> dict[str, str] | None:
        """What a grammar is compiled from (for replaying a trace): GBNF text or a JSON schema."""
        if which is None:
            return None
        if which == "head":
            return {"gbnf": head_grammar_text(list(self._tools))}
        return {"json_schema": json.dumps(self._tools[which]["parameters"], sort_keys=True)}

    def _grammar(self, which: str) -> Any:
        """The head grammar over the current tools, or a tool's argument grammar."""
        if which == "head":
            key, text = f"head:{','.join(self._tools)}", head_grammar_text(list(self._tools))
            if key not in self._grammars:
                self._grammars[key] = self._grammar_type.from_string(text, verbose=False)
            return self._grammars[key]
        schema = json.dumps(self._tools[which]["parameters"], sort_keys=True)
        key = f"tool:{which}:{schema}"
        if key not in self._grammars:
            self._grammars[key] = self._grammar_type.from_json_schema(schema, verbose=False)
        return self._grammars[key]

    def _complete(
        self, step: ModelStep, prompt: str, *, grammar: str | None, max_tokens: int, cancel: threading.Event
    ) -> str:
        if max_tokens <= 0:
            step.kind = "length"
            return ""
        compiled = None if grammar is None else self._grammar(grammar)
        started = time.perf_counter()
        first = last = None
        text = []
        stream: Generator[CreateCompletionStreamResponse] = self.llama.create_completion(  # type: ignore[assignment]
            prompt,
            grammar=compiled,
            max_tokens=max_tokens,
            temperature=0.0,
            seed=self.seed,
            stop=[":"] if grammar == "head" else ["<|im_end|>"],
            stream=True,
        )
        finish = None
        for chunk in stream:
            now = time.perf_counter()
            first = first or now
            last = now
            choice = chunk["choices"][0]
            text.append(choice["text"])
            step.completion_tokens += 1
            finish = choice.get("finish_reason") or finish
            if cancel.is_set():
                stream.close()  # stop between tokens
                step.kind = "cancelled"
                break
        if first is not None and last is not None:
            step.ttft_s += first - started
            step.decode_s += last - first
        if finish == "length" and step.kind != "cancelled":
            step.kind = "length"
        out = "".join(text)
        if grammar == "head" and out and not out.endswith(":"):
            out += ":"  # the stop string is cut from the text; the head grammar always ends with it
        if self._trace is not None:
            record = {"prompt": prompt, "grammar": grammar, "grammar_source": self._source(grammar),
                      "max_tokens": max_tokens, "text": out,
                      "tokens": len(text), "ttft_s": (first or started) - started,
                      "decode_s": (last or started) - (first or started)}  # fmt: skip
            self._trace.write(json.dumps(record) + "\n")
            self._trace.flush()
        return out
