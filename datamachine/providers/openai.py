"""The ``openai`` provider: the OpenAI-compatible Chat Completions protocol, to any base URL.

One provider covers OpenAI itself and the local servers that copy its protocol (Ollama's
``/v1``, vLLM, llama.cpp's ``llama-server``, LM Studio): ``POST {base_url}/chat/completions``.
Named endpoints (the ``providers`` setting, :mod:`datamachine.providers.endpoints`) are more
instances of this class under other names.

Request. ``ProviderRequest.messages`` must use the shapes documented in
:mod:`datamachine.providers.chat_messages` (build them from a transcript with
``to_chat_messages``). In short, an assistant turn that called tools is
``{"role": "assistant", "content": "...", "tool_calls": [{"id": "c1", "name": "search",
"parameters": {"q": "x"}}]}`` and a tool result is ``{"role": "tool", "tool_call_id": "c1",
"content": "..."}``. On the wire each call becomes ``{"id", "type": "function", "function":
{"name", "arguments": "<JSON text>"}}`` (``content`` is never null: strict servers refuse it)
and each tool ``{"name", "description", "parameters"}`` becomes ``{"type": "function",
"function": {...}}``. Other message keys are dropped, because strict servers reject unknown
fields. Model options: the provider's own ``model_options`` (an endpoint's defaults), under
``ProviderRequest.options``; tool options only go out with tools.

Configuration, read at call time so a key exported after boot still works: ``base_url`` and
``api_key`` constructor arguments win; else the environment (``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``, or the variable an endpoint names in ``api_key_env``); else the host setting
``openai_base_url`` (through :meth:`bind_settings`, which ``ProviderRegistry.bind_settings``
calls); else ``https://api.openai.com/v1``. The provider is unavailable, with a reason naming
the key's variable, when there is no key and the base URL is OpenAI's own; local servers need
no key.

Transport: :class:`~datamachine.providers.http.ProviderHTTP`, one connection pool per provider
per host, retries with ``Retry-After`` / ``retry-after-ms`` up to ``provider_max_retries``.
:meth:`OpenAIProvider.complete` answers directly in a synchronous run and with an awaitable
inside an event loop. Every failure is a :class:`~datamachine.errors.ProviderError` whose
``code`` is ``provider_http_error`` (with ``status``), ``provider_timeout``,
``provider_connection_error``, ``provider_bad_response``, ``provider_bad_request`` or
``provider_unavailable``, and whose message says what to fix.

Response. ``choices[0].message.content``, ``tool_calls[].function.{name, arguments}``
(arguments that are not a JSON object are kept as text: the tool executor answers the call with
``invalid_arguments``), ``usage`` and ``finish_reason``; then
:func:`~datamachine.providers.normalize.normalize_response`. ``raw`` keeps the decoded body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.options import OPENAI_OPTIONS
from datamachine.providers.wire_provider import WireProvider

if TYPE_CHECKING:
    import httpx

    from datamachine.providers.http import Outbound, parse_retry_after
    from datamachine.providers.openai_wire import (
        ChatStreamAssembler,
        build_chat_body,
        parse_chat_completion,
    )

__all__ = [
    "DEFAULT_BASE_URL",
    "OpenAIProvider",
    "build_chat_body",
    "parse_chat_completion",
    "parse_retry_after",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
API_KEY_ENV = "OPENAI_API_KEY"
BASE_URL_ENV = "OPENAI_BASE_URL"
BASE_URL_SETTING = "openai_base_url"


# -- the provider ----------------------------------------------------------------------------

class OpenAIProvider(WireProvider):
    """A provider for any OpenAI-compatible Chat Completions server.

    Arguments as :class:`~datamachine.providers.wire_provider.WireProvider`'s; the key's
    variable defaults to ``OPENAI_API_KEY``; the host setting ``openai_base_url`` is read
    through ``bind_settings``.
    """

    API_KEY_ENV = API_KEY_ENV
    DEFAULT_NAME = "openai"
    declared_options = OPENAI_OPTIONS

    def resolved_base_url(self) -> str:
        """The base URL this provider would call now (argument, env, setting, default)."""
        if self.base_url:
            return self.base_url.strip()
        from_env = self._env().get(BASE_URL_ENV, "").strip()
        if from_env:
            return from_env
        if self._settings_lookup is not None:
            setting = self._settings_lookup(BASE_URL_SETTING)
            if isinstance(setting, str) and setting.strip():
                return setting.strip()
        return DEFAULT_BASE_URL

    def availability(self) -> Literal[True] | str:
        """True, or the reason this provider cannot be used as configured."""
        return self._availability(self.resolved_base_url())

    def _availability(self, base_url: str) -> Literal[True] | str:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return (f"The {self.name} provider's base URL {base_url!r} is not an http(s) URL; "
                    f"set {BASE_URL_SETTING} or {BASE_URL_ENV} to e.g. "
                    "http://127.0.0.1:11434/v1.")
        if self.resolved_api_key() is None and parts.hostname == "api.openai.com":
            return (f"The {self.name} provider needs an API key for {base_url}: set "
                    f"{self.api_key_env}, or point {BASE_URL_SETTING} / {BASE_URL_ENV} at a "
                    "local OpenAI-compatible server (Ollama, vLLM, llama.cpp), which needs none.")
        return True

    def reported_context_window(self, model: str) -> int | None:
        """The context window the server reports: llama.cpp's ``GET /props``
        (``default_generation_settings.n_ctx``, or ``n_ctx``), asked once per server; None
        from any other server. Asked only for an endpoint whose ``context_window`` is
        ``"auto"``."""
        base = self.resolved_base_url().rstrip("/")
        root = base[:-3] if base.endswith("/v1") else base
        key = self.resolved_api_key()
        props = self.http().probe_json(root + "/props",
                                       {"Authorization": f"Bearer {key}"} if key else {},
                                       timeout=10.0)
        if not isinstance(props, dict):
            return None
        settings = props.get("default_generation_settings")
        for found in ((settings or {}).get("n_ctx") if isinstance(settings, dict) else None,
                      props.get("n_ctx")):
            if isinstance(found, int) and not isinstance(found, bool) and found > 0:
                return found
        return None

    def hints(self) -> dict[int, str]:
        """What to check, per HTTP status."""
        return {
            401: f" Check {self.api_key_env}.",
            403: f" Check that {self.api_key_env} may use this model.",
            404: f" Check the base URL ({BASE_URL_SETTING} / {BASE_URL_ENV}) and the model id.",
        }

    # -- the wire format ---------------------------------------------------------------------
    def outbound(self, request: ProviderRequest, *, stream: bool = False) -> Outbound:
        """The ``POST {base_url}/chat/completions`` for ``request`` (``stream``: asking for
        Server-Sent Events)."""
        from datamachine.providers.http import Outbound
        from datamachine.providers.openai_wire import build_chat_body

        base_url = self.resolved_base_url()  # read once per request: a setting lookup
        self.require(self._availability(base_url), request, "'gpt-4o-mini' or 'llama3.2'")
        content = self.encode(build_chat_body(request, provider=self.name,
                                              defaults=self.model_options, stream=stream))
        key = self.resolved_api_key()
        headers = self.json_headers({"Authorization": f"Bearer {key}"} if key else {})
        return Outbound(base_url.rstrip("/") + "/chat/completions", content, headers,
                        request.request_timeout, request.connect_timeout)

    def stream_assembler(self, request: ProviderRequest) -> ChatStreamAssembler:
        """Chat Completions chunks, put back together (tool-call deltas by index, usage from
        the last chunk, ``[DONE]`` the end)."""
        from datamachine.providers.openai_wire import ChatStreamAssembler

        return ChatStreamAssembler(self.name, request.turn)

    def parse(self, response: httpx.Response, turn: int) -> ProviderResponse:
        """The normalized answer in a Chat Completions response."""
        from datamachine.providers.openai_wire import parse_chat_completion

        return parse_chat_completion(self.decode(response), provider=self.name, turn=turn)


def __getattr__(name: str) -> Any:
    # The wire format and the transport load on first use (asyncio and httpx stay out of boot).
    if name in ("build_chat_body", "parse_chat_completion"):
        from datamachine.providers import openai_wire

        return getattr(openai_wire, name)
    if name == "parse_retry_after":
        from datamachine.providers import http

        return http.parse_retry_after
    raise AttributeError(f"module 'datamachine.providers.openai' has no attribute {name!r}")
