"""The ``openai`` provider: the OpenAI-compatible Chat Completions protocol, to any base URL.

One provider covers OpenAI itself and the local servers that copy its protocol (Ollama's
``/v1``, vLLM, llama.cpp's ``llama-server``, LM Studio): ``POST {base_url}/chat/completions``.

Request. ``ProviderRequest.messages`` must use the shapes documented in
:mod:`datamachine.providers.chat_messages` (build them from a transcript with
``to_chat_messages``). In short, an assistant turn that called tools is
``{"role": "assistant", "content": "...", "tool_calls": [{"id": "c1", "name": "search",
"parameters": {"q": "x"}}]}`` and a tool result is ``{"role": "tool", "tool_call_id": "c1",
"content": "..."}``. On the wire each call becomes ``{"id", "type": "function", "function":
{"name", "arguments": "<JSON text>"}}`` and each tool ``{"name", "description", "parameters"}``
becomes ``{"type": "function", "function": {...}}``. Other message keys are dropped, because
strict servers reject unknown fields.

Configuration, read at call time so a key exported after boot still works: ``base_url`` and
``api_key`` constructor arguments win; else the environment ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``; else the host setting ``openai_base_url`` (through :meth:`bind_settings`,
which ``ProviderRegistry.bind_settings`` calls); else ``https://api.openai.com/v1``. The provider
is unavailable, with a reason naming ``OPENAI_API_KEY``, when there is no key and the base URL
is OpenAI's own; local servers need no key.

Transport. httpx and the wire format (:mod:`datamachine.providers.openai_wire`, whose pydantic
models validate both directions) are imported with the first request, so registering the
provider at boot stays cheap. Each attempt is bounded by ``httpx.Timeout(request_timeout,
connect=connect_timeout)`` and by an overall deadline of ``request_timeout`` (a timeout of 0
means none). HTTP 429 and 5xx are retried up to
``max_attempts`` requests in all, waiting what ``Retry-After`` asks (seconds or an HTTP date),
else an exponential backoff with jitter; nothing else is retried (a 400, 401 or 404 will not get
better, and a timeout already used the whole budget). Every failure is a
:class:`~datamachine.errors.ProviderError` whose ``code`` is ``provider_http_error`` (with
``status``), ``provider_timeout``, ``provider_connection_error``, ``provider_bad_response``,
``provider_bad_request`` or ``provider_unavailable``, and whose message says what to fix.

Response. ``choices[0].message.content``, ``tool_calls[].function.{name, arguments}`` (the
arguments JSON must decode to an object, else the turn fails naming the tool), ``usage`` and
``finish_reason``; then :func:`~datamachine.providers.normalize.normalize_response` (ids, text
tool-call fallback, numeric usage). ``raw`` keeps the decoded body.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from agents_api import clock
from agents_api.jsontext import compact_bytes
from datamachine.errors import ProviderError, UsageError
from datamachine.providers.base import ProviderRequest, ProviderResponse

if TYPE_CHECKING:
    import httpx

    from datamachine.providers.openai_wire import build_chat_body, parse_chat_completion

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

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


# -- shared with the wire format -------------------------------------------------------------

def _bad_request(provider: str, message: str) -> ProviderError:
    return ProviderError(message, code="provider_bad_request", provider=provider)


def _excerpt(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


# -- retries ---------------------------------------------------------------------------------

def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date), else None.

    A date in the past means 0. ``now`` (epoch seconds) defaults to the project clock.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        current = clock.now() if now is None else now
        return max(0.0, when.timestamp() - current)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN / inf
        return None
    return max(0.0, seconds)


def _retryable(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def _error_detail(response: httpx.Response) -> str:
    try:
        data = json.loads(response.content)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return _excerpt(response.text) or "(empty body)"


@functools.cache
def _tls_verify() -> Any:
    """The default TLS context, built once per process.

    Building it costs tens of milliseconds and a client is made per turn (an httpx async client
    is bound to the event loop it ran in), so sharing the context keeps that cost off every turn.
    """
    import httpx

    factory = getattr(httpx, "create_ssl_context", None)
    return factory() if callable(factory) else True


_HINTS = {
    401: f" Check {API_KEY_ENV}.",
    403: f" Check that {API_KEY_ENV} may use this model.",
    404: f" Check the base URL ({BASE_URL_SETTING} / {BASE_URL_ENV}) and the model id.",
}


# -- the provider ----------------------------------------------------------------------------

async def _asyncio_sleep(seconds: float) -> None:
    """``asyncio.sleep``, imported when a retry waits (asyncio stays out of boot)."""
    import asyncio

    await asyncio.sleep(seconds)


class OpenAIProvider:
    """A provider for any OpenAI-compatible Chat Completions server.

    ``sleep`` (an async callable taking seconds) and ``jitter`` (returns a float in [0, 1)) are
    injectable so tests can observe the waits without waiting. ``max_attempts`` counts every
    request of a turn, the first included. A ``Retry-After`` longer than ``max_retry_wait``
    seconds is not waited for: the turn fails at once with the server's answer.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        name: str = "openai",
        max_attempts: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        max_retry_wait: float = 60.0,
        sleep: Sleep | None = None,
        jitter: Callable[[], float] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        settings_lookup: Callable[[str], Any] | None = None,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise UsageError(f"max_attempts must be an integer >= 1, got {max_attempts!r}.")
        if backoff_base < 0 or backoff_max < 0 or max_retry_wait < 0:
            raise UsageError("backoff_base, backoff_max and max_retry_wait must not be negative.")
        self.name = name
        self.base_url = base_url
        self.api_key = api_key
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_wait = max_retry_wait
        self.sleep: Sleep = sleep if sleep is not None else _asyncio_sleep
        self.jitter = jitter if jitter is not None else random.random
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self._environ = environ
        self._settings_lookup = settings_lookup

    # -- configuration -----------------------------------------------------------------------
    def bind_settings(self, lookup: Callable[[str], Any]) -> None:
        """Read the ``openai_base_url`` setting through ``lookup`` (a host's ``settings.get``)."""
        self._settings_lookup = lookup

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

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

    def resolved_api_key(self) -> str | None:
        """The API key this provider would send now (argument, else ``OPENAI_API_KEY``)."""
        if self.api_key:
            return self.api_key
        key = self._env().get(API_KEY_ENV, "").strip()
        return key or None

    def availability(self) -> Literal[True] | str:
        """True, or the reason this provider cannot be used as configured."""
        base_url = self.resolved_base_url()
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return (f"The {self.name} provider's base URL {base_url!r} is not an http(s) URL; "
                    f"set {BASE_URL_SETTING} or {BASE_URL_ENV} to e.g. "
                    "http://127.0.0.1:11434/v1.")
        if self.resolved_api_key() is None and parts.hostname == "api.openai.com":
            return (f"The {self.name} provider needs an API key for {base_url}: set "
                    f"{API_KEY_ENV}, or point {BASE_URL_SETTING} / {BASE_URL_ENV} at a local "
                    "OpenAI-compatible server (Ollama, vLLM, llama.cpp), which needs none.")
        return True

    # -- one turn ----------------------------------------------------------------------------
    def complete_sync(self, request: ProviderRequest) -> ProviderResponse:
        """:meth:`complete` for callers without an event loop (not callable inside one)."""
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.complete(request))
        raise UsageError("complete_sync() cannot run inside an event loop; await complete().")

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """Send one Chat Completions request (retrying 429/5xx) and return the parsed answer."""
        import httpx

        from datamachine.providers.openai_wire import build_chat_body

        available = self.availability()
        if available is not True:
            raise ProviderError(available, code="provider_unavailable", provider=self.name)
        if not request.model.strip():
            raise _bad_request(self.name, f"The {self.name} provider needs a model id (for "
                                          "example 'gpt-4o-mini' or 'llama3.2').")
        url = self.resolved_base_url().rstrip("/") + "/chat/completions"
        body = build_chat_body(request, provider=self.name, extra_body=self.extra_body)
        try:
            content = compact_bytes(body)
        except (TypeError, ValueError) as exc:
            raise _bad_request(self.name, f"The request for the {self.name} provider is not "
                                          f"JSON-serializable: {exc}.") from None
        headers = self._request_headers()
        request_timeout = request.request_timeout if request.request_timeout > 0 else None
        connect_timeout = request.connect_timeout if request.connect_timeout > 0 else None
        timeout = httpx.Timeout(request_timeout, connect=connect_timeout)

        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                     verify=_tls_verify()) as client:
            attempt = 0
            while True:
                attempt += 1
                response = await self._send(client, url, content, headers, request, attempt)
                if 200 <= response.status_code < 300:
                    return self._parse(response, request.turn)
                delay = self._retry_delay(response, attempt)
                if delay is None:
                    raise self._http_error(response, url, attempt)
                logger.info("%s: HTTP %s from %s, retrying in %.2f s (attempt %d of %d)",
                            self.name, response.status_code, url, delay, attempt + 1,
                            self.max_attempts)
                await self.sleep(delay)

    def _request_headers(self) -> dict[str, str]:
        from datamachine import __version__

        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": f"datamachine/{__version__}"}
        key = self.resolved_api_key()
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        headers.update(self.headers)
        return headers

    async def _send(
        self, client: httpx.AsyncClient, url: str, content: bytes, headers: dict[str, str],
        request: ProviderRequest, attempt: int,
    ) -> httpx.Response:
        import asyncio

        import httpx

        deadline = request.request_timeout if request.request_timeout > 0 else None
        try:
            async with asyncio.timeout(deadline):
                return await client.post(url, content=content, headers=headers)
        except httpx.ConnectTimeout:
            raise ProviderError(
                f"The {self.name} provider could not connect to {url} within the connect "
                f"timeout of {request.connect_timeout:g} s. Is the server running? (The "
                "connect_timeout setting or hook raises the limit.)",
                code="provider_timeout", provider=self.name, attempts=attempt) from None
        except (httpx.TimeoutException, TimeoutError):
            raise ProviderError(
                f"The {self.name} provider got no answer from {url} within the request "
                f"timeout of {request.request_timeout:g} s. Raise the request_timeout setting "
                "(or hook) for slow models.",
                code="provider_timeout", provider=self.name, attempts=attempt) from None
        except httpx.HTTPError as exc:
            raise ProviderError(
                f"The {self.name} provider cannot reach {url}: {type(exc).__name__}: {exc}. "
                f"Check the base URL ({BASE_URL_SETTING} / {BASE_URL_ENV}) and that the server "
                "is running.",
                code="provider_connection_error", provider=self.name, attempts=attempt,
            ) from None
        except httpx.InvalidURL as exc:
            raise _bad_request(self.name, f"The {self.name} provider's URL {url!r} is "
                                          f"invalid: {exc}.") from None

    def _retry_delay(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when this answer is final."""
        if not _retryable(response.status_code) or attempt >= self.max_attempts:
            return None
        asked = parse_retry_after(response.headers.get("Retry-After"))
        if asked is not None:
            return asked if asked <= self.max_retry_wait else None
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        return ceiling * (0.5 + 0.5 * self.jitter())  # jitter spreads out synchronized clients

    def _http_error(self, response: httpx.Response, url: str, attempt: int) -> ProviderError:
        status = response.status_code
        if attempt > 1:
            attempts = f"after {attempt} attempts"
        elif _retryable(status) and self.max_attempts == 1:
            attempts = "(max_attempts=1, so not retried)"
        else:
            attempts = "(not retried)"
        if _retryable(status) and attempt < self.max_attempts:
            asked = response.headers.get("Retry-After", "")
            attempts = (f"(the server asked to wait {asked!r}, more than max_retry_wait="
                        f"{self.max_retry_wait:g} s)")
        return ProviderError(
            f"The {self.name} provider answered HTTP {status} from {url} {attempts}: "
            f"{_error_detail(response)}.{_HINTS.get(status, '')}",
            code="provider_http_error", provider=self.name, status=status, attempts=attempt,
        )

    def _parse(self, response: httpx.Response, turn: int) -> ProviderResponse:
        from datamachine.providers.openai_wire import parse_chat_completion

        try:
            data = json.loads(response.content)
        except ValueError:
            raise ProviderError(
                f"The {self.name} provider answered HTTP {response.status_code} with a body "
                f"that is not JSON: {_excerpt(response.text) or '(empty body)'}",
                code="provider_bad_response", provider=self.name) from None
        return parse_chat_completion(data, provider=self.name, turn=turn)


def __getattr__(name: str) -> Any:
    # build_chat_body and parse_chat_completion live in openai_wire, loaded on first use.
    if name in ("build_chat_body", "parse_chat_completion"):
        from datamachine.providers import openai_wire

        return getattr(openai_wire, name)
    raise AttributeError(f"module 'datamachine.providers.openai' has no attribute {name!r}")
