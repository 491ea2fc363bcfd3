"""What every provider speaking a JSON-over-HTTP wire format shares: :class:`WireProvider`.

The ``openai`` provider and ``datamachine-anthropic`` differ only in their wire format (the body
sent, the answer parsed, the URL and headers) and their hints. Configuration (an endpoint's
URL, key variable, options and headers), the pooled transport and its retry policy, closing,
the sync-or-async ``complete`` and ``for_endpoint`` live here once, so a plugin for another API
writes only :meth:`WireProvider.outbound` and :meth:`WireProvider.parse`.

This module stays light (no httpx, no asyncio): providers are built at boot, their transport on
the first request.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from datamachine.errors import ProviderError, UsageError
from datamachine.providers.base import (
    FailedAttempt,
    ProviderRequest,
    ProviderResponse,
    StreamDelta,
)
from datamachine.providers.retry import RetryPolicy

if TYPE_CHECKING:
    import httpx

    from datamachine.providers.http import Delivered, Outbound, ProviderHTTP, Sleep

__all__ = ["StreamAssembler", "WireProvider", "bad_request", "stream_broken"]

P = TypeVar("P", bound="WireProvider")


def stream_broken(provider: str, partial: str, why: str) -> ProviderError:
    """A streamed answer that broke (``provider_stream_error``), carrying the text that had
    arrived as ``partial_content``."""
    return ProviderError(
        f"The {provider} provider's stream broke after {len(partial)} characters of text: "
        f"{why}", code="provider_stream_error", provider=provider, partial_content=partial)


def bad_request(provider: str, message: str) -> ProviderError:
    """A request that cannot be sent as asked (``provider_bad_request``): not retried."""
    return ProviderError(message, code="provider_bad_request", provider=provider)


class StreamAssembler(Protocol):
    """Puts one wire format's streamed answer back together (see :meth:`WireProvider.stream`)."""

    @property
    def done(self) -> bool:
        """The stream said it is over: stop reading."""

    @property
    def unfinished(self) -> str | None:
        """Why what arrived is not a whole answer (the stream stopped early), or None."""

    def feed_data(self, data: str) -> str:
        """One event's ``data:``; its text delta (possibly empty). ProviderError for an error
        event; ValueError for data that is not JSON."""

    def broken(self, why: str) -> ProviderError:
        """The error of a stream that broke, with the text that had arrived."""

    def response(self) -> ProviderResponse:
        """The whole answer, parsed like a non-streamed one."""


class WireProvider:
    """Base of the HTTP providers: subclasses set ``API_KEY_ENV`` and implement
    :meth:`outbound`, :meth:`parse` and :meth:`availability` (and may add :meth:`hints`).

    ``base_url`` / ``api_key`` win over the environment; ``api_key_env`` names the key's
    variable; ``model_options`` are sent under each run's own; ``headers`` are added to every
    request. ``max_retries`` (None: the run's ``provider_retries`` budget: its setting
    ``provider_max_retries``, default 3; a run's ``budget_ceilings`` beats a count given here),
    ``backoff_base``, ``backoff_max`` and ``max_retry_wait`` shape retries. ``sleep`` (sync, or
    async for async runs only) and ``jitter`` are injectable so tests observe waits without
    waiting; ``environ`` replaces ``os.environ``.
    """

    API_KEY_ENV = ""
    DEFAULT_NAME = ""
    answers_normalized = True
    # The model options this provider understands (``-o KEY VALUE`` of another key is refused
    # on the command line unless ``--option-passthrough``); None: not declared, anything goes.
    declared_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        name: str | None = None,
        api_key_env: str | None = None,
        model_options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        max_retry_wait: float = 60.0,
        sleep: Sleep | None = None,
        jitter: Callable[[], float] | None = None,
        environ: Mapping[str, str] | None = None,
        settings_lookup: Callable[[str], Any] | None = None,
        http: ProviderHTTP | None = None,
    ) -> None:
        self.name = name or self.DEFAULT_NAME
        self.base_url = base_url
        self.api_key = api_key
        self.api_key_env = api_key_env or self.API_KEY_ENV
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max, max_retry_wait)
        self.sleep = sleep
        self.jitter = jitter
        self.model_options = dict(model_options or {})
        self.headers = dict(headers or {})
        self._environ = environ
        self._settings_lookup = settings_lookup
        # A run's view shares its provider's connection pools (see for_run).
        self._http: ProviderHTTP | None = http

    def for_endpoint(
        self: P, *, name: str, base_url: str | None = None, api_key_env: str | None = None,
        model_options: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
    ) -> P:
        """A provider named ``name`` for one entry of the ``providers`` setting: this one's
        retry policy and test hooks, that entry's URL, key variable, options and headers."""
        return type(self)(
            base_url, None, name=name, api_key_env=api_key_env or self.api_key_env,
            model_options=model_options, headers=headers, max_retries=self.retry.max_retries,
            backoff_base=self.retry.backoff_base, backoff_max=self.retry.backoff_max,
            max_retry_wait=self.retry.max_retry_wait, sleep=self.sleep, jitter=self.jitter,
            environ=self._environ, settings_lookup=self._settings_lookup)

    def for_run(self: P, settings: Callable[[str], Any], *, max_retries: int | None = None
                ) -> P:
        """This provider as one run sees it: host settings (the base URL) read through
        ``settings``, the run's snapshot, so no request of the run reads the database;
        ``max_retries``: the run's ``provider_retries`` ceiling (None: this provider's own).
        The connection pools stay this provider's, shared by every run."""
        return type(self)(
            self.base_url, self.api_key, name=self.name, api_key_env=self.api_key_env,
            model_options=self.model_options, headers=self.headers,
            max_retries=self.retry.max_retries if max_retries is None else max_retries,
            backoff_base=self.retry.backoff_base,
            backoff_max=self.retry.backoff_max, max_retry_wait=self.retry.max_retry_wait,
            sleep=self.sleep, jitter=self.jitter, environ=self._environ,
            settings_lookup=settings, http=self.http())

    # -- configuration -----------------------------------------------------------------------
    def bind_settings(self, lookup: Callable[[str], Any]) -> None:
        """Read host settings (``provider_max_retries``, and what a subclass reads) through
        ``lookup`` (a host's ``settings.get``); every request hands it to the connection
        pools' retry loop, so a pool made before this still reads through it."""
        self._settings_lookup = lookup

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def resolved_api_key(self) -> str | None:
        """The API key this provider would send now (argument, else its variable)."""
        if self.api_key:
            return self.api_key
        key = self._env().get(self.api_key_env, "").strip()
        return key or None

    def availability(self) -> Literal[True] | str:
        """True, or the reason this provider cannot be used as configured."""
        raise NotImplementedError

    def hints(self) -> dict[int, str]:
        """A sentence per HTTP status, appended to that error (what to check)."""
        return {401: f" Check {self.api_key_env}."}

    def context_overflow(self, status: int, body: Any, detail: str
                         ) -> tuple[int | None, int | None] | None:
        """``(window, prompt_tokens)`` when an error answer says the prompt is longer than
        the model's context window (the request then fails with ``code="context_overflow"``,
        which a run recovers from by compacting); None for any other error. The default
        knows OpenAI's, llama.cpp's, vLLM's and Ollama's answers."""
        from datamachine.providers.overflow import overflow_of

        return overflow_of(status, body, detail)

    # -- the transport -----------------------------------------------------------------------
    def http(self) -> ProviderHTTP:
        """This provider's connection pools and retry loop (made on first use)."""
        if self._http is None:
            from datamachine.providers.http import ProviderHTTP

            self._http = ProviderHTTP(self.name, retry=self.retry, hints=self.hints(),
                                      sleep=self.sleep, jitter=self.jitter,
                                      settings_lookup=self._settings_lookup,
                                      overflow=self.context_overflow)
        return self._http

    def close(self) -> None:
        """Close this provider's connection pools (``host.close()`` calls it)."""
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        """:meth:`close` from inside an event loop."""
        if self._http is not None:
            await self._http.aclose()

    # -- one turn ----------------------------------------------------------------------------
    def complete(
        self, request: ProviderRequest
    ) -> ProviderResponse | Awaitable[ProviderResponse]:
        """Send one request (retrying what is worth retrying) and return the parsed answer:
        at once in a synchronous run, as an awaitable inside a running event loop."""
        delivered = self.http().post(self.outbound(request), settings=self._settings_lookup,
                                     retries=self.retry.max_retries)
        if isinstance(delivered, Awaitable):
            return self._parse_later(delivered, request.turn)
        return self._parsed(delivered, request.turn)

    def _parsed(self, delivered: Delivered, turn: int) -> ProviderResponse:
        """The parsed answer, with the attempts that failed before it (rarely any)."""
        response = self.parse(delivered.response, turn)
        if delivered.failed:
            return response.model_copy(update={"failed_attempts": delivered.failed})
        return response

    def complete_sync(self, request: ProviderRequest) -> ProviderResponse:
        """:meth:`complete` for callers that need a response, not an awaitable (not callable
        inside a running event loop)."""
        answer = self.complete(request)
        if isinstance(answer, ProviderResponse):
            return answer
        close = getattr(answer, "close", None)
        if close is not None:
            close()
        raise UsageError("complete_sync() cannot run inside an event loop; await complete().")

    async def _parse_later(self, pending: Awaitable[Delivered], turn: int) -> ProviderResponse:
        return self._parsed(await pending, turn)

    def decode(self, response: httpx.Response) -> Any:
        """The JSON of a 2xx ``response``; ProviderError ``provider_bad_response`` saying what
        came instead."""
        try:
            return json.loads(response.content)
        except ValueError:
            flat = " ".join(response.text.split())[:300]
            raise ProviderError(
                f"The {self.name} provider answered HTTP {response.status_code} with a body "
                f"that is not JSON: {flat or '(empty body)'}",
                code="provider_bad_response", provider=self.name) from None

    def outbound(self, request: ProviderRequest, *, stream: bool = False) -> Outbound:
        """The POST for ``request`` (URL, body, headers, timeouts; ``stream``: asking for
        Server-Sent Events); a ProviderError (``provider_unavailable``,
        ``provider_bad_request``) when it cannot be made."""
        raise NotImplementedError

    def stream_assembler(self, request: ProviderRequest) -> StreamAssembler:
        """What puts this wire format's streamed answer to ``request`` back together."""
        raise NotImplementedError

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamDelta]:
        """Run one turn as Server-Sent Events: text deltas as they arrive, then the whole
        answer. Until the first event arrives, failures are retried like any request's; a
        stream that breaks after it, or stops before the answer is whole, is a ProviderError
        ``provider_stream_error`` carrying the text that had arrived."""
        import httpx
        from httpx_sse import SSEError

        assembler = self.stream_assembler(request)
        failed: tuple[FailedAttempt, ...] = ()
        try:
            async with self.http().open_events(self.outbound(request, stream=True),
                                               settings=self._settings_lookup,
                                               retries=self.retry.max_retries) as opened:
                failed = opened.failed
                async for event in opened.events:
                    if not event.data.strip():
                        continue
                    text = assembler.feed_data(event.data.strip())
                    if text:
                        yield StreamDelta(text=text)
                    if assembler.done:
                        break
        except (httpx.HTTPError, SSEError, ValueError) as exc:
            raise assembler.broken(f"{type(exc).__name__}: {exc}") from None
        why = assembler.unfinished
        if why is not None:  # ended cleanly but early: not an answer to take as whole
            raise assembler.broken(why)
        response = assembler.response()
        if failed:
            response = response.model_copy(update={"failed_attempts": failed})
        yield StreamDelta(response=response)

    # -- helpers for outbound() --------------------------------------------------------------
    def require(self, available: Literal[True] | str, request: ProviderRequest,
                example_model: str) -> None:
        """Refuse a request this provider cannot send: unavailable, or no model id."""
        if available is not True:
            raise ProviderError(available, code="provider_unavailable", provider=self.name)
        if not request.model.strip():
            raise bad_request(self.name, f"The {self.name} provider needs a model id (for "
                                         f"example {example_model}).")

    def encode(self, body: Any) -> bytes:
        """The JSON of a request body (``provider_bad_request`` when it cannot be JSON)."""
        from agents_api.jsontext import compact_bytes

        try:
            return compact_bytes(body)
        except (TypeError, ValueError) as exc:
            raise bad_request(self.name, f"The request for the {self.name} provider is not "
                                         f"JSON-serializable: {exc}.") from None

    def json_headers(self, auth: Mapping[str, str]) -> dict[str, str]:
        """A JSON request's headers: content type, user agent, ``auth``, then the provider's
        own ``headers`` (which win)."""
        from datamachine import __version__

        return {"Content-Type": "application/json", "Accept": "application/json",
                "User-Agent": f"datamachine/{__version__}", **auth, **self.headers}

    def parse(self, response: httpx.Response, turn: int) -> ProviderResponse:
        """The normalized answer in a 2xx ``response``; ProviderError
        ``provider_bad_response`` when it is not one."""
        raise NotImplementedError
