"""The model server a run's agent talks to (`agent.endpoint`): allowed through the sandbox, and described.

The kernel asks the server once, before the run's first record, which models it serves (`GET {url}/models`,
which llama.cpp's server, vLLM and Ollama all answer), so `run_start` says what model the run used and, where
the server reports one, its revision or digest. The kernel itself runs outside the sandbox: this request
never goes through the agent's proxy, and a server that does not answer is recorded, not fatal (the agent
meets it and the run ends with the agent's own cause).
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx

from ..config._config import Config, EndpointConfig
from ..config._exceptions import ConfigError
from ..models import EndpointEntry
from ..policy._network import host_of
from ..policy._policy import Policy

__all__ = ["check_endpoint_allowed", "describe_endpoint", "pin_mismatch"]

#: Enough for a server on this machine or the next rack; a run does not wait on a dead one for long.
PROBE_TIMEOUT_S = 3.0
_KEPT_FIELDS = 12  # of the server's entry for the model: enough to read, never a page of metadata
_KEPT_TEXT = 200  # characters of any one value the server sent: run_start must stay small enough to keep whole


def check_endpoint_allowed(config: Config, policy: Policy) -> None:
    """Under the sandbox the agent reaches its model server only through the kernel's proxy, which lets
    through what the network rules allow: a server they refuse would fail every turn, so say so now."""
    endpoint = config.agent.endpoint
    if endpoint is None or config.sandbox.mode == "off" or policy.interactive:
        return
    try:  # read as the agent's client would read it, or refused where readers disagree: the proxy's own reading
        host = host_of(endpoint.url) or ""
    except ValueError as exc:
        raise ConfigError("agent.endpoint.url", str(exc)) from None
    verdict = policy.judge_host(host)
    if not verdict.allowed:
        why = verdict.reason.get("why") or verdict.reason.get("kind", "refused")
        raise ConfigError(
            "agent.endpoint.url",
            f"the agent reaches {host} only through the sandbox's proxy, and the network rules refuse it "
            f"({why}): add a rule such as {{id: model-server, kind: network, hosts: [{host}], decision: allow}}",
        )


def describe_endpoint(endpoint: EndpointConfig, *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """What `run_start` records of the model server: the url and model, whether the server lists the model,
    its revision (or digest) where the server reports one, and the server's own entry for it."""
    described: dict[str, Any] = {"url": endpoint.url, "model": endpoint.model, "revision": None}
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            answer = client.get(f"{endpoint.url}/models")
        answer.raise_for_status()
        listed = answer.json().get("data")
        if not isinstance(listed, list):
            raise ValueError("no `data` list in the answer")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        described["listed"] = None
        described["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return described
    entry = next((e for e in listed if isinstance(e, dict) and e.get("id") == endpoint.model), None)
    described["listed"] = entry is not None
    if entry is None:
        described["served"] = sorted(_text(e.get("id")) for e in listed if isinstance(e, dict))[:20]
        return described
    revision = entry.get("revision") or entry.get("digest")
    if not revision and endpoint.url.endswith("/v1"):  # Ollama's OpenAI API leaves the digest to its own
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError, TypeError):
            revision = _ollama_digest(endpoint, timeout)
    described["revision"] = _text(revision) if revision else None
    described["entry"] = {_text(k): _kept(v) for k, v in list(entry.items())[:_KEPT_FIELDS]}
    return described


def _text(value: Any) -> str:
    return str(value)[:_KEPT_TEXT]


def _kept(value: Any) -> Any:
    """A value of the server's entry as run_start keeps it: a number or flag as it is, anything else as
    bounded text (a server can answer with any size; a run_start too large to keep whole loses its fields)."""
    return value if isinstance(value, bool | int | float) or value is None else _text(value)


def _ollama_digest(endpoint: EndpointConfig, timeout: float) -> str | None:
    """The manifest digest Ollama's own API lists for the model (`GET /api/tags`), as sha256:<hex>."""
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        answer = client.get(f"{endpoint.url.removesuffix('/v1')}/api/tags")
    answer.raise_for_status()
    for model in answer.json().get("models") or []:
        if endpoint.model in (model.get("name"), model.get("model")) and model.get("digest"):
            digest = str(model["digest"])
            return digest if digest.startswith("sha256:") else f"sha256:{digest}"
    return None


def pin_mismatch(described: dict[str, Any], pinned: EndpointEntry) -> str | None:
    """Why the server's model is not the one `models.lock` pins (None: it is). A pinned revision or digest
    the server does not report cannot be checked, and an unattended run does not take an unchecked model."""
    if described.get("listed") is None:
        return f"the model server did not answer ({described.get('error')}), so the pinned model cannot be checked"
    if pinned.model != described["model"]:
        return (f"agent.endpoint.model is {described['model']!r} but [endpoints.{pinned.name}] pins "
                f"{pinned.model!r}")  # fmt: skip
    if not described["listed"]:
        return f"the server does not serve {pinned.model!r} (it serves {described.get('served')})"
    wanted = [w for w in (pinned.revision, pinned.digest) if w]
    if not wanted:
        return None  # the name alone is pinned
    reported = described.get("revision")
    if reported is None:
        return (f"the server reports no revision or digest for {pinned.model!r}, so the pinned "
                f"{' / '.join(wanted)} cannot be checked")  # fmt: skip
    if not any(_same(reported, w) for w in wanted):
        return f"the server serves {pinned.model!r} at {reported}, not the pinned {' / '.join(wanted)}"
    return None


def _same(reported: str, pinned: str) -> bool:
    return reported.removeprefix("sha256:") == pinned.removeprefix("sha256:")
