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
* model options: ``max_tokens`` (required by the API; default ``DEFAULT_MAX_TOKENS``, 4096),
  ``stop`` → ``stop_sequences``, ``tool_choice``
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

import json
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from agents_api.jsontext import compact_bytes
from datamachine import ProviderRequest, ProviderResponse, hookimpl
from datamachine.errors import ProviderError, UsageError
from datamachine.providers.retry import RetryPolicy

if TYPE_CHECKING:
    import httpx

    from datamachine.providers.http import Outbound, ProviderHTTP, Sleep
    from datamachine_anthropic.wire import DEFAULT_MAX_TOKENS, build_messages_body, parse_message

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_BASE_URL", "DEFAULT_MAX_TOKENS", "AnthropicProvider",
           "build_messages_body", "parse_message", "register_providers"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
API_KEY_ENV = "ANTHROPIC_API_KEY"
BASE_URL_ENV = "ANTHROPIC_BASE_URL"

def _bad_request(provider: str, message: str) -> ProviderError:
    return ProviderError(message, code="provider_bad_request", provider=provider)


# -- the provider ----------------------------------------------------------------------------

class AnthropicProvider:
    """A provider for Anthropic's Messages API (and servers that copy it).

    Arguments as :class:`datamachine.providers.openai.OpenAIProvider`'s: ``base_url`` /
    ``api_key`` (else ``ANTHROPIC_BASE_URL`` / the ``api_key_env`` variable), endpoint
    ``model_options`` and ``headers``, the retry policy, and injectable ``sleep`` / ``jitter``.
    """

    answers_normalized = True

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, *,
        name: str = "anthropic", api_key_env: str = API_KEY_ENV,
        model_options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None, max_retries: int | None = None,
        backoff_base: float = 0.5, backoff_max: float = 20.0, max_retry_wait: float = 60.0,
        sleep: Sleep | None = None, jitter: Callable[[], float] | None = None,
        environ: Mapping[str, str] | None = None,
        settings_lookup: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url
        self.api_key = api_key
        self.api_key_env = api_key_env
        self.model_options = dict(model_options or {})
        self.headers = dict(headers or {})
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max, max_retry_wait)
        self.sleep = sleep
        self.jitter = jitter
        self._environ = environ
        self._settings_lookup = settings_lookup
        self._http: ProviderHTTP | None = None

    def for_endpoint(
        self, *, name: str, base_url: str | None = None, api_key_env: str | None = None,
        model_options: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
    ) -> AnthropicProvider:
        """A provider named ``name`` for one entry of the ``providers`` setting."""
        return AnthropicProvider(
            base_url, None, name=name, api_key_env=api_key_env or self.api_key_env,
            model_options=model_options, headers=headers, max_retries=self.retry.max_retries,
            backoff_base=self.retry.backoff_base, backoff_max=self.retry.backoff_max,
            max_retry_wait=self.retry.max_retry_wait, sleep=self.sleep, jitter=self.jitter,
            environ=self._environ, settings_lookup=self._settings_lookup)

    def bind_settings(self, lookup: Callable[[str], Any]) -> None:
        """Read host settings (``provider_max_retries``) through ``lookup``."""
        self._settings_lookup = lookup
        if self._http is not None:
            self._http.settings_lookup = lookup

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def resolved_base_url(self) -> str:
        """The base URL this provider would call now (argument, environment, default)."""
        if self.base_url:
            return self.base_url.strip()
        return self._env().get(BASE_URL_ENV, "").strip() or DEFAULT_BASE_URL

    def resolved_api_key(self) -> str | None:
        """The API key this provider would send now."""
        if self.api_key:
            return self.api_key
        return self._env().get(self.api_key_env, "").strip() or None

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

    def http(self) -> ProviderHTTP:
        """This provider's connection pools and retry loop (made on first use)."""
        if self._http is None:
            from datamachine.providers.http import ProviderHTTP

            self._http = ProviderHTTP(
                self.name, retry=self.retry, sleep=self.sleep, jitter=self.jitter,
                settings_lookup=self._settings_lookup,
                hints={401: f" Check {self.api_key_env}.",
                       404: f" Check the base URL ({BASE_URL_ENV}) and the model id.",
                       529: " Anthropic is overloaded; try again later."})
        return self._http

    def close(self) -> None:
        """Close this provider's connection pools (``host.close()`` calls it)."""
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        """:meth:`close` from inside an event loop."""
        if self._http is not None:
            await self._http.aclose()

    def complete_sync(self, request: ProviderRequest) -> ProviderResponse:
        """:meth:`complete` outside an event loop."""
        answer = self.complete(request)
        if isinstance(answer, ProviderResponse):
            return answer
        close = getattr(answer, "close", None)
        if close is not None:
            close()
        raise UsageError("complete_sync() cannot run inside an event loop; await complete().")

    def complete(
        self, request: ProviderRequest
    ) -> ProviderResponse | Awaitable[ProviderResponse]:
        """Send one Messages request; the answer at once in a synchronous run, an awaitable
        inside a running event loop."""
        response = self.http().post(self._outbound(request))
        if isinstance(response, Awaitable):
            return self._parse_later(response, request.turn)
        return self._parse(response, request.turn)

    async def _parse_later(self, pending: Awaitable[httpx.Response],
                           turn: int) -> ProviderResponse:
        return self._parse(await pending, turn)

    def _outbound(self, request: ProviderRequest) -> Outbound:
        from datamachine import __version__
        from datamachine.providers.http import Outbound
        from datamachine_anthropic.wire import build_messages_body

        available = self.availability()
        if available is not True:
            raise ProviderError(available, code="provider_unavailable", provider=self.name)
        if not request.model.strip():
            raise _bad_request(self.name, f"The {self.name} provider needs a model id (for "
                                          "example 'claude-sonnet-4-6').")
        body = build_messages_body(request, provider=self.name, defaults=self.model_options)
        try:
            content = compact_bytes(body)
        except (TypeError, ValueError) as exc:
            raise _bad_request(self.name, f"The request for the {self.name} provider is not "
                                          f"JSON-serializable: {exc}.") from None
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": f"datamachine/{__version__}",
                   "anthropic-version": ANTHROPIC_VERSION,
                   "x-api-key": self.resolved_api_key() or ""}
        headers.update(self.headers)
        return Outbound(self.resolved_base_url().rstrip("/") + "/v1/messages", content, headers,
                        request.request_timeout, request.connect_timeout)

    def _parse(self, response: httpx.Response, turn: int) -> ProviderResponse:
        from datamachine_anthropic.wire import parse_message

        try:
            data = json.loads(response.content)
        except ValueError:
            raise ProviderError(
                f"The {self.name} provider answered HTTP {response.status_code} with a body "
                f"that is not JSON: {response.text[:300]!r}",
                code="provider_bad_response", provider=self.name) from None
        return parse_message(data, provider=self.name, turn=turn)


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
