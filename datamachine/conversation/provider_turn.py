"""One provider request of a run: :class:`ProviderTurn` builds it, sends it, reads the answer.

Per turn it projects the newly appended envelopes (never the whole history) into the request's
chat messages, builds the :class:`ProviderRequest` and its metadata, checks availability once per
run, lets the ``text_result`` hook short-circuit dispatch, calls the provider (streaming its text
when the run streams), normalizes the answer and emits ``request_built``, whether the request
succeeded or not. It decides nothing: what an answer means (a gate, a nudge, what it cost) is
the conversation run's (:mod:`datamachine.conversation.conversation_run`). The run's transport
profile (request and connect timeouts: settings, then the value-filter hooks) is resolved once
per run here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents_api import Message, clock
from agents_api.drive import awaitable
from agents_api.errors import brief_repr
from agents_api.jsontext import canonical_json, compact_bytes
from agents_api.results import unchecked, updated
from datamachine.conversation.projection import ChatProjector
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.normalize import normalize_response
from datamachine.providers.options import without_tool_options

if TYPE_CHECKING:
    from datamachine.conversation.timeline import RunTimeline
    from datamachine.host import Services
    from datamachine.registry import SettingsLookup

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_REQUEST_TIMEOUT", "ProviderTurn", "Timeouts",
           "describe_ignored_usage", "resolve_timeouts"]

logger = logging.getLogger("datamachine.providers")

Emit = Callable[[str, dict[str, Any]], None]
# (hook name, keyword arguments) -> the first answer of a firstresult hook.
FirstAnswer = Callable[..., Any]


# -- the transport profile: resolved once per run -----------------------------------------------
# The timeout hooks see the run's mode, provider, model and payload, none of which change between
# turns. The connect timeout is never above the request timeout.
DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_CONNECT_TIMEOUT = 15.0
MAX_REQUEST_TIMEOUT = 900.0
MAX_CONNECT_TIMEOUT = 300.0


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class Timeouts:
    """The transport profile of a run, in seconds."""

    request: float
    connect: float


def _number(value: object, fallback: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fallback
    return float(value)


def resolve_timeouts(
    host: Services, mode: str, provider: str, model: str, payload: Mapping[str, Any],
    settings: SettingsLookup | None = None,
) -> Timeouts:
    """Settings ``request_timeout`` / ``connect_timeout`` (read through ``settings``, a run's
    snapshot, else the host's), clamped, then the filter hooks."""
    hooks = host.pm.hook
    setting = settings or host.settings.get
    base_request = _number(setting("request_timeout"), DEFAULT_REQUEST_TIMEOUT)
    request = min(max(base_request, 0.0), MAX_REQUEST_TIMEOUT)
    if hooks.request_timeout.get_hookimpls():
        filtered = host.fold("request_timeout", request, mode=mode, provider=provider,
                             model=model, payload=dict(payload))
        # The clamps hold after the filters too: a plugin cannot make a call wait forever.
        request = min(max(0.0, _number(filtered, request)), MAX_REQUEST_TIMEOUT)

    base_connect = _number(setting("connect_timeout"), DEFAULT_CONNECT_TIMEOUT)
    connect = min(max(base_connect, 0.0), MAX_CONNECT_TIMEOUT, request)
    if hooks.connect_timeout.get_hookimpls():
        filtered = host.fold("connect_timeout", connect, mode=mode, provider=provider,
                             model=model, payload=dict(payload), request_timeout=request)
        connect = min(max(0.0, _number(filtered, connect)), MAX_CONNECT_TIMEOUT, request)
    return Timeouts(request=request, connect=connect)


# -- the requests -------------------------------------------------------------------------------
class ProviderTurn:
    """The requests of one run to one provider (provider, model, mode, tools, payload).

    ``first``: the host's firstresult hook caller (``text_result``, ``provider_availability``);
    ``hooked``: which of those two have implementations; ``refused``: model requests are off
    on this host (only the ``text_result`` hook may answer), and ``refusal`` says so and how to
    turn
    them on; ``on_text``: where streamed text goes as it arrives (a streamed run), else None;
    ``report_content``: request_built events carry the messages and the answer's text
    (``otel_capture_content``); ``call_keys``: the run's tool index's canonical parameters
    per call id, which the prompt hash reuses (see ``ChatProjector``); ``timeline``: where
    each request's record goes (the run viewer's row: latency, usage, options, failed
    attempts).
    """

    def __init__(
        self,
        *,
        provider: Any,
        provider_name: str,
        model: str,
        mode: str,
        tools: list[dict[str, Any]],
        tools_json: str | None,
        payload: Mapping[str, Any],
        options: Mapping[str, Any],
        timeouts: Timeouts,
        emit: Emit,
        emit_active: bool,
        first: FirstAnswer,
        hooked: frozenset[str],
        refused: bool = False,
        refusal: str = "",
        on_text: Callable[[str], None] | None = None,
        report_content: bool = False,
        call_keys: Mapping[str, tuple[object, str]] | None = None,
        timeline: RunTimeline | None = None,
    ) -> None:
        self.provider = provider
        self.provider_name = provider_name
        self.model = model
        self.mode = mode
        self.tools = tools
        self.tool_names = [t["name"] for t in tools]
        self.emit = emit
        self.emit_active = emit_active
        self.first = first
        self.hooked = hooked
        self.refused = refused
        self.refusal = refusal
        self.on_text = on_text
        self.report_content = report_content
        self._call_keys = call_keys
        self.projector = ChatProjector(call_keys)
        encoded = (tools_json if tools_json is not None else canonical_json(tools)).encode()
        self.tools_bytes = len(encoded)
        self._tools_sha = hashlib.sha256(encoded).hexdigest()
        payload = dict(payload)
        self._payload_bytes = len(compact_bytes(payload)) if payload else 2
        transport = {"request_timeout": timeouts.request, "connect_timeout": timeouts.connect}
        # What every turn's metadata says of the run, copied into it (never shared).
        self._static: dict[str, Any] = {
            "provider": provider_name, "model": model, "mode": mode, "turn": 0,
            "message_count": 0, "messages_json_bytes": 0, "tools_json_bytes": self.tools_bytes,
            "request_json_bytes": 0, "prompt_sha256": "", "tool_policy_sha256": self._tools_sha,
        }
        self._tools_entry = {"count": len(self.tool_names), "names": self.tool_names}
        self._transport = transport
        # Built-in providers answer in normal form already (see providers.normalize).
        self._trusted = bool(getattr(provider, "answers_normalized", False))
        # Each turn's request is a copy of this one with the turn's parts (the run's own
        # values, not validated again every turn: see agents_api.results.updated).
        self._request = unchecked(
            ProviderRequest, messages=[], tools=tools, provider=provider_name, model=model,
            mode=mode, payload=payload, turn=0, request_timeout=timeouts.request,
            connect_timeout=timeouts.connect, options=dict(options))
        self._available = False
        self._answer_trusted = False
        self._streamed = False
        self._sent: list[dict[str, Any]] = []
        self.metadata: dict[str, Any] = {}
        # The text of an answer whose stream was cut (the consumer left), kept as the answer.
        self.partial_text = ""
        self.stopping = False
        self.timeline = timeline
        self._sent_at = 0.0  # when the request being answered was sent (its latency)
        self.sent_bytes = 0  # the latest request's messages and tools, as sent

    # -- building -------------------------------------------------------------------------
    def request_bytes(self, messages: list[Message]) -> int:
        """The JSON size of the request ``messages`` make: messages and tool definitions, as
        they are sent (what a run's prompt estimate reads)."""
        self.projector.sync(messages)
        return self.projector.bytes + self.tools_bytes

    @property
    def options(self) -> Mapping[str, Any]:
        """The model options every turn's request carries."""
        return self._request.options

    # -- other views of the history (see datamachine.context) -----------------------------
    def projection(self, messages: list[Message]) -> ChatProjector:
        """A new projection of ``messages`` (a compacted view of the history)."""
        projector = ChatProjector(self._call_keys)
        projector.sync(messages)
        return projector

    def bytes_of(self, projector: ChatProjector) -> int:
        """The request size ``projector``'s messages and the run's tools make."""
        return projector.bytes + self.tools_bytes

    def use_projection(self, projector: ChatProjector) -> None:
        """Send ``projector``'s view from now on: the list it projected, which the run goes
        on extending, is what later requests pass."""
        self.projector = projector

    @staticmethod
    def message_bytes(message: Message) -> int:
        """About what ``message`` adds to a request, in bytes (for choosing what to drop)."""
        if message.type == "tool_call":
            return 48 + len(compact_bytes(message.payload.get("parameters")))
        content = message.content
        return 32 + (len(content.encode()) if isinstance(content, str)
                     else len(compact_bytes(content)))

    def side_request(self, system: str, text: str, turn: int,
                     max_tokens: int) -> ProviderRequest:
        """A tool-less request of the run's model that is not a turn: ``system`` then
        ``text`` as the user's, its answer at most ``max_tokens``."""
        options = without_tool_options(self._request.options)
        key = "max_completion_tokens" if "max_completion_tokens" in options else "max_tokens"
        given = options.get(key)
        options[key] = min(given, max_tokens) if isinstance(given, int) else max_tokens
        return updated(self._request, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": text}],
            tools=[], turn=turn, options=options)

    def side_call(self, request: ProviderRequest, kind: str
                  ) -> ProviderResponse | Awaitable[ProviderResponse]:
        """Send ``request`` (see :meth:`side_request`) and read its answer; recorded on the
        timeline as a request marked ``kind``, never streamed."""
        self._sent_at = clock.monotonic()
        try:
            answer = self.dispatch(request, stream=False)
        except BaseException as exc:
            self._side_record(request, kind, None, exc)
            raise
        if awaitable(answer):
            return self._side_later(answer, request, kind)
        return self._side_read(answer, request, kind)

    async def _side_later(self, answer: Awaitable[Any], request: ProviderRequest,
                          kind: str) -> ProviderResponse:
        try:
            raw = await answer
        except BaseException as exc:
            self._side_record(request, kind, None, exc)
            raise
        return self._side_read(raw, request, kind)

    def _side_read(self, answer: Any, request: ProviderRequest, kind: str
                   ) -> ProviderResponse:
        try:
            response = self.read(answer, request.turn)
        except Exception as exc:
            self._side_record(request, kind, None, exc)
            raise
        self._side_record(request, kind, response, None)
        return response

    def _side_record(self, request: ProviderRequest, kind: str,
                     response: ProviderResponse | None, error: BaseException | None) -> None:
        if self.timeline is None:
            return
        record = self.request_record(request.options, response, error)
        record[kind] = True
        self.timeline.request(request.turn, record)

    def request(self, messages: list[Message], turn: int, *,
                extra: list[dict[str, str]] | None = None,
                tools: list[dict[str, Any]] | None = None,
                deadline: float | None = None) -> ProviderRequest:
        """The request of ``turn``: the transcript's chat messages, then ``extra`` (pressure
        notices, a summary prompt; never stored); ``tools``: what is offered (default: every
        tool of the run; ``[]`` for a tool-less request, which also drops tool options);
        ``deadline``: seconds left on the run's time rail, which caps the request timeout."""
        chat = self.projector.sync(messages)
        sent = [*chat, *extra] if extra else list(chat)
        offered = self.tools if tools is None else tools
        update: dict[str, Any] = {"messages": sent, "tools": offered, "turn": turn}
        if not offered and self.tools and self._request.options:
            update["options"] = without_tool_options(self._request.options)
        timeout = self._request.request_timeout
        if deadline is not None and (timeout <= 0 or deadline < timeout):
            # Under the run's time rail: a provider whose call cannot be cancelled (a
            # synchronous HTTP request) gives up when the run's time does.
            update["request_timeout"] = max(deadline, 0.001)
        request = updated(self._request, **update)
        projector = self.projector
        messages_bytes = projector.bytes
        metadata = self._static.copy()
        metadata["turn"] = turn
        metadata["message_count"] = len(sent)
        metadata["messages_json_bytes"] = messages_bytes
        metadata["request_json_bytes"] = messages_bytes + self.tools_bytes + self._payload_bytes
        # What the model reads of it, for what an answer's prompt tokens say per byte.
        self.sent_bytes = messages_bytes + (self.tools_bytes if offered else 0)
        metadata["prompt_sha256"] = projector.prompt_sha256()
        entry = self._tools_entry
        metadata["tools"] = ({"count": entry["count"], "names": list(self.tool_names)}
                             if offered is self.tools
                             else {"count": len(offered), "names": [t["name"] for t in offered]})
        metadata["transport"] = self._transport.copy()
        self.metadata = metadata
        if self.report_content:
            self._sent = sent
        return request

    # -- sending --------------------------------------------------------------------------
    def send(self, request: ProviderRequest) -> ProviderResponse | Awaitable[ProviderResponse]:
        """One turn's request: the normalized answer (or an awaitable of it), reported with
        ``request_built``. A failure is reported, then raised."""
        turn = request.turn
        self._sent_at = clock.monotonic()
        try:
            answer = self.dispatch(request)
        except Exception as exc:
            self.report(turn, error=exc)
            raise
        if type(answer) is ProviderResponse and self._answer_trusted:
            self._answered(answer, turn)  # the common case: a built-in provider's answer
            return answer
        if awaitable(answer):
            return self._read_later(answer, turn)
        return self._read(answer, turn)

    def dispatch(self, request: ProviderRequest, *, stream: bool = True) -> Any:
        """Availability, then the ``text_result`` hook, else the provider: its answer (or an
        awaitable of it), not yet read. ``stream=False``: never streamed to the run's
        consumer (a request the model answers for the run itself, such as a summary of its
        history)."""
        if self.refused:
            return self._hook_only(request)
        if not self._available:
            self._check_availability()
        short = (self.first("text_result", request=request)
                 if "text_result" in self.hooked else None)
        if short is not None:
            self._answer_trusted = False
            return self._from_hook(short)
        self._answer_trusted = self._trusted
        self._streamed = False
        if stream and self.on_text is not None:
            open_stream = getattr(self.provider, "stream", None)
            if callable(open_stream):
                self._streamed = True
                return self._stream(open_stream(request))
        return self.provider.complete(request)

    def stop(self) -> None:
        """The stream's consumer left: a stream in progress is closed at its next delta."""
        self.stopping = True

    def _check_availability(self) -> None:
        answer = (self.first("provider_availability", provider=self.provider_name,
                             model=self.model)
                  if "provider_availability" in self.hooked else None)
        if answer is None:
            own = getattr(self.provider, "availability", None)
            answer = own() if callable(own) else True
        if isinstance(answer, str) and answer.strip():
            raise ProviderError(answer, code="provider_unavailable", provider=self.provider_name)
        if answer is False:
            raise ProviderError(f"Provider {self.provider_name!r} is not available.",
                                code="provider_unavailable", provider=self.provider_name)
        self._available = True

    def _hook_only(self, request: ProviderRequest) -> Any:
        """With model requests off: the ``text_result`` hook's answer, else a clear error
        (the provider is never called, nor asked whether it is available)."""
        short = (self.first("text_result", request=request)
                 if "text_result" in self.hooked else None)
        if short is None:
            raise ProviderError(f"{self.refusal} (turn {request.turn})",
                                code="model_requests_disabled", provider=self.provider_name)
        self._answer_trusted = False
        return self._from_hook(short)

    def _from_hook(self, short: Any) -> Any:
        if isinstance(short, BaseException):
            raise short
        if isinstance(short, ProviderResponse | Mapping):
            return short
        raise ProviderError(
            f"A text_result hookimpl returned {type(short).__name__}; return a dict, a "
            "ProviderResponse, an Exception or None.",
            code="provider_bad_response", provider=self.provider_name)

    async def _stream(self, deltas: AsyncIterator[Any]) -> ProviderResponse:
        """Pass a provider's text on as it arrives; the whole answer at the end (or, when the
        consumer leaves mid-way, the text so far)."""
        sink = self.on_text
        assert sink is not None
        self.partial_text = ""
        response: ProviderResponse | None = None
        try:
            async for delta in deltas:
                if delta.text:
                    self.partial_text += delta.text
                    sink(delta.text)
                if delta.response is not None:
                    response = delta.response
                if self.stopping:
                    break
        finally:
            aclose = getattr(deltas, "aclose", None)  # an async generator's, when it is one
            if aclose is not None:
                await aclose()
        if response is None:  # left mid-way
            return ProviderResponse(content=self.partial_text, finish_reason="aborted")
        self.partial_text = ""
        return response

    # -- reading --------------------------------------------------------------------------
    async def _read_later(self, answer: Awaitable[Any], turn: int) -> ProviderResponse:
        try:
            raw = await answer
        except (Exception, asyncio.CancelledError) as exc:
            # A call the wall clock cut is a failed request too: observers still hear of it.
            self.report(turn, error=exc)
            raise
        return self._read(raw, turn)

    def _read(self, answer: Any, turn: int) -> ProviderResponse:
        try:
            response = self.read(answer, turn, trusted=self._answer_trusted)
        except Exception as exc:
            self.report(turn, error=exc)
            raise
        self._answered(response, turn)
        return response

    def _answered(self, response: ProviderResponse, turn: int) -> None:
        self.metadata["response"] = {"finish_reason": response.finish_reason}
        if self.on_text is not None and not self._streamed and response.content:
            self.on_text(response.content)  # a provider that cannot stream: one delta
        self.report(turn, response=response)

    def read(self, answer: Any, turn: int, *, trusted: bool = False) -> ProviderResponse:
        """``answer`` (a provider's or a hook's) as a normalized :class:`ProviderResponse`."""
        if not isinstance(answer, ProviderResponse | Mapping):
            raise ProviderError(
                f"Provider {self.provider_name!r} returned {type(answer).__name__}, "
                "not a ProviderResponse.",
                code="provider_bad_response", provider=self.provider_name)
        # A provider that normalizes its own answers (the built-in ones) says so.
        if trusted and isinstance(answer, ProviderResponse):
            return answer
        return normalize_response(answer, provider=self.provider_name, turn=turn)

    def report(self, turn: int, *, response: ProviderResponse | None = None,
               error: BaseException | None = None) -> None:
        """The ``request_built`` event of ``turn``'s request, and its record on the run's
        timeline: how it went."""
        if self.timeline is not None:
            self.timeline.request(turn, self.request_record(
                self._request.options, response, error))
        if not self.emit_active:
            return
        payload: dict[str, Any] = {"turn": turn, "provider": self.provider_name,
                                   "model": self.model, "success": error is None,
                                   "request_metadata": self.metadata}
        if response is not None:
            payload["usage"] = response.usage
        if self.report_content:
            payload["messages"] = self._sent
            if response is not None:
                payload["content"] = response.content
                payload["tool_calls"] = response.tool_calls
        if isinstance(error, asyncio.CancelledError):
            payload["error"] = "cancelled at the run's wall-clock limit"
        elif error is not None:
            payload["error"] = str(error) or type(error).__name__
        self.emit("request_built", payload)


    def request_record(self, options: Mapping[str, Any], response: ProviderResponse | None,
                       error: BaseException | None) -> dict[str, Any]:
        """What the run viewer shows of one request (sent at ``_sent_at``): its latency,
        usage, the options sent, the attempts that failed before it, and its error."""
        record: dict[str, Any] = {
            "ms": round((clock.monotonic() - self._sent_at) * 1000), "ok": error is None}
        if response is not None and response.usage:
            record["usage"] = response.usage
        if options:
            record["options"] = dict(options)
        failed = (response.failed_attempts if response is not None
                  else getattr(error, "failed_attempts", ()))
        if failed:
            record["attempts"] = [{"status": a.status, "error": a.error[:300],
                                   "waited": a.waited} for a in failed]
        if error is not None:
            text = ("cancelled at the run's wall-clock limit"
                    if isinstance(error, asyncio.CancelledError) else str(error))
            record["error"] = (text or type(error).__name__)[:500]
        return record

    def summary_sent(self) -> None:
        """The final summary request goes out now (its latency starts)."""
        self._sent_at = clock.monotonic()

    def record_summary(self, turn: int, options: Mapping[str, Any],
                       response: ProviderResponse | None, error: BaseException | None) -> None:
        """The final summary request's record on the run's timeline (it is not a turn)."""
        if self.timeline is None:
            return
        record = self.request_record(without_tool_options(dict(options)), response, error)
        record["summary"] = True
        self.timeline.request(turn, record)


def describe_ignored_usage(provider: str, ignored: Mapping[str, Any]) -> str:
    """The once-per-run warning for usage that cannot be true."""
    return (f"datamachine: provider {provider!r} reported usage that cannot be true ("
            + ", ".join(f"{key}={brief_repr(value, 40)}" for key, value in ignored.items())
            + "); those fields were treated as not reported, so token and cost budgets "
            "counted their estimate. Logged once per run.")
