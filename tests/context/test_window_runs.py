"""Long runs against a model with a context window (DESIGN.md 21): they finish instead of
dying on the provider's 400, and no request ever separates a tool call from its result.

The model is :class:`WindowedModel`, a real HTTP server on loopback that counts tokens its own
way and refuses long prompts with the error bodies of OpenAI, llama.cpp, llama-cpp-python and
vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import datamachine
from datamachine.host import Host
from tests.context.windowed_server import FLAVOURS, WindowedModel, fetch_page, serving


@pytest.fixture
def model() -> Iterator[WindowedModel]:
    with serving() as server:
        yield server


def _run(host: Host, model: WindowedModel, max_turns: int = 200,
         **payload: Any) -> datamachine.ConversationResult:
    host.settings.set("openai_base_url", model.base_url)
    host.settings.set("max_tool_calls", 1000)
    events: list[tuple[str, dict[str, Any]]] = []
    result = host.run_conversation(
        [{"role": "user", "content": "Read every page of the site, then say how many."}],
        [fetch_page], "openai", "windowed", max_turns=max_turns,
        payload={"event_sink": lambda name, data: events.append((name, data)), **payload})
    result_events[id(result)] = events
    return result


result_events: dict[int, list[tuple[str, dict[str, Any]]]] = {}


def test_a_200_turn_run_with_5kb_results_fits_an_8k_window(host: Host,
                                                           model: WindowedModel) -> None:
    host.settings.set("context_windows", {"windowed": 8192})
    result = _run(host, model)

    assert result.status == "completed", (result.status, result.error, result.warning)
    assert result.final_content == "done after 199 pages"
    assert result.turn_count == 200
    assert model.pairing_errors == []
    refused = [seen for seen in model.seen if seen.refused]
    assert len(refused) <= 2  # the first estimate may be short once; the run learns
    assert result.compactions > 0
    strategies = {data["strategy"] for name, data in result_events[id(result)]
                  if name == "context_compacted"}
    assert "clear_tool_results" in strategies
    assert result.budgets["context_tokens"]["ceiling"] == 8192
    assert result.budgets["context_tokens"]["current"] <= 8192
    # The transcript keeps every message: compaction only changes what is sent.
    results = [m for m in result.messages if m.type == "tool_result"]
    assert len(results) == 199
    assert all("cleared" not in m.metadata for m in results)
    assert "lorem ipsum" in str(results[0].content)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_overflow_answers_of_every_server_are_recovered_from(host: Host, model: WindowedModel,
                                                             flavour: str) -> None:
    # No window is known: the first "prompt too long" answer tells the run what it is.
    model.flavour, model.calls, model.window = flavour, 30, 6000
    result = _run(host, model, model_options={"max_tokens": 200})

    assert result.status == "completed", (result.status, result.error)
    assert result.final_content == "done after 30 pages"
    assert model.pairing_errors == []
    assert any(seen.refused for seen in model.seen)  # it did overflow, and recovered
    assert result.budgets["context_tokens"]["ceiling"] <= 6000
    assert result.compactions > 0


def test_with_compaction_off_the_run_stops_on_the_window_with_a_summary(
        host: Host, model: WindowedModel) -> None:
    host.settings.set("context_windows", {"windowed": 8192})
    result = _run(host, model, context_compaction="off")

    assert result.status == "budget_exceeded"
    assert result.budget == "context_tokens"
    assert "max_context_tokens_reached" in result.flags
    assert result.final_content  # never an empty answer
    assert model.pairing_errors == []
    assert not any(seen.refused for seen in model.seen if seen.kind == "turn"
                   and seen is not model.seen[-1])
    summaries = [seen for seen in model.seen if seen.kind == "final_summary"]
    assert summaries
    assert all(not seen.refused for seen in summaries)
    assert result.compactions == 0


def test_a_tool_call_and_its_result_stay_together_in_every_request(
        host: Host, model: WindowedModel) -> None:
    host.settings.set("context_windows", {"windowed": 4096})
    model.calls = 60
    result = _run(host, model, context_compaction={"keep_turns": 1,
                                                   "strategies": ["drop_oldest"]})

    assert result.status == "completed", (result.status, result.error)
    assert model.pairing_errors == []
    for seen in model.seen:
        assert seen.messages[0]["role"] == "user"  # the first user message is always kept
        assert seen.messages[0]["content"].startswith("Read every page")


def test_a_final_summary_the_model_finds_too_long_is_made_to_fit(host: Host,
                                                                 model: WindowedModel) -> None:
    # No window is known and every turn fits; the summary request is refused as too long
    # once (as llama-cpp-python's chat templates can make it): the run learns the window and
    # sends a summary that fits instead of falling back.
    model.calls, model.summary_window = 50, 2500
    result = _run(host, model, max_turns=3, model_options={"max_tokens": 200})
    assert result.status == "budget_exceeded"
    refused = [seen for seen in model.seen if seen.kind == "final_summary" and seen.refused]
    answered = [seen for seen in model.seen if seen.kind == "final_summary" and not seen.refused]
    assert len(refused) == 1
    assert len(answered) == 1
    assert answered[0].prompt_tokens + (answered[0].max_tokens or 0) <= 2500
    assert result.final_content.startswith("Stopped early")
    assert result.budgets["context_tokens"]["ceiling"] <= 2500
