"""The HTTP side every wire provider shares: pooled connections, retries, errors.

A provider sends one JSON POST per turn. Opening a client per turn costs a TCP (and against a
real endpoint a TLS) handshake every turn, so :class:`ProviderHTTP` keeps one connection pool
per provider instance, which is one per provider per host, for as long as the host lives:

* a synchronous run (no event loop in the thread) uses one ``httpx.Client``, shared by every
  thread, and gets its answer without an event loop at all;
* an async run uses one ``httpx.AsyncClient`` per event loop (an async client's connections
  belong to the loop that opened them); clients of loops that have closed are dropped.

``host.close()`` closes them (through ``ProviderRegistry.close``).

Retries: HTTP 408, 409, 429 and 5xx (except 501 and 505, which will not change) are retried up
to ``max_retries`` times, waiting what the server asked (``retry-after-ms``, else
``Retry-After`` in seconds or as an HTTP date), else an exponential backoff with jitter; a
server that says ``x-should-retry`` is obeyed. A wait longer than ``max_retry_wait`` is not
waited for. An answer that breaks before its first byte is retried the same way (with the
backoff): a connection the server closes or resets before answering, and a streamed answer
whose body ends or breaks before its first event. A server that cannot be reached at all, or
does not answer within the request timeout, is not retried (the error says which). The retry
decisions live in one generator (:meth:`ProviderHTTP._exchange`) that the sync, the async and
the streaming path drive, so they cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from agents_api import clock
from datamachine.errors import ProviderError, UsageError
from datamachine.providers.base import FailedAttempt
from datamachine.providers.overflow import CONTEXT_OVERFLOW, Overflow
from datamachine.providers.retry import DEFAULT_MAX_RETRIES, RetryPolicy, outside_run_retries

if TYPE_CHECKING:
    import httpx
    from httpx_sse import ServerSentEvent

__all__ = ["DEFAULT_MAX_RETRIES", "MAX_RETRIES_SETTING", "Delivered", "Opened", "ProviderHTTP",
           "RetryPolicy", "Sleep", "error_detail", "excerpt", "parse_retry_after",
           "retry_after_seconds"]

logger = logging.getLogger("datamachine.providers")

MAX_RETRIES_SETTING = "provider_max_retries"
# Where a setting is read: a host's ``settings.get``, or a run's snapshot's.
SettingsLookup = Callable[[str], Any]
# (status, the error body's JSON or None, its message) -> (window, prompt tokens) or None.
OverflowCheck = Callable[[int, Any, str], Overflow | None]

# ``sleep(seconds)``: sync, or async (only usable by async runs).
Sleep = Callable[[float], Awaitable[None] | None]


def excerpt(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


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


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for: ``retry-after-ms`` (milliseconds, the finer one, sent by
    OpenAI and Anthropic) first, else ``Retry-After``; None when it asks for none."""
    millis = parse_retry_after(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    return parse_retry_after(headers.get("retry-after"))


def error_detail(response: httpx.Response) -> str:
    """The message of an error body (OpenAI's and Anthropic's ``{"error": {"message"}}``, a
    plain ``{"error": "..."}`` or ``{"message"}``), else the start of the body; never blank:
    an empty body, or an error object whose message is empty, says so."""
    try:
        data = json.loads(response.content)
    except ValueError:
        data = None
    message = _error_message(data) if isinstance(data, dict) else None
    if message is not None and message.strip():
        return message
    body = excerpt(response.text)
    if not body:
        return "(empty body)"
    if message is not None:
        return f"an error with an empty message: {body}"
    return body


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def _error_message(data: dict[str, Any]) -> str | None:
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(data.get("message"), str):
        return str(data["message"])
    return None


@functools.cache
def _tls_verify() -> Any:
    """The default TLS context, built once per process (tens of milliseconds each time)."""
    import httpx

    factory = getattr(httpx, "create_ssl_context", None)
    return factory() if callable(factory) else True


def _retryable(status: int) -> bool:
    return status in (408, 409, 429) or (500 <= status <= 599 and status not in (501, 505))


class _NoFirstByte(Exception):
    """A 2xx streamed answer whose body ended (or broke) before its first event."""


def _breaks_before_answering(exc: Exception) -> bool:
    """A failure before the first byte of an answer that a new attempt may not meet: the
    server closed or reset the connection, or a stream ended before its first event."""
    import httpx

    return isinstance(exc, _NoFirstByte | httpx.RemoteProtocolError | httpx.ReadError
                      | httpx.WriteError)


@dataclass(slots=True)
class _Send:
    """The retry loop asks for the request to be sent (again)."""


@dataclass(slots=True)
class _Wait:
    """The retry loop asks for a wait before the next attempt."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Delivered:
    """A request's 2xx answer, and the attempts before it that failed and were retried."""

    response: httpx.Response
    failed: tuple[FailedAttempt, ...] = ()


@dataclass(frozen=True, slots=True)
class Opened:
    """A streamed answer's events (its first one has arrived), and the attempts before it
    that failed and were retried."""

    events: AsyncIterator[ServerSentEvent]
    failed: tuple[FailedAttempt, ...] = ()


@dataclass(slots=True)
class Outbound:
    """One POST as a provider prepared it."""

    url: str
    content: bytes
    headers: dict[str, str]
    request_timeout: float
    connect_timeout: float


class ProviderHTTP:
    """The connection pools and the retry loop of one provider instance.

    ``name`` labels errors; ``hints`` maps an HTTP status to a sentence appended to its error
    (what to check); ``overflow`` tells an answer saying the prompt was too long (see
    :mod:`datamachine.providers.overflow`); ``settings_lookup`` reads ``provider_max_retries``
    when the policy leaves it open. ``sleep`` and ``jitter`` are injectable so tests observe
    waits without waiting.
    """

    def __init__(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        hints: Mapping[int, str] | None = None,
        sleep: Sleep | None = None,
        jitter: Callable[[], float] | None = None,
        settings_lookup: Callable[[str], Any] | None = None,
        overflow: OverflowCheck | None = None,
    ) -> None:
        self.name = name
        self.overflow = overflow
        self.retry = retry if retry is not None else RetryPolicy()
        self.hints = dict(hints or {})
        self.sleep = sleep
        self.jitter = jitter if jitter is not None else random.random
        self.settings_lookup = settings_lookup
        self._client: httpx.Client | None = None
        self._async_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._lock = threading.Lock()
        self._probed: dict[str, Any] = {}  # see probe_json
        # The last URL, parsed: httpx parses a string URL on every request.
        self._url: tuple[str, httpx.URL] | None = None

    # -- configuration -----------------------------------------------------------------------
    def max_retries(self, settings: Callable[[str], Any] | None = None,
                    retries: int | None = None) -> int:
        """The retries allowed after a turn's first request: ``retries`` (a run's
        ``provider_retries`` ceiling, resolved by the host's budget registry), else the
        policy's, else the ``provider_retries`` budget's setting read through ``settings`` (a
        run's snapshot) or this pool's own lookup, resolved like a run's."""
        if retries is not None:
            return retries
        if self.retry.max_retries is not None:
            return self.retry.max_retries
        return outside_run_retries(settings or self.settings_lookup)

    # -- clients ---------------------------------------------------------------------------
    def sync_client(self) -> httpx.Client:
        """The pool of sync runs (created on first use; shared by every thread)."""
        client = self._client
        if client is None:
            import httpx

            with self._lock:  # two threads' first requests must not open two pools
                client = self._client
                if client is None:
                    client = self._client = httpx.Client(follow_redirects=False,
                                                         verify=_tls_verify())
        return client

    def probe_json(self, url: str, headers: Mapping[str, str], timeout: float) -> Any:
        """``GET url``'s JSON, asked once per pool (a server's fixed facts, such as
        llama.cpp's ``/props``): None when it does not answer 200 with JSON. Synchronous:
        made while a run is set up, once per server."""
        with self._lock:
            if url in self._probed:
                return self._probed[url]
        import httpx

        try:
            response = self.sync_client().get(url, headers=dict(headers),
                                         timeout=httpx.Timeout(timeout))
            found = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            found = None
        with self._lock:
            self._probed[url] = found
        return found

    def async_client(self) -> httpx.AsyncClient:
        """The pool of the running event loop (created on first use there)."""
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            import httpx

            with self._lock:  # event loops of other threads may be adding theirs
                for stale in [other for other in list(self._async_clients)
                              if other.is_closed()]:
                    del self._async_clients[stale]
                client = httpx.AsyncClient(follow_redirects=False, verify=_tls_verify())
                self._async_clients[loop] = client
        return client

    def close(self) -> None:
        """Close every pool this provider opened; the next request opens a new one."""
        with self._lock:
            client, self._client = self._client, None
            clients, self._async_clients = self._async_clients, {}
        if client is not None:
            client.close()
        for loop, async_client in clients.items():
            _close_async_client(loop, async_client)

    async def aclose(self) -> None:
        """:meth:`close` from inside an event loop (awaits the running loop's own pool)."""
        running = asyncio.get_running_loop()
        own = self._async_clients.pop(running, None)
        self.close()
        if own is not None:
            await own.aclose()

    # -- one exchange ------------------------------------------------------------------------
    def post(self, outbound: Outbound, *, settings: SettingsLookup | None = None,
             retries: int | None = None) -> Delivered | Awaitable[Delivered]:
        """POST with retries: the final 2xx response and the attempts that failed before it,
        or an awaitable of them inside a running event loop. Every failure is a ProviderError
        naming what to fix (with the failed attempts before it)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._post_sync(outbound, settings, retries)
        return self._post_async(outbound, settings, retries)

    def _parsed(self, url: str) -> httpx.URL:
        cached = self._url
        if cached is not None and cached[0] == url:
            return cached[1]
        import httpx

        parsed = httpx.URL(url)
        self._url = (url, parsed)
        return parsed

    def _post_sync(self, outbound: Outbound, settings: SettingsLookup | None = None,
                   retries: int | None = None) -> Delivered:
        client = self.sync_client()
        url = self._parsed(outbound.url)
        failed: list[FailedAttempt] = []
        steps = self._exchange(outbound, failed, settings, retries)
        ask: _Send | _Wait = next(steps)
        try:
            while True:
                if isinstance(ask, _Wait):
                    self._sleep_sync(ask.seconds)
                    ask = steps.send(None)
                    continue
                try:
                    response = client.post(url, content=outbound.content,
                                           headers=outbound.headers,
                                           timeout=self._timeout(outbound))
                except Exception as exc:
                    ask = steps.throw(exc)
                else:
                    ask = steps.send(response)
        except StopIteration as done:
            return Delivered(done.value, tuple(failed))

    async def _post_async(self, outbound: Outbound, settings: SettingsLookup | None = None,
                          retries: int | None = None) -> Delivered:
        client = self.async_client()
        url = self._parsed(outbound.url)
        failed: list[FailedAttempt] = []
        steps = self._exchange(outbound, failed, settings, retries)
        ask: _Send | _Wait = next(steps)
        deadline = outbound.request_timeout if outbound.request_timeout > 0 else None
        try:
            while True:
                if isinstance(ask, _Wait):
                    await self._sleep_async(ask.seconds)
                    ask = steps.send(None)
                    continue
                try:
                    # Per-read timeouts do not bound a server that drips bytes: this does.
                    async with asyncio.timeout(deadline):
                        response = await client.post(
                            url, content=outbound.content, headers=outbound.headers,
                            timeout=self._timeout(outbound))
                except Exception as exc:
                    ask = steps.throw(exc)
                else:
                    ask = steps.send(response)
        except StopIteration as done:
            return Delivered(done.value, tuple(failed))

    @contextlib.asynccontextmanager
    async def open_events(self, outbound: Outbound, *, settings: SettingsLookup | None = None,
                          retries: int | None = None) -> AsyncIterator[Opened]:
        """POST for a streamed answer: its Server-Sent Events, once the first one has arrived.
        Until then everything is retried as for :meth:`post`: an error status (whose answer is
        read whole, for its message), a connection that drops, a body that ends or breaks
        before its first event. The response is closed on exit."""
        from httpx_sse import EventSource

        client = self.async_client()
        url = self._parsed(outbound.url)
        failed: list[FailedAttempt] = []
        steps = self._exchange(outbound, failed, settings, retries)
        ask: _Send | _Wait = next(steps)
        while True:
            if isinstance(ask, _Wait):
                await self._sleep_async(ask.seconds)
                ask = steps.send(None)
                continue
            request = client.build_request("POST", url, content=outbound.content,
                                           headers=outbound.headers,
                                           timeout=self._timeout(outbound))
            try:
                response = await client.send(request, stream=True)
            except Exception as exc:
                ask = steps.throw(exc)  # a wait before the next attempt, or the ProviderError
                continue
            if not 200 <= response.status_code < 300:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                ask = steps.send(response)  # the generator only returns on a 2xx
                continue
            events = EventSource(response).aiter_sse()
            try:
                first = await anext(events)
            except (StopAsyncIteration, Exception) as exc:
                await events.aclose()
                await response.aclose()
                if isinstance(exc, StopAsyncIteration):
                    exc = _NoFirstByte("the stream ended before its first event")
                elif not _breaks_before_answering(exc):
                    raise  # not an event stream at all, a timeout: not retried
                ask = steps.throw(exc)
                continue
            steps.close()  # the answer is arriving: no attempt after this one
            try:
                yield Opened(_after(first, events), tuple(failed))
            finally:
                await events.aclose()
                await response.aclose()
            return

    def _sleep_sync(self, seconds: float) -> None:
        if self.sleep is None:
            time.sleep(seconds)
            return
        waited = self.sleep(seconds)
        if inspect.isawaitable(waited):
            close = getattr(waited, "close", None)
            if close is not None:
                close()
            raise UsageError(f"The {self.name} provider's sleep is async; a synchronous run "
                             "needs a sync sleep(seconds) (or none, for time.sleep).")

    async def _sleep_async(self, seconds: float) -> None:
        if self.sleep is None:
            await asyncio.sleep(seconds)
            return
        waited = self.sleep(seconds)
        if inspect.isawaitable(waited):
            await waited

    @staticmethod
    def _timeout(outbound: Outbound) -> httpx.Timeout:
        import httpx

        request = outbound.request_timeout if outbound.request_timeout > 0 else None
        connect = outbound.connect_timeout if outbound.connect_timeout > 0 else None
        return httpx.Timeout(request, connect=connect)

    def _exchange(
        self, outbound: Outbound, failed: list[FailedAttempt],
        settings: SettingsLookup | None = None, allowed: int | None = None,
    ) -> Generator[_Send | _Wait, httpx.Response | None, httpx.Response]:
        """The retry decisions: yields a send or a wait, receives the response (or has the
        transport's exception thrown in), returns the final 2xx response; each attempt that
        failed and is retried is added to ``failed``."""
        retries = self.max_retries(settings, allowed)
        attempt = 0
        while True:
            attempt += 1
            try:
                response = yield _Send()
            except Exception as exc:
                if attempt > retries or not _breaks_before_answering(exc):
                    raise self._transport_error(exc, outbound, attempt, retries,
                                                failed) from None
                backoff = self._backoff(attempt)
                failed.append(FailedAttempt(error=_what_broke(exc), waited=backoff))
                logger.info("%s: %s from %s before its answer began, retrying in %.2f s "
                            "(attempt %d of %d)", self.name, _what_broke(exc), outbound.url,
                            backoff, attempt + 1, retries + 1)
                yield _Wait(backoff)
                continue
            assert response is not None
            if 200 <= response.status_code < 300:
                return response
            delay = self._retry_delay(response, attempt, retries)
            if delay is None:
                raise self._http_error(response, outbound.url, attempt, retries, failed)
            failed.append(FailedAttempt(status=response.status_code,
                                        error=error_detail(response), waited=delay))
            logger.info("%s: HTTP %s from %s, retrying in %.2f s (attempt %d of %d)", self.name,
                        response.status_code, outbound.url, delay, attempt + 1, retries + 1)
            yield _Wait(delay)

    def _retry_delay(self, response: httpx.Response, attempt: int, retries: int) -> float | None:
        """Seconds to wait before the next attempt, or None when this answer is final."""
        told = response.headers.get("x-should-retry", "").strip().lower()
        if attempt > retries or told == "false":
            return None
        if told != "true" and not _retryable(response.status_code):
            return None
        asked = retry_after_seconds(response.headers)
        if asked is not None:
            return asked if asked <= self.retry.max_retry_wait else None
        return self._backoff(attempt)

    def _backoff(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` when the server asked for none."""
        ceiling = min(self.retry.backoff_max, self.retry.backoff_base * 2.0 ** (attempt - 1))
        return ceiling * (0.5 + 0.5 * self.jitter())  # jitter spreads out synchronized clients

    def _http_error(self, response: httpx.Response, url: str, attempt: int,
                    retries: int, failed: list[FailedAttempt]) -> ProviderError:
        status = response.status_code
        attempts = _attempts(attempt, retries, _retryable(status))
        asked = retry_after_seconds(response.headers)
        if attempt <= retries and asked is not None and asked > self.retry.max_retry_wait:
            attempts = (f"(the server asked to wait {asked:g} s, more than max_retry_wait="
                        f"{self.retry.max_retry_wait:g} s)")
        detail = error_detail(response)
        overflow = self.overflow(status, _json_or_none(response), detail) \
            if self.overflow is not None else None
        if overflow is not None:
            return ProviderError(
                f"The {self.name} provider answered HTTP {status} from {url}: the prompt is "
                f"longer than the model's context window: {detail}.",
                code=CONTEXT_OVERFLOW, provider=self.name, status=status, attempts=attempt,
                failed_attempts=tuple(failed), context_window=overflow[0],
                prompt_tokens=overflow[1])
        told = response.headers.get("x-should-retry", "").strip().lower()
        worth_retrying = told == "true" or (told != "false" and _retryable(status))
        return ProviderError(
            f"The {self.name} provider answered HTTP {status} from {url} {attempts}: "
            f"{detail}.{self.hints.get(status, '')}",
            code="provider_http_error", provider=self.name, status=status, attempts=attempt,
            failed_attempts=tuple(failed), retries_spent=worth_retrying and attempt > retries)

    def _broke_before_answering(self, exc: Exception, url: str, attempt: int,
                                retries: int, before: tuple[FailedAttempt, ...]
                                ) -> ProviderError:
        attempts = _attempts(attempt, retries, True)
        if isinstance(exc, _NoFirstByte):
            return ProviderError(
                f"The {self.name} provider's streamed answer from {url} ended before its first "
                f"event {attempts}: HTTP 200 with an empty body. Check the server's log.",
                code="provider_stream_error", provider=self.name, attempts=attempt,
                failed_attempts=before, retries_spent=attempt > retries)
        return ProviderError(
            f"The {self.name} provider's server at {url} closed the connection before "
            f"answering {attempts} ({type(exc).__name__}: {exc or 'no detail'}). Check the "
            "server's log.", code="provider_connection_error", provider=self.name,
            attempts=attempt, failed_attempts=before, retries_spent=attempt > retries)

    def _transport_error(self, exc: Exception, outbound: Outbound, attempt: int,
                         retries: int, failed: list[FailedAttempt]) -> ProviderError:
        import httpx

        url = outbound.url
        before = tuple(failed)
        if _breaks_before_answering(exc):
            return self._broke_before_answering(exc, url, attempt, retries, before)
        if isinstance(exc, httpx.ConnectTimeout):
            return ProviderError(
                f"The {self.name} provider could not connect to {url} within the connect "
                f"timeout of {outbound.connect_timeout:g} s. Is the server running? (The "
                "connect_timeout setting or hook raises the limit.)",
                code="provider_timeout", provider=self.name, attempts=attempt,
                failed_attempts=before)
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            return ProviderError(
                f"The {self.name} provider got no answer from {url} within the request "
                f"timeout of {outbound.request_timeout:g} s. Raise the request_timeout setting "
                "(or hook) for slow models.",
                code="provider_timeout", provider=self.name, attempts=attempt,
                failed_attempts=before)
        if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
            return ProviderError(f"The {self.name} provider's URL {url!r} is invalid: {exc}.",
                                 code="provider_bad_request", provider=self.name,
                                 failed_attempts=before)
        if isinstance(exc, httpx.HTTPError):
            return ProviderError(
                f"The {self.name} provider cannot reach {url}: {type(exc).__name__}: {exc}. "
                "Check its base URL and that the server is running.",
                code="provider_connection_error", provider=self.name, attempts=attempt,
                failed_attempts=before)
        raise exc


def _attempts(attempt: int, retries: int, retryable: bool) -> str:
    """How often a failed request was sent, as the error says it."""
    if attempt > 1:
        return f"after {attempt} attempts"
    if retryable and retries == 0:
        return "(the provider_retries budget is 0, so not retried)"
    return "(not retried)"


def _what_broke(exc: Exception) -> str:
    if isinstance(exc, _NoFirstByte):
        return "a streamed answer ended before its first event"
    return f"the connection broke ({type(exc).__name__}: {exc or 'no detail'})"


def _after(first: ServerSentEvent,
           rest: AsyncIterator[ServerSentEvent]) -> AsyncIterator[ServerSentEvent]:
    """``first``, then ``rest``."""

    async def events() -> AsyncIterator[ServerSentEvent]:
        yield first
        async for event in rest:
            yield event

    return events()


def _close_async_client(loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
    # An async client closes on its own loop. A closed loop took its sockets with it.
    if loop.is_closed():
        return
    if loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(client.aclose())
        else:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        return
    loop.run_until_complete(client.aclose())
