"""The endpoint backend: the inference agent's model steps on any OpenAI-compatible server.

    loop-harness agent inference --endpoint http://127.0.0.1:8080/v1 [--model NAME]

`EndpointModel.step` sends the session's history as OpenAI chat completions (`POST {base}/chat/completions`:
the tools as function tools, `tool_choice: auto`, temperature 0 and the seed, `max_tokens` the turn's budget
left), streamed (`stream: true` with `stream_options.include_usage`) unless `stream=False`. It reads one
step: the first tool call, its arguments gathered from `delta.tool_calls` fragments, or else the message.
An answer that is one JSON body (a server that does not stream, or `stream=False`) is read the same way.

What a step reports, as `LocalModel` reports it: `finish_reason: length` (or more completion tokens than
the budget allowed: a server that ignores `max_tokens`) is `length`; arguments that are not a JSON object,
lack a required key or call a tool not offered are `invalid`; the prompt and completion tokens are the
server's `usage`, else the stream's content chunks and the prompt's characters / 4; `ttft_s` is the request
to the first chunk, `decode_s` the first chunk to the last (a JSON body: all of it is `ttft_s`).

A cancel (session/cancel sets the session's event) aborts the request where it is, closing the connection:
the server sees its client go. The server that is down or answers garbage is never a hang: a connect
timeout and a read timeout (between any two bytes) bound every request, and a non-2xx status, an answer that
is not JSON, an event whose data is not JSON, or a stream that ends without a `finish_reason` raise
`StepError` naming the cause (the agent ends the prompt turn with a JSON-RPC error carrying it).

With `trace` (the agent's `--trace FILE`), every answered step appends one JSON line: the request body as
sent, the answer (text, tool call, finish), the server's `usage` (null when it reported none), the tokens
counted, and the timings (`seconds` the whole request). `loop-harness bench endpoint` posts the same bodies to
the same server from a bare client.

At start `describe()` reads `GET {base}/models` once (a short timeout; llama.cpp's server, vLLM and
Ollama's OpenAI API all serve it): the model name when none was given (the first listed), and what the
server says of it, the revision (`revision`, `model_sha` or `digest`) and the context size
(`max_model_len`, `context_length`, `n_ctx`, or `meta.n_ctx`), else `n_ctx` as configured.

The agent inside the kernel's sandbox reaches the server through the kernel's proxy (HTTP_PROXY, which
httpx honours): a network rule must allow the server's host.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ._model import ModelStep, StepError
from ._prompting import openai_messages, openai_tools

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_N_CTX", "DEFAULT_READ_TIMEOUT", "KEY_VARIABLE", "EndpointModel"]

DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds without a byte from the server; a streamed step sends one per token, a JSON body only at its end.
DEFAULT_READ_TIMEOUT = 120.0
DEFAULT_N_CTX = 4096
#: A bearer token for the server, from the environment only (never on the command line a transcript records).
KEY_VARIABLE = "LOOP_HARNESS_ENDPOINT_KEY"
_DESCRIBE_TIMEOUT = 3.0
_CANCEL_POLL_S = 0.05
_SHOWN = 300  # bytes of a bad answer quoted in the error
_NO_STREAM_HINT = (
    "a server that cannot stream tool calls (llama-cpp-python's chatml-function-calling) ends the stream so: "
    "give the agent --no-stream"
)


@dataclass
class _Reading:
    """What one answer said so far."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> {id, name, arguments: [fragments]}
    finish: str | None = None
    usage: dict[str, Any] | None = None
    chunks: int = 0  # chunks carrying content or arguments: the completion tokens when no usage comes
    events: int = 0
    first: float | None = None
    last: float | None = None


class EndpointModel:
    """Model steps on an OpenAI-compatible server at `base_url` (ending before `/chat/completions`)."""

    loads = 0  # the server holds the model: this process loads none

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        seed: int = 42,
        stream: bool = True,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        n_ctx: int | None = None,
        trace: Path | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.seed = seed
        self.stream = stream
        self.n_ctx = n_ctx or DEFAULT_N_CTX
        self._n_ctx_given = n_ctx is not None
        self.revision: str | None = None
        self.timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=None)
        key = os.environ.get(KEY_VARIABLE)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client: httpx.AsyncClient | None = None
        self._trace = trace.open("a", encoding="utf-8") if trace else None

    @property
    def info(self) -> dict[str, Any]:
        return {"name": self.model, "endpoint": self.base_url, "revision": self.revision}

    # --- start-up --------------------------------------------------------------------------------

    def describe(self) -> str | None:
        """Read `GET {base}/models` once: the model's name when none was given, its revision and context size
        where the server reports them. Returns why it could not be read (None when it was): the agent starts
        anyway, and a prompt's first request then names the cause."""
        url = f"{self.base_url}/models"
        try:
            answer = httpx.get(url, headers=self.headers, timeout=_DESCRIBE_TIMEOUT)
            answer.raise_for_status()
            listed = answer.json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return f"GET {url}: {type(exc).__name__}: {exc}"
        entries = [e for e in listed if isinstance(e, dict)]
        entry = next((e for e in entries if e.get("id") == self.model), None)
        if entry is None and self.model is None and entries:
            entry = entries[0]
            self.model = str(entry.get("id")) if entry.get("id") is not None else None
        if entry is None:
            return None
        meta: dict[str, Any] = entry["meta"] if isinstance(entry.get("meta"), dict) else {}
        revision = next((entry[k] for k in ("revision", "model_sha", "digest") if entry.get(k)), None)
        self.revision = str(revision) if revision is not None else None
        sizes = [entry.get("max_model_len"), entry.get("context_length"), entry.get("n_ctx"), meta.get("n_ctx")]
        if not self._n_ctx_given:
            self.n_ctx = next((n for n in sizes if isinstance(n, int) and n > 0), self.n_ctx)
        return None

    # --- a step ------------------------------------------------------------------------------------

    async def step(
        self,
        messages: list[dict[str, Any]],
        tools: dict[str, dict[str, Any]],
        *,
        max_tokens: int,
        cancel: threading.Event,
    ) -> ModelStep:
        if max_tokens <= 0:
            return ModelStep("length")
        wire = openai_messages(messages)
        body: dict[str, Any] = {
            "messages": wire,
            "tools": openai_tools(tools),
            "tool_choice": "auto",
            "temperature": 0,
            "seed": self.seed,
            "max_tokens": max_tokens,
            "stream": self.stream,
        }
        if self.model is not None:
            body = {"model": self.model, **body}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        reading = _Reading()
        started = time.perf_counter()
        exchange = asyncio.ensure_future(self._exchange(body, reading))
        while not exchange.done():  # a cancel aborts the request wherever it is: the connection closes
            await asyncio.wait({exchange}, timeout=_CANCEL_POLL_S)
            if cancel.is_set() and not exchange.done():
                exchange.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exchange
                return _timed(ModelStep("cancelled", completion_tokens=reading.chunks), reading, started)
        exchange.result()  # a StepError, raised
        if cancel.is_set():
            return _timed(ModelStep("cancelled", completion_tokens=reading.chunks), reading, started)
        step = _step_of(reading, tools, max_tokens)
        usage = reading.usage or {}
        step.prompt_tokens = _count(usage.get("prompt_tokens")) or _estimate(wire)
        step.completion_tokens = _count(usage.get("completion_tokens")) or reading.chunks
        if step.kind in ("tool", "message", "invalid") and step.completion_tokens > max_tokens:
            step.kind = "length"  # the server ignored max_tokens: the budget is spent all the same
        step = _timed(step, reading, started)
        if self._trace is not None:
            self._write_trace(body, reading, step, time.perf_counter() - started)
        return step

    def _write_trace(self, body: dict[str, Any], reading: _Reading, step: ModelStep, seconds: float) -> None:
        call = reading.calls[min(reading.calls)] if reading.calls else None
        record = {
            "body": body,
            "finish": reading.finish,
            "text": "".join(reading.text),
            "tool": call["name"] if call else None,
            "arguments": "".join(call["arguments"]) if call else None,
            "usage": reading.usage,
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
            "seconds": seconds,
            "ttft_s": step.ttft_s,
            "decode_s": step.decode_s,
        }
        assert self._trace is not None
        self._trace.write(json.dumps(record) + "\n")
        self._trace.flush()

    async def _exchange(self, body: dict[str, Any], reading: _Reading) -> None:
        """One request, read into `reading`; raises StepError with the cause."""
        url = f"{self.base_url}/chat/completions"
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        try:
            async with self._client.stream("POST", url, json=body) as answer:
                if answer.status_code // 100 != 2:
                    shown = (await _head(answer)).decode("utf-8", "replace")
                    raise StepError(f"HTTP {answer.status_code} from POST {url}: {shown}",
                                    {"url": url, "status": answer.status_code, "body": shown})  # fmt: skip
                if "text/event-stream" in answer.headers.get("content-type", ""):
                    await self._read_stream(answer, reading, url)
                else:
                    raw = await answer.aread()
                    try:
                        _read_body(raw, reading, url)
                    except (TypeError, ValueError, AttributeError) as exc:
                        shown = raw[:_SHOWN].decode("utf-8", "replace")
                        raise StepError(f"malformed answer from {url} ({exc}): {shown!r}",
                                        {"url": url, "body": shown}) from None  # fmt: skip
                    reading.first = reading.last = time.perf_counter()
        except httpx.ConnectError as exc:
            refused = _refused(exc)
            why = (f"connection refused to {url}" if refused else f"cannot connect to {url}: {exc}") + (
                " (is the server up? inside the kernel's sandbox a network rule must allow its host)"
            )
            raise StepError(why, {"url": url, "error": str(exc)}) from None
        except httpx.ConnectTimeout:
            raise StepError(f"no connection to {url} within {self.timeout.connect:g} s", {"url": url}) from None
        except httpx.ReadTimeout:
            raise StepError(f"no data from {url} for {self.timeout.read:g} s "
                            f"(after {reading.events} events)", {"url": url}) from None  # fmt: skip
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise StepError(f"the answer from {url} broke off after {reading.events} events ({exc})" + self._hint(),
                            {"url": url, "error": str(exc)}) from None  # fmt: skip
        except (httpx.HTTPError, OSError) as exc:
            raise StepError(f"{url}: {type(exc).__name__}: {exc}", {"url": url}) from None

    async def _read_stream(self, answer: httpx.Response, reading: _Reading, url: str) -> None:
        """Server-sent events until `[DONE]` or the stream's end; a finish must have come by then."""
        async for line in answer.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank lines end events; `:` comments (pings), `event:`, `id:`, `retry:` say nothing here
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            reading.events += 1
            try:
                chunk = json.loads(data)
            except ValueError:
                raise StepError(f"malformed event from {url} (its data is not JSON): {data[:_SHOWN]!r}",
                                {"url": url, "event": data[:_SHOWN]}) from None  # fmt: skip
            try:
                if not isinstance(chunk, dict):
                    raise TypeError("not an object")
                _read_chunk(chunk, reading, url)
            except (TypeError, ValueError, AttributeError) as exc:
                raise StepError(f"malformed event from {url} ({exc}): {data[:_SHOWN]!r}",
                                {"url": url, "event": data[:_SHOWN]}) from None  # fmt: skip
        if reading.finish is None:
            raise StepError(f"the stream from {url} ended without a finish_reason after {reading.events} events"
                            + self._hint(), {"url": url, "events": reading.events})  # fmt: skip

    def _hint(self) -> str:
        return f"; {_NO_STREAM_HINT}" if self.stream else ""


def _read_chunk(chunk: dict[str, Any], reading: _Reading, url: str) -> None:
    if chunk.get("error"):
        raise StepError(f"the server reported an error mid-stream: {json.dumps(chunk['error'])[:_SHOWN]}",
                        {"url": url, "error": chunk["error"]})  # fmt: skip
    if isinstance(chunk.get("usage"), dict):
        reading.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        carried = False
        if delta.get("content"):
            reading.text.append(str(delta["content"]))
            carried = True
        for fragment in delta.get("tool_calls") or []:
            call = reading.calls.setdefault(int(fragment.get("index", 0)), {"id": None, "name": "", "arguments": []})
            call["id"] = fragment.get("id") or call["id"]
            function = fragment.get("function") or {}
            call["name"] += function.get("name") or ""
            if function.get("arguments"):
                call["arguments"].append(str(function["arguments"]))
            carried = True
        if carried:
            now = time.perf_counter()
            reading.first = reading.first or now
            reading.last = now
            reading.chunks += 1
        reading.finish = choice.get("finish_reason") or reading.finish


def _read_body(raw: bytes, reading: _Reading, url: str) -> None:
    """A whole chat completion in one JSON body."""
    try:
        answer = json.loads(raw)
    except ValueError:
        shown = raw[:_SHOWN].decode("utf-8", "replace")
        raise StepError(f"the answer from {url} is not JSON: {shown!r}", {"url": url, "body": shown}) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list) or not answer["choices"]:
        if isinstance(answer, dict) and answer.get("error"):
            raise StepError(f"the server reported an error: {json.dumps(answer['error'])[:_SHOWN]}", {"url": url})
        shown = raw[:_SHOWN].decode("utf-8", "replace")
        raise StepError(f"the answer from {url} has no choices: {shown!r}", {"url": url, "body": shown})
    reading.events = 1
    choice = answer["choices"][0]
    message = choice.get("message") or {}
    if message.get("content"):
        reading.text.append(str(message["content"]))
    calls = message.get("tool_calls") or []
    if not calls and isinstance(message.get("function_call"), dict):  # the legacy form
        calls = [{"function": message["function_call"]}]
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments) if arguments is not None else ""
        reading.calls[index] = {"id": call.get("id"), "name": function.get("name") or "", "arguments": [arguments]}
    reading.finish = choice.get("finish_reason") or "stop"
    if isinstance(answer.get("usage"), dict):
        reading.usage = answer["usage"]


def _step_of(reading: _Reading, tools: dict[str, dict[str, Any]], max_tokens: int) -> ModelStep:
    """The step an answer makes: its first tool call, else its message."""
    text = "".join(reading.text)
    if reading.finish == "length":
        return ModelStep("length", text=text)
    if not reading.calls:
        return ModelStep("message", text=text)
    call = reading.calls[min(reading.calls)]
    raw = "".join(call["arguments"])
    step = ModelStep("tool", tool=call["name"], raw_arguments=raw, text=text, call_id=call["id"])
    if call["name"] not in tools:
        step.kind, step.why_invalid = "invalid", f"There is no tool named {call['name']!r}."
        return step
    try:  # as the local backend parses: raw control characters are allowed inside strings
        arguments = json.loads(raw or "{}", strict=False)
    except ValueError:
        step.kind = "invalid"
        return step
    why = _not_fitting(arguments, tools[call["name"]]["parameters"])
    if why is not None:
        step.kind, step.why_invalid = "invalid", why
        return step
    step.arguments = arguments
    return step


_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float),
                                              "boolean": bool, "object": dict, "array": list}  # fmt: skip


def _not_fitting(arguments: Any, schema: dict[str, Any]) -> str | None:
    """Why arguments do not fit the tool's schema (its required keys, their JSON types), or None: what the
    local backend's grammar guarantees, checked where a server's model may have written anything."""
    if not isinstance(arguments, dict):
        return "Those arguments are not a JSON object."
    missing = [key for key in schema.get("required") or [] if key not in arguments]
    if missing:
        return f"Those arguments lack {', '.join(missing)}."
    for key, spec in (schema.get("properties") or {}).items():
        expected = _TYPES.get(str(spec.get("type"))) if isinstance(spec, dict) else None
        if key in arguments and expected is not None and not isinstance(arguments[key], expected):
            return f"The argument {key} must be a {spec['type']}."
    return None


def _timed(step: ModelStep, reading: _Reading, started: float) -> ModelStep:
    if reading.first is not None and reading.last is not None:
        step.ttft_s = reading.first - started
        step.decode_s = reading.last - reading.first
    return step


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _estimate(wire: list[dict[str, Any]]) -> int:
    """Prompt tokens when the server reports no usage: about four characters a token."""
    return max(1, len(json.dumps(wire)) // 4)


async def _head(answer: httpx.Response) -> bytes:
    """The first bytes of a body, never waiting for the rest."""
    got = b""
    async for piece in answer.aiter_bytes():
        got += piece
        if len(got) >= _SHOWN:
            break
    return got[:_SHOWN]


def _refused(exc: BaseException) -> bool:
    """Whether a connect error is ECONNREFUSED somewhere in its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == errno.ECONNREFUSED:
            return True
        if "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False
