"""The local model: one `Llama` per process, loaded once, used by one generation at a time.

`LocalModel.step` plays one grammar-constrained model step (a tool call or a
message), streaming tokens so a cancel is honoured between tokens and a token
budget ends the step as `length`. Greedy decoding (temperature 0) with a fixed
seed and thread count makes a step reproducible; llama-cpp-python keeps the
KV cache of the longest common prompt prefix, so each step of a session only
evaluates what is new.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # llama_cpp is imported at run time only once the fd guard is in place
    from llama_cpp.llama_types import CreateCompletionStreamResponse

from ._prompting import TOOLS, head_grammar_text

__all__ = ["LocalModel", "ModelStep"]


@dataclass
class ModelStep:
    kind: str  # "tool", "message", "length" (token budget spent), "cancelled", "invalid" (unparsable arguments)
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0  # request to first token (prompt evaluation)
    decode_s: float = 0.0  # first token to last token


class LocalModel:
    def __init__(
        self, path: Path, *, seed: int = 42, threads: int = 2, n_ctx: int = 4096, trace: Path | None = None
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
        # With a trace file, every completion (prompt, grammar, budget, text, timings) is appended
        # as a JSON line: `loop-harness bench inference` replays them through bare llama-cpp-python.
        self._trace = trace.open("a", encoding="utf-8") if trace else None
        self._lock = threading.Lock()  # a Llama is not thread-safe
        self._grammars: dict[str, Any] = {}  # compiled once per (head set or tool schema)
        self._tools: dict[str, dict[str, Any]] = dict(TOOLS)

    def count_tokens(self, text: str) -> int:
        return len(self.llama.tokenize(text.encode(), add_bos=False, special=True))

    def step(
        self, prompt: str, *, max_tokens: int, cancel: threading.Event, tools: dict[str, dict[str, Any]] | None = None
    ) -> ModelStep:
        """One model step: a tool call with parsed arguments, or a message; within `max_tokens`."""
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
