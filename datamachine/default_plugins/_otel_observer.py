"""The span observer of one run: loop events to OpenTelemetry spans, span events and metrics,
following the GenAI semantic conventions (docs/observability.md lists what is emitted).

Imported only once a tracer provider is configured (see :mod:`.otel`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import context, metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from datamachine import __version__
from datamachine.observe import RunInfo

SCOPE = "datamachine"
BUDGET_EVENTS = frozenset({"budget_pressure", "budget_exceeded", "budget_extended"})
TERMINAL_EVENTS = frozenset({"completed", "failed"})
# Other run events worth a mark on the run's span (their scalar payload values as attributes).
MARKED_EVENTS = frozenset({"blocker_reported", "completion_nudge_added", "turn_interrupted",
                           "transcript_lock_contention", "completion_assertions_unavailable",
                           "context_compacted", "context_overflow", "loop_guard"})
# What of their payloads a span event may carry without otel_capture_content: counts and ids,
# never text a person or a model wrote (a nudge quotes the user's request, a blocker's reason
# is the model's words).
MARKED_KEYS = frozenset({"turn", "tool_call_id", "completion_nudge_count",
                         "completion_nudge_turn", "message_count", "reason", "budget",
                         "session_id", "strategy", "tokens_before", "tokens_after",
                         "messages_removed", "ceiling", "sent_tokens", "signal", "tool",
                         "step", "count"})
_TEXT_KEYS = frozenset({"reason"})  # carried only with capture on
_SCALARS = (str, bool, int, float)
# The GenAI conventions' advice for gen_ai.client.token.usage: powers of 4 up to 4**13.
TOKEN_BUCKETS = [float(4 ** n) for n in range(14)]


@dataclass(frozen=True)
class _Instruments:
    """A tracer and the two metric instruments, made once per tracer/meter provider pair."""

    tracer_provider: Any
    meter_provider: Any
    tracer: trace.Tracer
    token_usage: metrics.Histogram
    exhaustions: metrics.Counter


_cached: list[_Instruments] = []  # at most one: the providers in use


def _instruments(tracer_provider: Any) -> _Instruments:
    meter_provider = metrics.get_meter_provider()
    if _cached and _cached[0].tracer_provider is tracer_provider \
            and _cached[0].meter_provider is meter_provider:
        return _cached[0]
    meter = meter_provider.get_meter(SCOPE, __version__)
    made = _Instruments(
        tracer_provider, meter_provider, tracer_provider.get_tracer(SCOPE, __version__),
        meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                               description="Tokens used by each provider request.",
                               explicit_bucket_boundaries_advisory=TOKEN_BUCKETS),
        meter.create_counter("datamachine.budget.exhaustions", unit="{run}",
                             description="Runs stopped by a budget, by budget name."))
    _cached[:] = [made]
    return made


class SpanObserver:
    """One run's spans: ``invoke_agent`` for the run, ``chat <model>`` per provider request
    (and the final summary call), ``execute_tool <tool>`` per tool call."""

    def __init__(self, instruments: _Instruments, run: RunInfo, capture: bool) -> None:
        self.instruments = instruments
        self.run = run
        self.capture = capture
        # With capture on, the run sends each request's messages and answer (observe.py).
        self.wants_content = capture
        self.common = {"gen_ai.provider.name": run.provider, "gen_ai.system": run.provider,
                       "gen_ai.request.model": run.model}
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", **self.common,
                                      "datamachine.mode": run.mode,
                                      "datamachine.continuation": run.continuation}
        if run.session_id is not None:
            attributes["gen_ai.conversation.id"] = run.session_id
        if run.agent_slug is not None:
            attributes["gen_ai.agent.name"] = run.agent_slug
        name = f"invoke_agent {run.agent_slug}" if run.agent_slug else "invoke_agent"
        # A child of whatever is current where the run is set up (a /chat request's caller).
        self.span = instruments.tracer.start_span(name, kind=SpanKind.INTERNAL,
                                                  attributes=attributes)
        self.context = trace.set_span_in_context(self.span)
        self.chat: Span | None = None
        self.tools: dict[str, tuple[Span, object]] = {}
        self.summary_start: int | None = None
        self.tokens = {"input": 0, "output": 0}
        self.closed = False

    @classmethod
    def start(cls, tracer_provider: Any, run: RunInfo, *, capture: bool) -> SpanObserver:
        """The observer of ``run``, its ``invoke_agent`` span started now."""
        return cls(_instruments(tracer_provider), run, capture)

    def event(self, name: str, payload: dict[str, Any]) -> None:
        """Turn one run event into span starts, ends and events."""
        if name == "turn_started":
            self._start_chat(payload)
        elif name == "request_built":
            self._end_chat(payload)
        elif name == "tool_call":
            self._start_tool(payload)
        elif name == "tool_result":
            self._end_tool(payload)
        elif name in BUDGET_EVENTS:
            self._budget(name, payload)
        elif name == "final_summary":
            self._summary(payload)
        elif name in TERMINAL_EVENTS:
            self._finish(name, payload)
        elif name in MARKED_EVENTS:
            self.span.add_event(f"datamachine.{name}", {
                key: value for key, value in payload.items()
                if isinstance(value, _SCALARS) and (self.capture or (
                    key in MARKED_KEYS and key not in _TEXT_KEYS))})

    # -- provider requests ------------------------------------------------------------------
    def _chat_span(self, start_time: int | None = None) -> Span:
        return self.instruments.tracer.start_span(
            f"chat {self.run.model}", context=self.context, kind=SpanKind.CLIENT,
            start_time=start_time,
            attributes={"gen_ai.operation.name": "chat", **self.common})

    def _start_chat(self, payload: dict[str, Any]) -> None:
        if self.chat is not None:  # a request that never reported (cannot happen; be safe)
            self.chat.end()
        self.chat = self._chat_span()
        self.chat.set_attribute("datamachine.turn", payload.get("turn", 0))

    def _end_chat(self, payload: dict[str, Any]) -> None:
        span, self.chat = self.chat, None
        if span is None:
            return
        metadata = payload.get("request_metadata") or {}
        finish = (metadata.get("response") or {}).get("finish_reason")
        if finish:
            span.set_attribute("gen_ai.response.finish_reasons", [str(finish)])
        self._usage(span, payload.get("usage"))
        if self.capture and "messages" in payload:
            span.set_attribute("gen_ai.input.messages", _json(payload["messages"]))
            if "content" in payload:
                answer: dict[str, Any] = {"role": "assistant", "content": payload["content"]}
                if payload.get("tool_calls"):
                    answer["tool_calls"] = payload["tool_calls"]
                span.set_attribute("gen_ai.output.messages", _json([answer]))
        if not payload.get("success", True):
            span.set_attribute("error.type", "provider_error")
            span.set_status(Status(StatusCode.ERROR, self._said(payload.get("error"))))
        span.end()

    def _usage(self, span: Span, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        histogram = self.instruments.token_usage
        for kind, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                span.set_attribute(f"gen_ai.usage.{kind}_tokens", value)
                self.tokens[kind] += value
                histogram.record(value, {"gen_ai.operation.name": "chat", **self.common,
                                         "gen_ai.token.type": kind})

    # -- tools ------------------------------------------------------------------------------
    def _start_tool(self, payload: dict[str, Any]) -> None:
        tool, call_id = str(payload.get("tool_name")), str(payload.get("tool_call_id"))
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool",
                                      "gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id,
                                      "gen_ai.tool.type": "function"}
        if self.capture:
            attributes["gen_ai.tool.call.arguments"] = _json(payload.get("parameters"))
        span = self.instruments.tracer.start_span(f"execute_tool {tool}", context=self.context,
                                                  kind=SpanKind.INTERNAL, attributes=attributes)
        # Current while the tool runs, so what it calls (call_remote_agent's traceparent) is
        # its child; detached at its result, on the same thread or task.
        token = context.attach(trace.set_span_in_context(span, self.context))
        self.tools[call_id] = (span, token)

    def _end_tool(self, payload: dict[str, Any]) -> None:
        found = self.tools.pop(str(payload.get("tool_call_id")), None)
        if found is None:
            return
        span, token = found
        context.detach(token)  # type: ignore[arg-type]
        result = payload.get("result")
        if self.capture:
            span.set_attribute("gen_ai.tool.call.result", _json(result))
        if not payload.get("success"):
            error = result.get("error_type") if isinstance(result, dict) else None
            message = result.get("error") if isinstance(result, dict) else None
            span.set_attribute("error.type", str(error or "tool_error"))
            span.set_status(Status(StatusCode.ERROR, self._said(message)))
        span.end()

    # -- budgets and the final summary ------------------------------------------------------
    def _budget(self, name: str, payload: dict[str, Any]) -> None:
        budget = str(payload.get("budget"))
        attributes: dict[str, Any] = {"datamachine.budget.name": budget}
        for key in ("current", "ceiling"):
            value = payload.get(key)
            if isinstance(value, _SCALARS):
                attributes[f"datamachine.budget.{key}"] = value
        for key in ("tier", "rail", "dimension", "flag"):
            value = payload.get(key)
            if isinstance(value, str):
                attributes[f"datamachine.budget.{key}"] = value
        self.span.add_event(f"datamachine.{name}", attributes)
        if name == "budget_exceeded":
            self.instruments.exhaustions.add(1, {"datamachine.budget.name": budget})
            # A final summary call may follow; its span starts here, once it is known.
            self.summary_start = time.time_ns()

    def _summary(self, payload: dict[str, Any]) -> None:
        span = self._chat_span(self.summary_start)
        self.summary_start = None
        span.set_attribute("datamachine.final_summary", True)
        span.set_attribute("datamachine.summary.source", str(payload.get("source")))
        span.set_attribute("datamachine.summary.attempts", payload.get("attempts", 0))
        self._usage(span, payload.get("usage"))
        if payload.get("error"):
            span.set_attribute("error.type", "provider_error")
            span.set_status(Status(StatusCode.ERROR, self._said(payload["error"])))
        span.end()

    # -- the end ----------------------------------------------------------------------------
    def _finish(self, name: str, payload: dict[str, Any]) -> None:
        failed = name == "failed"
        if self.chat is not None:
            self._end_chat({"success": not failed, "error": payload.get("error")})
        # Tools still open (cannot happen after a terminal event; never leak a context).
        paused = payload.get("status") == "awaiting_confirmation"
        for span, token in reversed(list(self.tools.values())):
            context.detach(token)  # type: ignore[arg-type]
            if paused:  # waits for a person's answer: not run, not failed
                span.set_attribute("datamachine.tool.paused", True)
            else:
                span.set_status(Status(StatusCode.ERROR, ""))
                span.set_attribute("error.type", "run_ended")
            span.end()
        self.tools.clear()
        span = self.span
        span.set_attribute("datamachine.status", str(payload.get("status")))
        if payload.get("budget"):
            span.set_attribute("datamachine.stop_budget", str(payload["budget"]))
        flags = payload.get("flags")
        if isinstance(flags, list) and flags:
            span.set_attribute("datamachine.flags", [str(flag) for flag in flags])
        for key in ("turn_count", "tool_results"):
            value = payload.get(key)
            if isinstance(value, int):
                span.set_attribute(f"datamachine.{key}", value)
        for kind, total in self.tokens.items():
            if total:
                span.set_attribute(f"gen_ai.usage.{kind}_tokens", total)
        if failed:
            span.set_attribute("error.type", str(payload.get("error_code") or "run_failed"))
            span.set_status(Status(StatusCode.ERROR, self._said(payload.get("error"))))
        span.end()
        self.closed = True

    def _said(self, text: Any) -> str:
        """An error's text for a span status: only with content capture on (a tool's error
        often quotes its arguments, a provider's the request); else an empty description, the
        ``error.type`` attribute saying what kind of failure it was."""
        return str(text or "") if self.capture else ""

    def close(self, error: BaseException | None) -> None:
        """The run is over. After its terminal event nothing is left; a run that ended by an
        exception, a cancellation or a closed step generator has no terminal event: its open
        spans end here, failed, and an attached tool context is detached."""
        if self.closed:
            return
        kind = type(error).__name__ if error is not None else "run_ended_without_result"
        self._finish("failed", {"status": "error", "error_code": kind,
                                "error": str(error) if error is not None else ""})


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
