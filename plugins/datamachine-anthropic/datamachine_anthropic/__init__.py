"""datamachine-anthropic: the ``anthropic`` provider (Anthropic's Messages API).

Installing the plugin registers provider ``anthropic``: ``POST {base_url}/v1/messages`` with the
``x-api-key`` and ``anthropic-version`` headers, over datamachine's own transport (one pooled
connection per provider per host, retries on 429, 5xx and 529 "overloaded" honouring
``retry-after-ms`` / ``Retry-After`` up to ``provider_max_retries``). It reads
``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` (default ``https://api.anthropic.com``) at call
time, and is an endpoint type of the ``providers`` setting (``{"type": "anthropic", ...}``).

The translation, both ways, so a run behaves as it does on ``openai`` (budgets, pressure
notices, the tool-less final summary, bad arguments):

* system messages become the request's ``system`` text (in order); an assistant turn's tool
  calls become ``tool_use`` blocks after its text; tool results become ``tool_result`` blocks of
  a user message (consecutive results of one turn share it); messages of one role in a row are
  merged, as the API wants turns to alternate;
* tools become ``{"name", "description", "input_schema"}``;
* model options (declared in ``AnthropicProvider.declared_options``): ``max_tokens``
  (required by the API; default ``DEFAULT_MAX_TOKENS``, 4096), ``stop`` → ``stop_sequences``,
  ``tool_choice``
  (``"auto"``, ``"required"`` → ``any``, ``"none"``, or ``{"type": "function", "function":
  {"name"}}`` → ``{"type": "tool", "name"}``; Anthropic's own form passes as is),
  ``parallel_tool_calls=False`` → ``disable_parallel_tool_use``. ``seed``, ``response_format``
  and the OpenAI penalties have no Messages equivalent and are not sent; other keys
  (``temperature``, ``top_k``, ``thinking``, ``metadata``...) pass through as given (the
  current official request type has no sampling fields; older models and compatible servers
  take them);
* the answer: text blocks joined, ``tool_use`` blocks as calls (an ``input`` that is not an
  object is kept as text, so the call gets an ``invalid_arguments`` result), ``stop_reason``
  (``end_turn`` / ``stop_sequence`` → ``stop``, ``max_tokens`` → ``length``, ``tool_use`` →
  ``tool_calls``, ``refusal`` → ``content_filter``), usage as ``prompt_tokens`` /
  ``completion_tokens`` / ``total_tokens`` (cache counters kept).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from datamachine import ProviderRequest, ProviderResponse, hookimpl
from datamachine.providers.wire_provider import WireProvider

if TYPE_CHECKING:
    import httpx

    from datamachine.providers.http import Outbound
    from datamachine_anthropic.wire import (
        DEFAULT_MAX_TOKENS,
        MessagesStreamAssembler,
        build_messages_body,
        parse_message,
    )

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_BASE_URL", "DEFAULT_MAX_TOKENS", "AnthropicProvider",
           "build_messages_body", "parse_message", "register_providers"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
# Anthropic's words for a prompt longer than the model's window (see context_overflow).
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens? > (\d+)")
_OVER_LIMIT = re.compile(r"input length and `?max_tokens`? exceed context limit: (\d+) \+ "
                         r"\d+ > (\d+)")
ANTHROPIC_VERSION = "2023-06-01"
API_KEY_ENV = "ANTHROPIC_API_KEY"
BASE_URL_ENV = "ANTHROPIC_BASE_URL"

# -- the provider ----------------------------------------------------------------------------

class AnthropicProvider(WireProvider):
    """A provider for Anthropic's Messages API (and servers that copy it).

    Arguments as :class:`datamachine.providers.wire_provider.WireProvider`'s; the base URL is
    the ``base_url`` argument, else ``ANTHROPIC_BASE_URL``, else the public API; the key's
    variable defaults to ``ANTHROPIC_API_KEY``.
    """

    API_KEY_ENV = API_KEY_ENV
    DEFAULT_NAME = "anthropic"
    # The Messages API's own fields, and the OpenAI names translated to them (``stop``,
    # ``parallel_tool_calls``); ``seed`` and ``response_format`` have no equivalent and are not
    # declared, so ``-o seed 1`` is refused instead of silently dropped.
    declared_options = frozenset({
        "max_tokens", "temperature", "top_p", "top_k", "stop", "stop_sequences",
        "tool_choice", "parallel_tool_calls", "thinking", "metadata", "service_tier"})

    def resolved_base_url(self) -> str:
        """The base URL this provider would call now (argument, environment, default)."""
        if self.base_url:
            return self.base_url.strip()
        return self._env().get(BASE_URL_ENV, "").strip() or DEFAULT_BASE_URL

    def availability(self) -> Literal[True] | str:
        """True, or the reason this provider cannot be used as configured."""
        base_url = self.resolved_base_url()
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return (f"The {self.name} provider's base URL {base_url!r} is not an http(s) URL; "
                    f"set {BASE_URL_ENV}.")
        if self.resolved_api_key() is None:
            return f"The {self.name} provider needs an API key: set {self.api_key_env}."
        return True

    def hints(self) -> dict[int, str]:
        """What to check, per HTTP status."""
        return {401: f" Check {self.api_key_env}.",
                404: f" Check the base URL ({BASE_URL_ENV}) and the model id.",
                529: " Anthropic is overloaded; try again later."}

    def context_overflow(self, status: int, body: Any, detail: str
                         ) -> tuple[int | None, int | None] | None:
        """Anthropic's "prompt is too long: 208437 tokens > 200000 maximum" (and "input length
        and `max_tokens` exceed context limit: 188240 + 21333 > 200000"), a 400
        ``invalid_request_error``: ``(window, prompt tokens)``."""
        if status not in (400, 413):
            return None
        text = detail.lower()
        found = _TOO_LONG.search(text) or _OVER_LIMIT.search(text)
        if found is None:
            return None
        return int(found.group(2)), int(found.group(1))

    def outbound(self, request: ProviderRequest, *, stream: bool = False) -> Outbound:
        """The ``POST {base_url}/v1/messages`` for ``request`` (``stream``: as events)."""
        from datamachine.providers.http import Outbound
        from datamachine_anthropic.wire import build_messages_body

        self.require(self.availability(), request, "'claude-sonnet-4-6'")
        content = self.encode(build_messages_body(request, provider=self.name,
                                                  defaults=self.model_options, stream=stream))
        headers = self.json_headers({"anthropic-version": ANTHROPIC_VERSION,
                                     "x-api-key": self.resolved_api_key() or ""})
        return Outbound(self.resolved_base_url().rstrip("/") + "/v1/messages", content, headers,
                        request.request_timeout, request.connect_timeout)

    def stream_assembler(self, request: ProviderRequest) -> MessagesStreamAssembler:
        """Messages events, put back together (``tool_use`` input from its JSON fragments,
        ``message_stop`` the end)."""
        from datamachine_anthropic.wire import MessagesStreamAssembler

        return MessagesStreamAssembler(self.name, request.turn)

    def parse(self, response: httpx.Response, turn: int) -> ProviderResponse:
        """The normalized answer in a Messages response."""
        from datamachine_anthropic.wire import parse_message

        return parse_message(self.decode(response), provider=self.name, turn=turn)


def __getattr__(name: str) -> Any:
    # The wire format loads on first use (see wire.py).
    if name in ("DEFAULT_MAX_TOKENS", "build_messages_body", "parse_message"):
        from datamachine_anthropic import wire

        return getattr(wire, name)
    raise AttributeError(f"module 'datamachine_anthropic' has no attribute {name!r}")


@hookimpl
def register_providers() -> list[Any]:
    """The ``anthropic`` provider."""
    return [AnthropicProvider()]
