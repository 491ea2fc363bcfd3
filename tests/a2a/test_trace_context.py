"""W3C trace context across agent-to-agent calls: ``call_remote_agent`` sends ``traceparent``
and ``/chat`` continues it, so a chain of sites is one trace (docs/observability.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from datamachine.server.site import bound_host
from tests.a2a.conftest import MakeSite, link


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every site of the test (one process) traces to one in-memory exporter."""
    made = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(made))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield made
    provider.shutdown()


# Under a wall-clock rail a sync tool runs in its own thread: the tool's span goes with it.
@pytest.mark.parametrize("payload", [{}, {"max_seconds": 60}], ids=["plain", "time_rail"])
def test_a_chain_of_three_sites_is_one_trace(make_site: MakeSite, exporter: InMemorySpanExporter,
                                             payload: dict[str, Any]) -> None:
    from datamachine.default_plugins.remote_agent import call_remote_agent

    c = make_site("c")
    b = make_site("b", next_site="c")
    a = make_site("a", next_site="b")
    link(a, b, c)
    with bound_host(a.host):
        result = a.host.run_conversation([{"role": "user", "content": "hi"}],
                                         tools=[call_remote_agent], mode="chat",
                                         payload=payload)
    assert result.status == "completed", result.final_content

    spans = list(exporter.get_finished_spans())
    runs = [s for s in spans if s.name == "invoke_agent"]
    calls = [s for s in spans if s.name == "execute_tool call_remote_agent"]
    assert len(runs) == 3
    assert len(calls) == 2
    assert len({s.context.trace_id for s in spans}) == 1

    def parent_of(span: ReadableSpan) -> ReadableSpan | None:
        found = [s for s in spans if span.parent and s.context.span_id == span.parent.span_id]
        return found[0] if found else None

    roots = [r for r in runs if r.parent is None]
    assert len(roots) == 1  # site a's run; b's and c's continue the calling tool's span
    for run in runs:
        if run is not roots[0]:
            caller = parent_of(run)
            assert caller is not None
            assert caller.name == "execute_tool call_remote_agent"
    (hit,) = b.server.app.chat_hits()
    assert hit.headers["traceparent"].split("-")[1] == format(roots[0].context.trace_id, "032x")


def test_without_a_tracer_provider_no_traceparent_is_sent(make_site: MakeSite) -> None:
    from datamachine.default_plugins.remote_agent import call_remote_agent

    b = make_site("b")
    a = make_site("a", next_site="b")
    link(a, b)
    with bound_host(a.host):
        result = a.host.run_conversation([{"role": "user", "content": "hi"}],
                                         tools=[call_remote_agent], mode="chat")
    assert result.status == "completed", result.final_content
    (hit,) = b.server.app.chat_hits()
    assert "traceparent" not in hit.headers


def test_only_the_w3c_trace_context_crosses_and_only_where_tracing_is_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Upstream baggage (user.email=...) was passed on to every remote site, and a site with
    # no tracer provider still read and re-sent the caller's context.
    from opentelemetry import baggage, context

    from datamachine.default_plugins.remote_agent import _inject_trace_context
    from datamachine.server.app import continue_trace

    incoming = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
                "baggage": "user.email=alice%40example.com"}
    unset = trace.ProxyTracerProvider()  # what the API answers while nobody configured one
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: unset)
    assert continue_trace(incoming) is None  # no provider configured: nothing read
    sent: dict[str, str] = {}
    _inject_trace_context(sent)
    assert sent == {}

    provider = TracerProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    token = continue_trace(incoming)
    assert token is not None
    try:
        assert baggage.get_all() == {}  # the caller's baggage is not this site's
        sent = {}
        _inject_trace_context(sent)
        assert set(sent) == {"traceparent"}
        assert sent["traceparent"].split("-")[1] == "ab" * 16
    finally:
        context.detach(token)  # type: ignore[arg-type]
        provider.shutdown()
