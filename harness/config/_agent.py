"""The agent's part of the run config: its command, its environment and the model server it runs on."""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from ._fields import Strict, Text

__all__ = ["ENDPOINT_VARIABLE", "MODEL_VARIABLE", "AgentConfig", "EndpointConfig"]


#: What the agent finds its model server in (the inference agent reads them; any agent may).
ENDPOINT_VARIABLE, MODEL_VARIABLE = "LOOP_HARNESS_ENDPOINT", "LOOP_HARNESS_MODEL"


class EndpointConfig(Strict):
    """The OpenAI-compatible server the agent's model runs on: the run records which model it served (in
    `run_start`), and the agent is told it in its environment. Under the sandbox the agent reaches it only
    through the kernel's proxy, so a network rule must allow its host."""

    url: str = Field(min_length=1)  # the API base, as OpenAI clients take it: http://127.0.0.1:8080/v1
    model: str = Field(min_length=1)  # the name the server serves the model under
    pin: str | None = None  # an [endpoints.NAME] entry of models.lock the served model must match

    @field_validator("url")
    @classmethod
    def _an_http_base(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: an http:// or https:// base URL with a host (http://127.0.0.1:8080/v1)")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"{url!r}: a base URL has no query, fragment or credentials")
        return url.rstrip("/")


class AgentConfig(Strict):
    command: list[str] = Field(min_length=1)
    # ACP has no capability for this; the operator declares it (required before autonomy activates).
    supports_permission_requests: bool = False
    env: dict[str, Text] = Field(default_factory=dict)
    endpoint: EndpointConfig | None = None

    @model_validator(mode="after")
    def _endpoint_in_the_environment(self) -> AgentConfig:
        # An `env` the operator wrote wins: it is the more specific of the two.
        if self.endpoint is not None:
            told = {ENDPOINT_VARIABLE: self.endpoint.url, MODEL_VARIABLE: self.endpoint.model}
            object.__setattr__(self, "env", {**told, **self.env})
        return self

    @field_validator("command")
    @classmethod
    def _python_is_this_interpreter(cls, command: list[str]) -> list[str]:
        # `python` in a config means the interpreter running loop-harness, so a
        # scripted agent works without activating the virtualenv.
        if command[0] in ("python", "python3"):
            return [sys.executable, *command[1:]]
        return command
