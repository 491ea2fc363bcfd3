"""The tracing plugin (docs/observability.md): spans, span events and metrics of runs, read back
from the OpenTelemetry SDK's in-memory exporter and metric reader.

The global tracer provider can be set once per process, so each test hands its own SDK
providers to the plugin by replacing ``get_tracer_provider`` / ``get_meter_provider`` for the
test only; a run with neither configured is checked in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import bootstrap
import datamachine
from datamachine import ProviderRequest, Tool, hookimpl, tool
from datamachine.host import Host

ROOT = Path(__file__).resolve().parent.parent


class Telemetry:
    """SDK providers for one test, and what they recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def metric_points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [point for resource in data.resource_metrics for scope in resource.scope_metrics
                for metric in scope.metrics if metric.name == name
                for point in metric.data.data_points]


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    made = Telemetry()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: made.tracer_provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: made.meter_provider)
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


@tool
def search(query: str) -> str:
    """Search.

    Args:
        query: What to look for.
    """
    return f"found {query}"


@tool
def broken(query: str) -> str:
    """Always fails.

    Args:
        query: Anything.
    """
    raise RuntimeError("the index is down")


class Model:
    """Calls ``search`` then ``broken`` every turn; answers the summary call (no tools)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        if self.fail:
            return ConnectionError("the model server is down")
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        if not request.tools:
            return {"content": "Searched twice; nothing left.", "usage": usage}
        turn = request.turn
        return {"tool_calls": [
            {"id": f"s{turn}", "name": "search", "parameters": {"query": f"q{turn}"}},
            {"id": f"b{turn}", "name": "broken", "parameters": {"query": "secret words"}}],
            "usage": usage}


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def budget_stopped_run(host: Host) -> Any:
    return host.run_conversation(
        [{"role": "user", "content": "Find things."}], [search, broken], "scripted", "demo",
        max_turns=2, payload={"budget_pressure": True, "agent_slug": "librarian"})


def test_a_budget_stopped_run_with_tools_is_one_trace_of_agent_chat_and_tool_spans(
        telemetry: Telemetry) -> None:
    with boot(Model()) as host:
        result = budget_stopped_run(host)
    assert result.status == "budget_exceeded"
    (run,) = telemetry.named("invoke_agent librarian")
    chats = telemetry.named("chat demo")
    tools = telemetry.named("execute_tool search") + telemetry.named("execute_tool broken")
    assert len(telemetry.spans()) == 1 + len(chats) + len(tools)
    assert len(chats) == 3  # two turns and the final summary call
    assert len(tools) == 4
    assert {s.context.trace_id for s in telemetry.spans()} == {run.context.trace_id}
    assert run.parent is None
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id
               for s in chats + tools)
    assert run.kind is SpanKind.INTERNAL
    assert run.attributes is not None
    assert dict(run.attributes).items() >= {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "scripted",
        "gen_ai.system": "scripted", "gen_ai.request.model": "demo",
        "gen_ai.agent.name": "librarian",
        "gen_ai.conversation.id": result.transcript_session_id,
        "datamachine.status": "budget_exceeded", "datamachine.stop_budget": "conversation_turns",
        "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": 9}.items()
    assert run.status.status_code is StatusCode.UNSET

    turns = [c for c in chats if c.attributes and "datamachine.final_summary" not in c.attributes]
    (summary,) = [c for c in chats if c.attributes and c.attributes.get(
        "datamachine.final_summary") is True]
    assert [c.attributes["datamachine.turn"] for c in turns if c.attributes] == [1, 2]
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert chat.attributes is not None
        assert dict(chat.attributes).items() >= {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "demo", "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 3}.items()
    assert summary.attributes is not None
    assert summary.attributes["datamachine.summary.source"] == "model"
    assert summary.start_time is not None
    assert max(
        t.end_time or 0 for t in turns) <= summary.start_time

    for span in tools:
        assert span.attributes is not None
        name = str(span.attributes["gen_ai.tool.name"])
        assert span.name == f"execute_tool {name}"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert str(span.attributes["gen_ai.tool.call.id"])[0] == name[0]
        assert "gen_ai.tool.call.arguments" not in span.attributes  # content is off
        failed = name == "broken"
        assert span.status.status_code is (StatusCode.ERROR if failed else StatusCode.UNSET)

    events = {e.name: dict(e.attributes or {}) for e in run.events}
    assert events["datamachine.budget_exceeded"].items() >= {
        "datamachine.budget.name": "conversation_turns", "datamachine.budget.current": 2,
        "datamachine.budget.ceiling": 2}.items()
    assert events["datamachine.budget_pressure"]["datamachine.budget.name"] == \
        "conversation_turns"

    (exhausted,) = telemetry.metric_points("datamachine.budget.exhaustions")
    assert exhausted.value == 1
    assert dict(exhausted.attributes) == {"datamachine.budget.name": "conversation_turns"}
    usage = {p.attributes["gen_ai.token.type"]: p for p in
             telemetry.metric_points("gen_ai.client.token.usage")}
    assert (usage["input"].sum, usage["input"].count) == (30, 3)  # the summary call too
    assert usage["output"].sum == 9


def test_an_extended_budget_is_a_span_event(telemetry: Telemetry) -> None:
    class Yes:
        @hookimpl
        def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool:
            return bool(context["kind"] == "budget_exhausted" and budget.ceiling() < 3)

    with boot(Model(), Yes()) as host:
        result = host.run_conversation([{"role": "user", "content": "go"}], [search],
                                       "scripted", "demo", max_turns=2,
                                       payload={"extend_by": 1})
    assert result.turn_count == 3
    (run,) = telemetry.named("invoke_agent")
    extended = [dict(e.attributes or {}) for e in run.events
                if e.name == "datamachine.budget_extended"]
    assert extended == [{"datamachine.budget.name": "conversation_turns",
                         "datamachine.budget.current": 2, "datamachine.budget.ceiling": 3}]


def test_content_is_in_tool_spans_only_with_the_setting_on(telemetry: Telemetry) -> None:
    with boot(Model()) as host:
        host.settings.set("otel_capture_content", True)
        budget_stopped_run(host)
    (span,) = [s for s in telemetry.named("execute_tool broken")
               if s.attributes and s.attributes["gen_ai.tool.call.id"] == "b1"]
    assert span.attributes is not None
    assert json.loads(str(span.attributes["gen_ai.tool.call.arguments"])) == {
        "query": "secret words"}
    assert "the index is down" in str(span.attributes["gen_ai.tool.call.result"])
    # ...and each provider request's messages and answer on its chat span.
    first = min(telemetry.named("chat demo"), key=lambda s: s.start_time or 0)
    assert first.attributes is not None
    sent = json.loads(str(first.attributes["gen_ai.input.messages"]))
    # What was sent: the user's message, then the pressure notice (never stored, sent).
    assert sent[0] == {"role": "user", "content": "Find things."}
    assert sent[-1]["content"].startswith("[BUDGET WARNING")
    [answer] = json.loads(str(first.attributes["gen_ai.output.messages"]))
    assert answer["role"] == "assistant"
    assert [call["name"] for call in answer["tool_calls"]] == ["search", "broken"]


def test_no_content_anywhere_with_the_setting_off(telemetry: Telemetry) -> None:
    seen: list[dict[str, Any]] = []
    with boot(Model()) as host:
        host.run_conversation(
            [{"role": "user", "content": "Find things."}], [search, broken], "scripted",
            "demo", max_turns=2,
            payload={"event_sink": lambda event, payload: seen.append(payload)})
    for span in telemetry.spans():
        text = json.dumps(dict(span.attributes or {}))
        assert "Find things" not in text
        assert "secret words" not in text
    assert all("messages" not in payload for payload in seen)  # nobody asked for content


def test_a_failed_provider_call_fails_its_chat_span_and_the_run_span(
        telemetry: Telemetry) -> None:
    with boot(Model(fail=True)) as host:
        result = host.run_conversation([{"role": "user", "content": "Hello?"}],
                                       provider="scripted", model="demo")
    assert result.status == "error"
    (run,) = telemetry.named("invoke_agent")
    (chat,) = telemetry.named("chat demo")
    assert chat.status.status_code is StatusCode.ERROR
    # An error's text may quote the request: only with content capture on.
    assert not chat.status.description
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == "provider_error"
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes is not None
    assert run.attributes["datamachine.status"] == "error"
    assert chat.parent is not None
    assert chat.parent.span_id == run.context.span_id


def test_error_text_is_in_spans_only_with_the_setting_on(telemetry: Telemetry) -> None:
    with boot(Model(fail=True)) as host:
        host.settings.set("otel_capture_content", True)
        host.run_conversation([{"role": "user", "content": "Hello?"}], provider="scripted",
                              model="demo")
    (chat,) = telemetry.named("chat demo")
    assert chat.status.description == "the model server is down"


@tool
def interrupted(query: str) -> str:
    """Stops the process (Ctrl-C) in the middle of a tool.

    Args:
        query: Ignored.
    """
    raise KeyboardInterrupt


def test_a_run_ended_by_an_exception_mid_tool_ends_its_spans_and_leaks_no_context(
        telemetry: Telemetry) -> None:
    # The tool span's context stayed current in the caller, and no span of the run ended.
    tracer = telemetry.tracer_provider.get_tracer("app")
    script = [{"tool_calls": [{"id": "i1", "name": "interrupted",
                               "parameters": {"query": "x"}}]}]
    with boot() as host, tracer.start_as_current_span("request") as outer:
        with pytest.raises(KeyboardInterrupt):
            host.run_conversation([{"role": "user", "content": "go"}], [interrupted],
                                  "scripted", "demo", payload={"script": script})
        assert trace.get_current_span() is outer
    (tool_span,) = telemetry.named("execute_tool interrupted")
    (run,) = telemetry.named("invoke_agent")
    assert tool_span.status.status_code is StatusCode.ERROR
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes is not None
    assert run.attributes["error.type"] == "KeyboardInterrupt"


def test_a_run_refused_during_set_up_ends_its_span(telemetry: Telemetry) -> None:
    with boot() as host, pytest.raises(datamachine.UsageError):
        host.run_conversation([{"role": "user", "content": "go"}],
                              payload={"budget_ceilings": {"cost": 5}})
    (run,) = telemetry.named("invoke_agent")
    assert run.status.status_code is StatusCode.ERROR


def test_a_sync_stream_continues_the_callers_trace(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")
    with boot() as host, tracer.start_as_current_span("request") as outer:
        events = list(host.stream_conversation([{"role": "user", "content": "hi"}]))
    assert events[-1].type == "result"
    (run,) = telemetry.named("invoke_agent")
    assert run.parent is not None
    assert run.parent.span_id == outer.get_span_context().span_id


def test_marked_events_carry_no_text_without_the_setting(telemetry: Telemetry) -> None:
    from datamachine.default_plugins._otel_observer import SpanObserver
    from datamachine.observe import RunInfo

    observer = SpanObserver.start(telemetry.tracer_provider,
                                  RunInfo(provider="p", model="m", mode="chat"), capture=False)
    observer.event("completion_nudge_added", {
        "completion_nudge": "Original request: my password is hunter2",
        "completion_nudge_count": 1})
    observer.event("blocker_reported", {"reason": "the user's secret plan", "turn": 2})
    observer.event("completed", {"status": "incomplete"})
    (run,) = telemetry.spans()
    text = json.dumps([dict(e.attributes or {}) for e in run.events])
    assert "hunter2" not in text
    assert "secret plan" not in text
    assert [dict(e.attributes or {}) for e in run.events] == [
        {"completion_nudge_count": 1}, {"turn": 2}]


def test_a_run_is_a_child_of_the_span_current_where_it_starts(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")
    with boot(Model()) as host, tracer.start_as_current_span("request") as outer:
        host.run_conversation([{"role": "user", "content": "go"}], [search], "scripted",
                              "demo", max_turns=1, payload={"final_summary": False})
        # Every tool span's context was detached at its result: the outer span is current.
        assert trace.get_current_span() is outer
    (run,) = telemetry.named("invoke_agent")
    assert run.parent is not None
    assert run.parent.span_id == outer.get_span_context().span_id


def test_without_a_tracer_provider_runs_are_not_observed(tmp_path: Path) -> None:
    code = (
        "import bootstrap\n"
        "from datamachine.conversation import conversation_run as run_module\n"
        "made = []\n"
        "real = run_module.RunEvents\n"
        "def spy(*a, **k):\n"
        "    e = real(*a, **k); made.append(e.active); return e\n"
        "run_module.RunEvents = spy\n"
        "host = bootstrap.boot(db_path=':memory:', load_entrypoints=False)\n"
        "assert 'datamachine.default_plugins.otel' in host.plugins\n"
        "r = host.run_conversation([{'role': 'user', 'content': 'hi'}], provider='scripted',\n"
        "                          model='demo', payload={'script': [{'content': 'ok'}]})\n"
        "assert r.status == 'completed'\n"
        "print(made)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60, env=dict(os.environ)).stdout
    assert out.strip() == "[False]"


def test_a_call_paused_for_approval_is_not_traced_as_run_or_failed(
        telemetry: Telemetry) -> None:
    # Its execute_tool span stayed open as if successful until the run ended.
    guarded = Tool(name="delete_all", description="Deletes everything.",
                   parameters={"type": "object", "properties": {}},
                   function=lambda: "deleted", runtime={"requires_approval": True})
    script = [{"tool_calls": [{"id": "d1", "name": "delete_all", "parameters": {}}]}]
    with boot() as host:
        result = host.run_conversation([{"role": "user", "content": "clean up"}], [guarded],
                                       "scripted", "demo",
                                       payload={"script": script, "confirmation": "pause"})
    assert result.status == "awaiting_confirmation"
    spans = telemetry.named("execute_tool delete_all")
    assert len(spans) == 1
    assert all(span.attributes is not None and span.attributes["datamachine.tool.paused"]
               for span in spans)
    assert all(span.status.status_code is not StatusCode.ERROR for span in spans)
    (run,) = telemetry.named("invoke_agent")
    assert run.status.status_code is not StatusCode.ERROR


def test_each_compaction_is_a_span_event(telemetry: Telemetry) -> None:
    """DESIGN.md 21: a compaction is a mark on the run's span, with its numbers only."""

    @datamachine.tool
    def read_page(n: int) -> str:
        """Read page ``n``."""
        return f"page {n}: " + "lorem ipsum " * 150

    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_page", "parameters": {"n": n}}]} for n in range(1, 9)]
    script.append({"content": "I read 8 pages."})
    with boot() as host:
        host.settings.set("context_windows", {"small": 2048})
        result = host.run_conversation([{"role": "user", "content": "Read the report."}],
                                       [read_page], "scripted", "small",
                                       payload={"script": script})
    assert result.compactions > 0
    (run,) = telemetry.named("invoke_agent")
    marks = [dict(e.attributes or {}) for e in run.events
             if e.name == "datamachine.context_compacted"]
    assert len(marks) == result.compactions
    assert set(marks[0]) == {"strategy", "turn", "tokens_before", "tokens_after",
                             "messages_removed"}
    assert marks[0]["strategy"] == "clear_tool_results"
    after, before = marks[0]["tokens_after"], marks[0]["tokens_before"]
    assert isinstance(after, int)
    assert isinstance(before, int)
    assert after < before


def test_each_loop_guard_step_is_a_span_event_and_a_stop_names_its_flag(
        telemetry: Telemetry) -> None:
    """DESIGN.md 22 and 23: the guard's steps are marks on the run's span; the stop on
    stuck_turns carries its flag on the budget event and on the run's span."""

    @datamachine.tool
    def lookup(city: str) -> str:
        """Look a city up."""
        raise ValueError(f"no city named {city}")

    script = [{"tool_calls": [{"name": "lookup", "parameters": {"city": "Atlantis"}}]}] * 6
    with boot() as host:
        result = host.run_conversation([{"role": "user", "content": "Where is Atlantis?"}],
                                       [lookup], "scripted", "demo",
                                       payload={"script": script, "final_summary": False})
    assert result.budget == "stuck_turns"
    (run,) = telemetry.named("invoke_agent")
    marks = [dict(e.attributes or {}) for e in run.events
             if e.name == "datamachine.loop_guard"]
    assert [(m["signal"], m["step"], m["turn"]) for m in marks] == [
        ("repeated_failure", "nudge", 2), ("repeated_failure", "hide_tool", 3),
        ("hidden_tool_called", "stop", 4)]
    (spent,) = [dict(e.attributes or {}) for e in run.events
                if e.name == "datamachine.budget_exceeded"]
    assert spent["datamachine.budget.flag"] == "max_stuck_turns_reached"
    assert run.attributes is not None
    assert run.attributes["datamachine.flags"] == ("max_stuck_turns_reached",)
