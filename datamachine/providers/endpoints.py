"""Named endpoints: more providers from settings alone (the ``providers`` setting).

One host often talks to several servers: OpenAI for one agent, a local llama.cpp for another,
Anthropic for a third. The setting ``providers`` maps a provider name to an endpoint::

    {"local": {"type": "openai", "base_url": "http://127.0.0.1:8080/v1",
               "model_options": {"temperature": 0.2}, "context_window": 8192},
     "claude": {"type": "anthropic", "api_key_env": "ANTHROPIC_API_KEY"}}

Each entry becomes a provider of that name, made by the registered provider whose name is the
entry's ``type`` (``openai`` is built in; ``anthropic`` comes with the ``datamachine-anthropic``
plugin) through its ``for_endpoint(...)`` method; a plugin provider that has one is an endpoint
type too. The entry is checked when the setting is written and again when a run asks for the
name (an environment variable is not checked when it is set); each endpoint's provider, and so
its connection pool, lives as long as its entry is unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents_api.errors import brief_repr
from datamachine.errors import UsageError, first_field_error
from datamachine.providers.options import validate_model_options

__all__ = ["PROVIDERS_SETTING", "Endpoint", "parse_endpoints"]

PROVIDERS_SETTING = "providers"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Endpoint(BaseModel):
    """One entry of the ``providers`` setting."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    type: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    model_options: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    # The model's context window in tokens, or "auto": ask the server (llama.cpp's /props).
    context_window: int | Literal["auto"] | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value.strip()):
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8080/v1")
        return value.strip() if value is not None else None

    @field_validator("context_window")
    @classmethod
    def _window(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int):
            from datamachine.context.window import check_window

            try:
                check_window(value, "context_window")
            except UsageError as exc:
                raise ValueError(str(exc).removeprefix("context_window ")) from None
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_RE.fullmatch(value):
            raise ValueError("must be the name of an environment variable, such as "
                             "OPENAI_API_KEY (the key itself never goes into settings)")
        return value

    @field_validator("model_options")
    @classmethod
    def _options(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            return validate_model_options(value, "model_options")
        except UsageError as exc:
            raise ValueError(str(exc)) from None


def parse_endpoints(value: Any, where: str = "setting 'providers'") -> dict[str, Endpoint]:
    """The endpoints of a ``providers`` setting value, or a UsageError naming the entry and
    the field."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must map provider names to endpoints, e.g. "
                         '{"local": {"type": "openai", "base_url": "http://127.0.0.1:8080/v1"}}; '
                         f"got {type(value).__name__}.")
    endpoints: dict[str, Endpoint] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise UsageError(f"{where}: {brief_repr(name)} is not a provider name (letters, "
                             "digits, '_', '.', ':' or '-', at most 64 characters).")
        try:
            endpoints[name] = Endpoint.model_validate(raw)
        except ValidationError as exc:
            field, message, _ = first_field_error(exc)
            raise UsageError(f"{where}[{brief_repr(name)}].{field or '(entry)'}: "
                             f"{message}.") from None
    return endpoints
