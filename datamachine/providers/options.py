"""Model options: sampling and tool-choice parameters a run passes to its provider.

``model_options`` is a payload key and a host setting (the payload's keys win, key by key); the
CLI's ``-o KEY VALUE`` fills it too. The run puts the merged dict on every
``ProviderRequest.options``, and each wire provider writes it into its request body. The
documented keys are type-checked here, once, when a run starts or a setting is written, so a
typo like ``temperature="hot"`` fails at once, naming the key; any other key is passed through to
the provider unchecked (servers have their own extensions: ``top_k``, ``min_p``, ``logit_bias``).

The final summary request offers no tools, and OpenAI refuses ``tool_choice`` without
``tools``: :func:`without_tool_options` drops every tool-related option from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from agents_api.errors import brief_repr
from agents_api.jsontext import unreadable
from datamachine.errors import UsageError, first_field_error

__all__ = ["MODEL_OPTIONS_KEY", "OPENAI_OPTIONS", "RESERVED_KEYS", "TOOL_OPTIONS",
           "ModelOptions", "declared_options", "merge_model_options", "validate_model_options",
           "without_tool_options"]

MODEL_OPTIONS_KEY = "model_options"

# The request's own parts: an option can never replace them.
RESERVED_KEYS = frozenset({"model", "messages", "tools", "stream", "system"})

# Options that only mean something when tools are offered.
TOOL_OPTIONS = frozenset({"tool_choice", "parallel_tool_calls", "disable_parallel_tool_use"})


# The options the OpenAI Chat Completions protocol documents (DESIGN.md 12): what the
# ``openai`` provider, and every endpoint of its type, declares.
OPENAI_OPTIONS = frozenset({"temperature", "top_p", "max_tokens", "seed", "stop", "tool_choice",
                            "parallel_tool_calls", "response_format"})


def declared_options(provider: object) -> frozenset[str] | None:
    """The model options ``provider`` declares (its ``declared_options`` attribute), or None
    when it declares nothing (every option is then passed through unchecked)."""
    found = getattr(provider, "declared_options", None)
    if isinstance(found, frozenset | set | tuple | list):
        return frozenset(str(name) for name in found)
    return None


class ModelOptions(BaseModel):
    """The documented options and their types; other keys pass through as given."""

    model_config = ConfigDict(defer_build=True, extra="allow", strict=True)

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None


def validate_model_options(value: Any, where: str = "payload['model_options']") -> dict[str, Any]:
    """``value`` checked as model options (a dict), or a UsageError naming ``where`` and the key.

    Integers are accepted where a float is documented (``temperature=1``).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must be a dict of option -> value (for example "
                         f"{{'temperature': 0.2}}), got {type(value).__name__}.")
    options = dict(value)
    for key in options:
        if not isinstance(key, str) or not key:
            raise UsageError(f"{where} has the key {brief_repr(key)}; option names are strings.")
        if key in RESERVED_KEYS:
            raise UsageError(f"{where}[{brief_repr(key)}] cannot be set: the run decides the "
                             f"request's {key}. Remove it from the options.")
    for key in ("temperature", "top_p"):
        if type(options.get(key)) is int:
            options[key] = float(options[key])
    try:
        ModelOptions.model_validate(options)
    except ValidationError as exc:
        field, message, given = first_field_error(exc)
        raise UsageError(f"{where}[{field!r}]: {message} (got {brief_repr(given)}).") from None
    # Options go into the request's JSON body: an infinity or a NaN would be sent as text no
    # provider reads (``Infinity``), and stored so in the run's timeline.
    problem = unreadable(options)
    if problem is not None:
        raise UsageError(f"{where}{problem[0]}: {problem[1]}.")
    return options


def merge_model_options(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later layers win key by key (setting, then payload)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer:
            merged.update(layer)
    return merged


def without_tool_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for a request that offers no tools."""
    return {key: value for key, value in options.items() if key not in TOOL_OPTIONS}
