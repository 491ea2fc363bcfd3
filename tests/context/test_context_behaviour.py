"""What a run with a context window does around its compactions (DESIGN.md 21): a plugin's
strategy first, pressure only when nothing compacts, async and streamed runs, and what the
summary call costs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
import datamachine
from datamachine import CompactedView, hookimpl
from datamachine.host import Host
from tests.context.windowed_server import WindowedModel, fetch_page, page, serving

PROMPT = [{"role": "user", "content": "Read every page of the site, then say how many."}]


@pytest.fixture
def model() -> Iterator[WindowedModel]:
    with serving(calls=24, window=6000) as server:
        yield server


@datamachine.tool
def fetch_short_page(n: int) -> str:
    """Fetch the short page ``n`` of the site."""
    return page(n, 1500)


def _configure(host: Host, model: WindowedModel) -> None:
    host.settings.set("openai_base_url", model.base_url)
    host.settings.set("context_windows", {"windowed": model.window})


def _sink(events: list[tuple[str, dict[str, Any]]]) -> Any:
    return lambda name, data: events.append((name, data))


class LastPairOnly:
    """A strategy of its own: the first question and the latest call with its result."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    @hookimpl
    def compact_context(self, messages: list[Any], context: dict[str, Any]
                        ) -> CompactedView | None:
        self.asked.append(dict(context))
        return CompactedView([messages[0], *messages[-2:]], strategy="last_pair_only")


class SplitsAPair:
    @hookimpl
    def compact_context(self, messages: list[Any], context: dict[str, Any]
                        ) -> CompactedView | None:
        return CompactedView([messages[0], messages[-1]], strategy="broken")


def test_a_plugin_strategy_is_tried_before_the_built_ins(model: WindowedModel) -> None:
    plugin = LastPairOnly()
    host = bootstrap.boot(":memory:", plugins=[plugin], load_entrypoints=False)
    try:
        _configure(host, model)
        events: list[tuple[str, dict[str, Any]]] = []
        result = host.run_conversation(PROMPT, [fetch_page], "openai", "windowed",
                                       payload={"event_sink": _sink(events)})
    finally:
        host.close()
    assert result.status == "completed", result.error
    compacted = [data for name, data in events if name == "context_compacted"]
    assert compacted
    assert {data["strategy"] for data in compacted} == {"last_pair_only"}
    assert plugin.asked[0]["ceiling"] == 6000
    assert plugin.asked[0]["limit"] == int(6000 * 0.8) - 1024
    assert {"turn", "mode", "session_id", "reserve"} <= set(plugin.asked[0])
    # After the first compaction, what was sent began with the question and one pair.
    turn = compacted[0]["turn"]
    sent = [seen for seen in model.seen if seen.kind == "turn"][turn - 1].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert model.pairing_errors == []


def test_a_plugin_view_that_splits_a_call_from_its_result_is_ignored(
        model: WindowedModel, caplog: pytest.LogCaptureFixture) -> None:
    host = bootstrap.boot(":memory:", plugins=[SplitsAPair()], load_entrypoints=False)
    try:
        _configure(host, model)
        events: list[tuple[str, dict[str, Any]]] = []
        with caplog.at_level(logging.WARNING, logger="datamachine.context"):
            result = host.run_conversation(PROMPT, [fetch_page], "openai", "windowed",
                                           payload={"event_sink": _sink(events)})
    finally:
        host.close()
    assert result.status == "completed", result.error
    assert "has no call before it" in caplog.text
    strategies = {data["strategy"] for name, data in events if name == "context_compacted"}
    assert "broken" not in strategies
    assert "clear_tool_results" in strategies
    assert model.pairing_errors == []


def test_the_window_takes_part_in_pressure_only_with_compaction_off(
        host: Host, model: WindowedModel) -> None:
    _configure(host, model)

    def pressured(compaction: str) -> set[str]:
        model.issued = 0
        events: list[tuple[str, dict[str, Any]]] = []
        model.seen.clear()
        host.run_conversation(PROMPT, [fetch_short_page], "openai", "windowed", payload={
            "event_sink": _sink(events), "budget_pressure": True,
            "context_compaction": compaction})
        tools = [seen.messages for seen in model.seen if seen.kind == "turn"]
        assert tools
        return {data["budget"] for name, data in events if name == "budget_pressure"}

    assert "context_tokens" not in pressured("auto")
    assert "context_tokens" in pressured("off")


def test_an_async_run_compacts_and_recovers_from_an_overflow(host: Host,
                                                             model: WindowedModel) -> None:
    host.settings.set("openai_base_url", model.base_url)  # no window known: it overflows
    result = asyncio.run(host.arun_conversation(PROMPT, [fetch_page], "openai", "windowed"))
    assert result.status == "completed", result.error
    assert result.final_content == "done after 24 pages"
    assert any(seen.refused for seen in model.seen)
    assert result.compactions > 0
    assert model.pairing_errors == []


def test_a_streamed_run_never_streams_a_compaction_summary(host: Host,
                                                          model: WindowedModel) -> None:
    _configure(host, model)
    deltas: list[str] = []
    result = None
    for event in host.stream_conversation(PROMPT, [fetch_page], "openai", "windowed",
                                          payload={"context_compaction": {
                                              "strategies": ["summarize", "drop_oldest"]}}):
        if event.type == "text_delta":
            deltas.append(event.text or "")
        elif event.type == "result":
            result = event.result
    assert result is not None
    assert result.status == "completed", result.error
    assert any(seen.kind == "compaction" for seen in model.seen)
    assert "".join(deltas) == "done after 24 pages"


def test_the_summary_calls_count_in_the_runs_usage(host: Host, model: WindowedModel) -> None:
    _configure(host, model)
    result = host.run_conversation(PROMPT, [fetch_page], "openai", "windowed", payload={
        "context_compaction": {"strategies": ["summarize", "drop_oldest"]}})
    assert result.status == "completed", result.error
    summaries = [seen for seen in model.seen if seen.kind == "compaction"]
    assert summaries
    sent = sum(seen.prompt_tokens for seen in model.seen if not seen.refused)
    assert result.usage["prompt_tokens"] == sent
