"""The provider protocol: what a model integration receives and returns.

Every provider, built in or from a plugin, and every ``text_result`` hookimpl sees the same
:class:`ProviderRequest` and answers with a :class:`ProviderResponse`, so tests can script a model
with the exact shape production code gets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FailedAttempt", "Provider", "ProviderRequest", "ProviderResponse", "StreamDelta",
           "StreamingProvider"]


class ProviderRequest(BaseModel):
    """One turn's request, in OpenAI chat shape, with runtime objects already removed.

    ``messages`` are ``{"role", "content", ...}`` dicts (budget pressure messages included);
    ``tools`` are ``{"name", "description", "parameters"}`` dicts. Timeouts are resolved through
    the settings and the ``request_timeout`` / ``connect_timeout`` hooks. ``options`` are the
    run's model options (``temperature``, ``max_tokens``, ``tool_choice``...: the setting
    ``model_options`` under the payload's), which a wire provider writes into its request; a
    request without tools carries none of the tool-related ones.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    provider: str
    model: str = ""
    mode: str = "pipeline"
    payload: dict[str, Any] = Field(default_factory=dict)
    turn: int = 1
    request_timeout: float = 300.0
    connect_timeout: float = 15.0
    options: dict[str, Any] = Field(default_factory=dict)


class FailedAttempt(BaseModel):
    """One attempt of a request that failed and was sent again (a provider's retry layer):
    the HTTP ``status`` (None when no answer came: a dropped connection, a stream that ended
    before its first event), what went wrong in ``error``, and the seconds ``waited`` before
    the next attempt. A run keeps them with the request that followed (the run viewer shows
    them); ``ProviderError.failed_attempts`` holds those before a request that failed for
    good."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    status: int | None = None
    error: str = ""
    waited: float = 0.0


class ProviderResponse(BaseModel):
    """What one provider turn produced.

    ``tool_calls`` are ``{"id", "name", "parameters"}`` dicts; ``usage`` uses the OpenAI token
    names (``prompt_tokens``, ``completion_tokens``, ``total_tokens``); ``raw`` keeps the decoded
    wire response for debugging. ``ignored_usage`` is set by ``normalize_response``: the usage
    fields the provider reported that cannot be true (a negative or fractional count, NaN,
    above 10^12), left out of ``usage`` as not reported; None when there were none.
    ``failed_attempts``: the attempts of this request that failed and were retried before this
    answer came (see :class:`FailedAttempt`; empty almost always).
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    content: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    finish_reason: str | None = None
    raw: Any = None
    ignored_usage: dict[str, Any] | None = None
    failed_attempts: tuple[FailedAttempt, ...] = ()


@dataclass(slots=True)
class StreamDelta:
    """One piece of a streamed answer: ``text`` as it arrives. The last delta carries
    ``response``, the whole answer (its text, its tool calls assembled from their deltas, usage
    and finish reason), exactly what ``complete`` would have returned."""

    text: str = ""
    response: ProviderResponse | None = None


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that can also stream: ``stream(request)`` is an async iterator of
    :class:`StreamDelta` whose last item carries the whole response."""

    name: str

    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamDelta]:
        """Run one turn, yielding text as it arrives."""


@runtime_checkable
class Provider(Protocol):
    """A model integration: a ``name`` and ``complete(request)`` (sync or async)."""

    name: str

    def complete(
        self, request: ProviderRequest
    ) -> ProviderResponse | Awaitable[ProviderResponse]:
        """Run one turn against the model."""
