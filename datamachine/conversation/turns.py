"""The turn runner: one provider turn, from transcript to the loop's ``TurnAnswer``.

Per turn it projects the newly appended envelopes (never the whole history), builds the
:class:`ProviderRequest` with its metadata, checks availability once per run, lets the
``text_result`` hook short-circuit dispatch, calls the provider, and emits ``request_built``
whether the request succeeded or not. A provider failure is raised so the loop ends the run with
status ``error`` and keeps everything earlier turns produced.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from agents_api import IterationBudget, Message, TurnAnswer, clock
from agents_api.drive import awaitable
from agents_api.errors import brief_repr
from agents_api.jsontext import canonical_json, compact_bytes
from datamachine.conversation.metering import RunMeter
from datamachine.conversation.pressure import PressureTracker
from datamachine.conversation.projection import ChatProjector
from datamachine.conversation.timeline import RunTimeline
from datamachine.conversation.timeouts import Timeouts
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.normalize import normalize_response
from datamachine.providers.options import without_tool_options
from datamachine.services import Services

__all__ = ["ProviderTurnRunner"]

logger = logging.getLogger("datamachine.providers")

Emit = Callable[[str, dict[str, Any]], None]
# (messages, content, turn context) -> continuation messages; see datamachine.completion.
NaturalCompletion = Callable[[list[Message], str, dict[str, Any]], list[Message]]


class TurnGate(Protocol):
    """Asked after every provider answer (a chat session's turn limit): False declines the
    turn's tool calls and ends the run after it; ``aborted`` then says so, ``notice`` why.
    ``pending`` (set at the limit with ``confirmation="pause"``): the run pauses before the
    turn's calls run, if it would go on."""

    aborted: bool
    notice: str
    pending: dict[str, Any] | None

    def __call__(self, turn: int) -> bool:
        """Count turn ``turn``; whether the run may go on."""


class ProviderTurnRunner:
    """Callable turn runner bound to one run (provider, model, mode, tools, payload)."""

    def __init__(
        self,
        host: Services,
        *,
        provider: Any,
        provider_name: str,
        model: str,
        mode: str,
        tools: list[dict[str, Any]],
        payload: Mapping[str, Any],
        timeouts: Timeouts,
        emit: Emit,
        single_turn: bool = False,
        pressure: PressureTracker | None = None,
        tools_json: str | None = None,
        on_natural_completion: NaturalCompletion | None = None,
        turn_gate: TurnGate | None = None,
        call_keys: Mapping[str, tuple[object, str]] | None = None,
        options: Mapping[str, Any] | None = None,
        timeline: RunTimeline | None = None,
    ) -> None:
        """``call_keys``: the run's tool index's canonical parameters per call id, which the
        prompt hash reuses (see ``ChatProjector``). ``options``: the run's model options
        (checked), sent with every request; the tool-less summary request drops the tool
        ones. ``timeline``: where each provider request's record goes (the run viewer)."""
        self.host = host
        self.provider = provider
        self.provider_name = provider_name
        # Setting allow_model_requests off (tests): only a provider that never leaves the
        # process (scripted) or a text_result hook may answer.
        # Fails closed: anything but true (false, 0, "no", a bad value) refuses.
        self._requests_refused = (
            not getattr(provider, "answers_offline", False)
            and host.settings.get("allow_model_requests", True) is not True)
        self.model = model
        self.mode = mode
        self.tools = tools
        self.payload = dict(payload)
        self.timeouts = timeouts
        self.emit = emit
        # request_built payloads are built only when someone listens.
        self._emit_active = bool(getattr(emit, "active", True))
        self.single_turn = single_turn
        self.pressure = pressure
        # Asked when the model answers without tool calls (completion policy, nudges).
        self.on_natural_completion = on_natural_completion
        self.turn_gate = turn_gate
        self._turn_input: tuple[list[Message], dict[str, Any]] = ([], {})
        self.projector = ChatProjector(call_keys)
        # ``tools_json``: the JSON of ``tools`` when the caller has it (Tools keep theirs).
        encoded = (tools_json if tools_json is not None
                   else canonical_json(tools)).encode()
        self._tools_bytes = len(encoded)
        self._tools_sha = hashlib.sha256(encoded).hexdigest()
        self._payload_bytes = len(compact_bytes(self.payload)) if self.payload else 2
        self._available_checked = False
        self.last_request_metadata: dict[str, Any] = {}
        # True while the latest answer is a final answer cut off by the output token limit.
        self.answer_truncated = False
        # Tokens spent by the final summary call, which is not a turn of the loop.
        self.summary_usage: dict[str, Any] = {}
        self.has_text_result_hook = bool(host.pm.hook.text_result.get_hookimpls())
        self._tool_names: list[str] = [t["name"] for t in tools]
        self._transport = {"request_timeout": timeouts.request,
                           "connect_timeout": timeouts.connect}
        # Built-in providers answer in normal form already (see providers.normalize).
        self._trusted = bool(getattr(provider, "answers_normalized", False))
        # Each turn's request is a copy of this one with the turn's parts (pydantic's
        # model_copy: the run's own values are not validated again every turn).
        self._request = ProviderRequest(
            messages=[], tools=self.tools, provider=provider_name, model=model, mode=mode,
            payload=self.payload, turn=0, request_timeout=timeouts.request,
            connect_timeout=timeouts.connect, options=dict(options or {}))
        self._answer_trusted = False
        # Streaming (stream_conversation): where text goes as it arrives, the text of the turn
        # being streamed, and whether the consumer asked the run to stop.
        self.stream_text: Callable[[str], None] | None = None
        # The names budget pressure's wrap-up took out of the latest request (shared with the
        # tool executor, which refuses calls to them).
        self.closed_tools: set[str] = set()
        self.partial_text = ""
        self.stop_requested = False
        self._streamed = False
        # What the run's requests spend (token and cost budgets, prices, spend windows).
        self.meter: RunMeter | None = None
        # Whether this run already warned about usage that cannot be true.
        self._usage_warned = False
        # A run observer asked for message content (otel_capture_content): request_built
        # events then carry the request's messages and the answer's text.
        self.report_content = False
        self._sent: list[dict[str, Any]] = []
        self.timeline = timeline
        self._sent_at = 0.0  # when the request being answered was sent (its latency)

    def request_bytes(self, messages: list[Message]) -> int:
        """The JSON size of the request ``messages`` make: messages and tool definitions, as
        they are sent (what the meter's prompt estimate reads)."""
        self.projector.sync(messages)
        return self.projector.bytes + self._tools_bytes

    # -- request building -----------------------------------------------------------------
    def build_request(
        self, messages: list[Message], turn: int,
        budgets: Mapping[str, IterationBudget] | None = None,
        *, extra: list[dict[str, Any]] | None = None, offer_tools: bool = True,
    ) -> ProviderRequest:
        """The provider request of ``turn`` and its metadata (stored on the runner)."""
        chat = self.projector.sync(messages)
        sent = list(chat)
        tools = self.tools if offer_tools else []
        if self.pressure is not None and budgets is not None:
            # Budget pressure notices go into this copy only, never into the transcript.
            sent, tools = self.pressure.apply(sent, tools, budgets)
            self._close_hidden(tools, offer_tools)
        if extra:
            sent.extend(extra)
        # A copy of the run's own request with this turn's parts (not validated: every value
        # is the run's own, checked at set-up, and the messages grow with every turn).
        update: dict[str, Any] = {"messages": sent, "tools": tools, "turn": turn}
        if not offer_tools and self._request.options:
            update["options"] = without_tool_options(self._request.options)
        request = self._request.model_copy(update=update)
        messages_bytes = self.projector.bytes
        self.last_request_metadata = {
            "provider": self.provider_name,
            "model": self.model,
            "mode": self.mode,
            "turn": turn,
            "message_count": len(sent),
            "messages_json_bytes": messages_bytes,
            "tools_json_bytes": self._tools_bytes,
            "request_json_bytes": messages_bytes + self._tools_bytes + self._payload_bytes,
            "prompt_sha256": self.projector.prompt_sha256(),
            "tool_policy_sha256": self._tools_sha,
            "tools": ({"count": len(self._tool_names), "names": list(self._tool_names)}
                      if tools is self.tools
                      else {"count": len(tools), "names": [t["name"] for t in tools]}),
            "transport": dict(self._transport),
        }
        return request

    def _close_hidden(self, offered: list[dict[str, Any]], offer_tools: bool) -> None:
        closed = self.closed_tools
        closed.clear()
        if offer_tools and offered is not self.tools:
            kept = {tool["name"] for tool in offered}
            closed.update(name for name in self._tool_names if name not in kept)

    # -- dispatch -------------------------------------------------------------------------
    def _check_availability(self) -> None:
        if self._available_checked:
            return
        answer = (self.host.first("provider_availability", provider=self.provider_name,
                                  model=self.model)
                  if self.host.pm.hook.provider_availability.get_hookimpls() else None)
        if answer is None:
            own = getattr(self.provider, "availability", None)
            answer = own() if callable(own) else True
        if isinstance(answer, str) and answer.strip():
            raise ProviderError(answer, code="provider_unavailable", provider=self.provider_name)
        if answer is False:
            raise ProviderError(f"Provider {self.provider_name!r} is not available.",
                                code="provider_unavailable", provider=self.provider_name)
        self._available_checked = True

    def __call__(self, messages: list[Message], context: dict[str, Any]) -> Any:
        if self.stop_requested:
            # The stream's consumer left: no more provider calls; the run ends aborted.
            return TurnAnswer("", [], {}, self.last_request_metadata, True, [])
        turn = int(context["turn"])
        self._turn_input = (messages, context)
        request = self.build_request(messages, turn, context.get("budgets"))
        left = context.get("deadline")
        if left is not None and (request.request_timeout <= 0 or left < request.request_timeout):
            # Under the run's time rail: a provider whose call cannot be cancelled (a
            # synchronous HTTP request) gives up when the run's time does.
            request = request.model_copy(update={"request_timeout": max(left, 0.001)})
        if self.report_content:
            self._sent = request.messages
        self._sent_at = clock.monotonic()
        try:
            answer = self._dispatch(request, turn)
        except Exception as exc:
            self._report(turn, success=False, error=exc)
            raise
        if type(answer) is not ProviderResponse and awaitable(answer):
            return self._finish_async(answer, turn)
        return self._finish(answer, turn)

    def _dispatch(self, request: ProviderRequest, turn: int) -> Any:
        """Availability, then the ``text_result`` hook, else the provider: its answer (or an
        awaitable of it)."""
        if self._requests_refused:
            return self._hook_only(request, turn)
        self._check_availability()
        short = (self.host.first("text_result", request=request)
                 if self.has_text_result_hook else None)
        if short is not None:
            self._answer_trusted = False
            return self._from_hook(short, turn)
        self._answer_trusted = self._trusted
        self._streamed = False
        if self.stream_text is not None:
            stream = getattr(self.provider, "stream", None)
            if callable(stream):
                self._streamed = True
                return self._stream(stream(request))
        return self.provider.complete(request)

    def _hook_only(self, request: ProviderRequest, turn: int) -> Any:
        """With model requests off: the ``text_result`` hook's answer, else a clear error
        (the provider is never called, nor asked whether it is available)."""
        short = (self.host.first("text_result", request=request)
                 if self.has_text_result_hook else None)
        if short is None:
            if self.host.settings.source("allow_model_requests") == "env":
                how = "unset the environment variable DATAMACHINE_ALLOW_MODEL_REQUESTS"
            else:
                how = "`datamachine settings set allow_model_requests true`"
            raise ProviderError(
                f"Model requests are off on this host (setting allow_model_requests is false), "
                f"so provider {self.provider_name!r} was not called for turn {turn}. In tests, "
                "answer with the scripted_model fixture or a text_result hook, or run on the "
                f"scripted provider; to allow real requests: {how}.",
                code="model_requests_disabled", provider=self.provider_name)
        self._answer_trusted = False
        return self._from_hook(short, turn)

    async def _stream(self, deltas: Any) -> ProviderResponse:
        """Pass a provider's text on as it arrives; the whole answer at the end (or, when the
        consumer leaves mid-way, the text so far)."""
        sink = self.stream_text
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
                if self.stop_requested:
                    break
        finally:
            await deltas.aclose()
        if response is None:  # left mid-way
            return ProviderResponse(content=self.partial_text, finish_reason="aborted")
        self.partial_text = ""
        return response

    async def _finish_async(self, answer: Awaitable[Any], turn: int) -> TurnAnswer:
        try:
            response = await answer
        except (Exception, asyncio.CancelledError) as exc:
            # A call the wall clock cut is a failed request too: observers still hear of it.
            self._report(turn, success=False, error=exc)
            raise
        return self._finish(response, turn)

    def _from_hook(self, short: Any, turn: int) -> Any:
        if isinstance(short, BaseException):
            raise short
        if isinstance(short, ProviderResponse | Mapping):
            return short
        raise ProviderError(
            f"A text_result hookimpl returned {type(short).__name__}; return a dict, a "
            "ProviderResponse, an Exception or None.",
            code="provider_bad_response", provider=self.provider_name,
        )

    def _finish(self, answer: Any, turn: int) -> TurnAnswer:
        try:
            if not isinstance(answer, ProviderResponse | Mapping):
                raise ProviderError(
                    f"Provider {self.provider_name!r} returned {type(answer).__name__}, "
                    "not a ProviderResponse.",
                    code="provider_bad_response", provider=self.provider_name,
                )
            # A provider that normalizes its own answers (the built-in ones) says so.
            response = (answer if self._answer_trusted and isinstance(answer, ProviderResponse)
                        else normalize_response(answer, provider=self.provider_name, turn=turn))
        except Exception as exc:
            self._report(turn, success=False, error=exc)
            raise
        self.last_request_metadata["response"] = {"finish_reason": response.finish_reason}
        if response.ignored_usage is not None:
            self._ignored_usage(response.ignored_usage)
        if self.meter is not None:
            self.meter.settle(response.usage, response.content, response.tool_calls)
        if self.stream_text is not None and not self._streamed and response.content:
            self.stream_text(response.content)  # a provider that cannot stream: one delta
        # An answer without calls that the output token limit cut off (see verdict.decide).
        self.answer_truncated = (response.finish_reason == "length"
                                 and not response.tool_calls)
        self._report(turn, success=True, usage=response.usage,
                     content=response if self.report_content else None,
                     failed=response.failed_attempts)
        if self.pressure is not None:
            self.pressure.observe(response.content, response.tool_calls)
        calls, complete, continuation = response.tool_calls, self.single_turn, []
        gate = self.turn_gate
        if gate is not None and not gate(turn):
            # Declined at a chat session's limit: this turn's calls do not run, the run ends.
            calls, complete = [], True
        elif self.stop_requested:
            calls, complete = [], True  # the consumer left: this turn's calls do not run
        elif self.on_natural_completion is not None and not calls:
            messages, context = self._turn_input
            continuation = self.on_natural_completion(messages, response.content, context)
        pause = None
        if gate is not None and gate.pending is not None and (calls or continuation) \
                and not complete:
            pause = gate.pending  # at the limit, paused: the calls wait for the answer
        # Every value here is the runner's own (the response was normalized above), so the
        # loop takes it as it is instead of validating a TurnResult every turn.
        return TurnAnswer(response.content, calls, response.usage, self.last_request_metadata,
                          complete, continuation, pause)

    def summarize(self, messages: list[Message], prompt: str) -> Any:
        """One tool-less request for a final summary (not a turn): its text, or an awaitable.

        Goes through the same availability check and ``text_result`` hook as a turn; tool calls
        in the answer are ignored because no tools were offered.
        """
        turn = int(self.last_request_metadata.get("turn", 0)) + 1
        extra = {"role": "user", "content": prompt}
        request = self.build_request(messages, turn, extra=[extra], offer_tools=False)
        self.last_request_metadata["final_summary"] = True
        if self.meter is not None:  # only a summary that fits the run's budgets is asked for
            request = self.meter.admit_summary(
                request, self.projector.bytes + len(compact_bytes(extra)) + 1)
        self._sent_at = clock.monotonic()
        try:
            answer = self._dispatch(request, turn)
        except BaseException as exc:
            self._summary_record(turn, request.options, None, exc)
            if self.meter is not None:
                self.meter.charge_failed()
            raise
        if inspect.isawaitable(answer):
            return self._summary_async(answer, turn)
        return self._summary_text(answer, turn)

    async def _summary_async(self, answer: Awaitable[Any], turn: int) -> str:
        try:
            response = await answer
        except BaseException as exc:
            self._summary_record(turn, self._request.options, None, exc)
            if self.meter is not None:
                self.meter.charge_failed()
            raise
        return self._summary_text(response, turn)

    def _summary_text(self, answer: Any, turn: int) -> str:
        if not isinstance(answer, ProviderResponse | Mapping):
            if self.meter is not None:
                self.meter.release()
            return ""
        response = normalize_response(answer, provider=self.provider_name, turn=turn)
        self._summary_record(turn, self._request.options, response, None)
        if response.ignored_usage is not None:
            self._ignored_usage(response.ignored_usage)
        for key, value in response.usage.items():
            self.summary_usage[key] = self.summary_usage.get(key, 0) + value
        if self.meter is not None:
            self.meter.settle(response.usage, response.content)
        return response.content

    def _request_record(self, options: dict[str, Any], usage: dict[str, Any] | None,
                        failed: tuple[Any, ...], error: BaseException | None,
                        ) -> dict[str, Any]:
        """What the run viewer shows of one request: latency, usage, the options sent, the
        attempts that failed before it, and its error (see ``RunTimeline.request``)."""
        record: dict[str, Any] = {
            "ms": round((clock.monotonic() - self._sent_at) * 1000), "ok": error is None}
        if usage:
            record["usage"] = usage
        if options:
            record["options"] = options
        if failed:
            record["attempts"] = [{"status": a.status, "error": a.error[:300],
                                   "waited": a.waited} for a in failed]
        if error is not None:
            text = ("cancelled at the run's wall-clock limit"
                    if isinstance(error, asyncio.CancelledError) else str(error))
            record["error"] = (text or type(error).__name__)[:500]
        return record

    def _summary_record(self, turn: int, options: dict[str, Any],
                        response: ProviderResponse | None, error: BaseException | None) -> None:
        if self.timeline is None:
            return
        record = self._request_record(
            without_tool_options(options), response.usage if response is not None else None,
            response.failed_attempts if response is not None
            else getattr(error, "failed_attempts", ()), error)
        record["summary"] = True
        self.timeline.request(turn, record)

    def _ignored_usage(self, ignored: dict[str, Any]) -> None:
        """Say once per run that the provider reported usage that cannot be true (its fields
        were left out as not reported, so the meter charged its estimate instead)."""
        if self._usage_warned:
            return
        self._usage_warned = True
        logger.warning(
            "datamachine: provider %r reported usage that cannot be true (%s); those fields "
            "were treated as not reported, so token and cost budgets counted their estimate. "
            "Logged once per run.", self.provider_name,
            ", ".join(f"{key}={brief_repr(value, 40)}" for key, value in ignored.items()))

    def _report(self, turn: int, *, success: bool, error: BaseException | None = None,
                usage: dict[str, Any] | None = None,
                content: ProviderResponse | None = None, failed: tuple[Any, ...] = ()) -> None:
        if not success and self.meter is not None:
            # It may have reached the provider (a timeout, a cut stream): charged its estimate.
            self.meter.charge_failed()
        if self.timeline is not None:
            self.timeline.request(turn, self._request_record(
                self._request.options, usage, failed or getattr(error, "failed_attempts", ()),
                error))
        if not self._emit_active:
            return
        payload: dict[str, Any] = {"turn": turn, "provider": self.provider_name,
                                   "model": self.model, "success": success,
                                   "request_metadata": self.last_request_metadata}
        if usage is not None:
            payload["usage"] = usage
        if self.report_content:
            payload["messages"] = self._sent
            if content is not None:
                payload["content"] = content.content
                payload["tool_calls"] = content.tool_calls
        if isinstance(error, asyncio.CancelledError):
            payload["error"] = "cancelled at the run's wall-clock limit"
        elif error is not None:
            payload["error"] = str(error) or type(error).__name__
        self.emit("request_built", payload)
