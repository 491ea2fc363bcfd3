"""The ``anthropic`` provider against LLMock's Messages API (a third-party mock server on
loopback, started by its pytest fixture), every request body checked against the official
``anthropic`` package's request types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import datamachine_anthropic
import pytest
from anthropic_types import messages_problems
from datamachine_anthropic import AnthropicProvider, build_messages_body, parse_message
from llmock.pytest_plugin import LLMock
from llmock.scenarios import Fail, Match, Reply, ToolCall

import bootstrap
import datamachine
from datamachine import ProviderRequest
from datamachine.errors import ProviderError
from datamachine.host import Host

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS: list[str] = []


@datamachine.tool
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city.
    """
    CALLS.append(city)
    return f"21C in {city}"


@pytest.fixture
def host(llmock: LLMock) -> Iterator[Host]:
    CALLS.clear()
    booted = bootstrap.boot(db_path=":memory:", plugins=[datamachine_anthropic],
                            load_entrypoints=False)
    try:
        yield booted
    finally:
        booted.close()


def _bodies(llmock: LLMock) -> list[dict[str, Any]]:
    bodies = [r.body for r in llmock.requests if r.path.endswith("/v1/messages")]
    for body in bodies:
        assert messages_problems(body) == [], body
    return bodies


def test_a_tool_loop_with_system_prompt_usage_and_headers(llmock: LLMock, host: Host) -> None:
    messages = [{"role": "system", "content": "You report weather."}, *USER]

    result = host.run_conversation(messages, [get_weather], "anthropic", "claude-sonnet-4-6",
                                   mode="chat", payload={"model_options": {"max_tokens": 300}})

    assert result.status == "completed", result.error
    assert len(CALLS) == 1
    assert result.usage["prompt_tokens"] > 0
    assert result.usage["total_tokens"] == (result.usage["prompt_tokens"]
                                            + result.usage["completion_tokens"])
    first, second = _bodies(llmock)
    assert first["system"] == "You report weather."
    assert first["max_tokens"] == 300
    assert first["tools"][0]["name"] == "get_weather"
    assert first["tools"][0]["input_schema"]["required"] == ["city"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"][-1]["type"] == "tool_use"
    assert second["messages"][2]["content"][0]["type"] == "tool_result"
    assert second["messages"][2]["content"][0]["tool_use_id"] == (
        second["messages"][1]["content"][-1]["id"])


def test_a_runaway_is_stopped_with_pressure_and_a_tool_less_summary(
    llmock: LLMock, host: Host
) -> None:
    for n in range(10):
        llmock.add(Reply(tool_calls=(ToolCall("get_weather", {"city": f"city {n}"}),),
                         match=Match(provider="anthropic", tools=True)))

    result = host.run_conversation(
        USER, [get_weather], "anthropic", "claude-sonnet-4-6", max_turns=3,
        payload={"budget_pressure": True,
                 "model_options": {"tool_choice": "required", "parallel_tool_calls": False}})

    assert result.status == "budget_exceeded"
    assert len(CALLS) == 3
    bodies = _bodies(llmock)
    assert len(bodies) == 4
    assert bodies[0]["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    last_turn = bodies[2]
    assert "budget" in (last_turn.get("system", "") + str(last_turn["messages"])).lower()
    summary = bodies[-1]
    assert "tools" not in summary
    assert "tool_choice" not in summary
    assert "[BUDGET EXHAUSTED]" in str(summary["messages"][-1]["content"])
    assert "3 tool call(s) ran" in str(summary["messages"][-1]["content"])
    assert result.final_content


def test_a_cut_off_answer_is_incomplete(llmock: LLMock, host: Host) -> None:
    llmock.add(Reply(text="The weather is", finish_reason="length"))

    result = host.run_conversation(USER, [], "anthropic", "claude-sonnet-4-6")

    assert result.status == "incomplete"
    assert "output_truncated" in result.flags
    _bodies(llmock)


def test_overloaded_529_is_retried_then_succeeds(llmock: LLMock) -> None:
    llmock.add(Fail(529, retry_after=0.05, times=2))
    provider = AnthropicProvider()

    response = provider.complete_sync(ProviderRequest(
        messages=USER, provider="anthropic", model="claude-sonnet-4-6"))
    provider.close()

    assert response.content
    assert [r.status for r in llmock.requests] == [529, 529, 200]
    llmock.assert_resilient(strict=True)
    _bodies(llmock)


def test_errors_carry_anthropics_message_and_are_not_retried_when_final(llmock: LLMock) -> None:
    llmock.fail(401)
    with pytest.raises(ProviderError) as caught:
        AnthropicProvider().complete_sync(ProviderRequest(
            messages=USER, provider="anthropic", model="claude-sonnet-4-6"))
    assert (caught.value.code, caught.value.status, caught.value.attempts) == (
        "provider_http_error", 401, 1)
    assert "Check ANTHROPIC_API_KEY" in str(caught.value)
    assert len(llmock.requests) == 1


def test_without_a_key_the_provider_is_unavailable_naming_the_variable(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    result = host.run_conversation(USER, [], "anthropic", "claude-sonnet-4-6")
    assert result.status == "error"
    assert "ANTHROPIC_API_KEY" in (result.error or "")


# -- the translation, without a server -------------------------------------------------------

def test_tool_results_of_one_turn_share_a_user_message_and_options_map() -> None:
    request = ProviderRequest(
        provider="anthropic", model="m",
        messages=[{"role": "system", "content": "A"}, {"role": "user", "content": "go"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "a", "name": "t", "parameters": {"x": 1}},
                      {"id": "b", "name": "t", "parameters": {"x": 2}}]},
                  {"role": "tool", "tool_call_id": "a", "content": "1"},
                  {"role": "tool", "tool_call_id": "b", "content": "2"},
                  {"role": "system", "content": "B"}],
        tools=[{"name": "t", "description": "d", "parameters": {"type": "object"}}],
        options={"stop": "###", "seed": 1,
                 "tool_choice": {"type": "function", "function": {"name": "t"}}})

    body = build_messages_body(request)
    with_sampling = build_messages_body(request, defaults={"temperature": 0.5})

    assert messages_problems(body) == []
    # Not in the current official request type, but passed through when asked for (older
    # models and compatible servers take it).
    assert with_sampling["temperature"] == 0.5
    assert body["system"] == "A\n\nB"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in body["messages"][2]["content"]] == ["a", "b"]
    assert body["stop_sequences"] == ["###"]
    assert "seed" not in body
    assert body["tool_choice"] == {"type": "tool", "name": "t"}
    assert body["max_tokens"] == 4096


def test_a_tool_use_input_that_is_not_an_object_becomes_invalid_arguments_text() -> None:
    response = parse_message({"content": [
        {"type": "tool_use", "id": "x", "name": "t", "input": "not an object"}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 2}})
    assert response.tool_calls == [{"id": "x", "name": "t", "parameters": '"not an object"'}]
    assert (response.finish_reason, response.usage["total_tokens"]) == ("tool_calls", 5)


def test_an_error_body_is_a_bad_response() -> None:
    with pytest.raises(ProviderError, match="Overloaded"):
        parse_message({"type": "error", "error": {"type": "overloaded_error",
                                                  "message": "Overloaded"}})


# -- streaming -------------------------------------------------------------------------------

def test_a_streamed_tool_loop_against_llmocks_event_stream(llmock: LLMock, host: Host) -> None:
    llmock.pace(20)

    events = list(host.stream_conversation(USER, [get_weather], "anthropic",
                                           "claude-sonnet-4-6"))

    result = events[-1].result
    assert result is not None
    assert result.status == "completed", result.error
    assert len(CALLS) == 1  # the tool_use input was assembled from its JSON fragments
    deltas = [e.text for e in events if e.type == "text_delta"]
    assert len(deltas) > 1
    assert result.usage["total_tokens"] > 0
    bodies = _bodies(llmock)
    assert all(body["stream"] is True for body in bodies)


def test_a_broken_event_stream_keeps_the_partial_text(llmock: LLMock, host: Host) -> None:
    llmock.reply("The weather in Paris is sunny and warm today.", provider="anthropic")
    llmock.disconnect(after_chunks=4, provider="anthropic")

    events = list(host.stream_conversation(USER, [], "anthropic", "claude-sonnet-4-6"))

    result = events[-1].result
    assert result is not None
    assert result.error_code == "provider_stream_error"
    partial = "".join(e.text or "" for e in events if e.type == "text_delta")
    assert partial in "The weather in Paris is sunny and warm today."


# -- "prompt is too long" (DESIGN.md 21) -----------------------------------------------------
def test_prompt_too_long_is_a_context_overflow_with_its_numbers(llmock: LLMock) -> None:
    llmock.add(Fail(400, message="prompt is too long: 208437 tokens > 200000 maximum"))
    provider = AnthropicProvider()
    with pytest.raises(ProviderError) as caught:
        provider.complete_sync(ProviderRequest(messages=USER, provider="anthropic",
                                               model="claude-sonnet-4-6"))
    provider.close()
    assert caught.value.code == "context_overflow"
    assert (caught.value.context_window, caught.value.prompt_tokens) == (200000, 208437)
    assert provider.context_overflow(400, None, "input length and `max_tokens` exceed context "
                                     "limit: 188240 + 21333 > 200000, decrease input length "
                                     "or `max_tokens` and try again") == (200000, 188240)
    assert provider.context_overflow(400, None, "messages: field required") is None


def test_a_run_told_its_prompt_is_too_long_compacts_and_asks_again(llmock: LLMock,
                                                                   host: Host) -> None:
    from agents_api import Message

    report = "sunny and 21C; " * 500  # about 7,500 bytes a result
    history: list[Any] = [{"role": "user", "content": "Weather in three cities?"}]
    for n, city in enumerate(["Paris", "Rome", "Oslo"]):
        history += [Message.tool_call("get_weather", {"city": city}, n + 1, f"toolu_{n}"),
                    Message.tool_result("get_weather", {"success": True, "result": report},
                                        n + 1, f"toolu_{n}", report)]
    history.append({"role": "user", "content": "And in Lisbon?"})
    # The model says the prompt is 9,000 tokens of a 6,000-token window, once.
    llmock.add(Fail(400, message="prompt is too long: 9000 tokens > 6000 maximum"))
    llmock.add(Reply(text="Lisbon: 24C."))

    events: list[tuple[str, dict[str, Any]]] = []
    result = host.run_conversation(
        history, [get_weather], "anthropic", "claude-sonnet-4-6", mode="chat",
        payload={"model_options": {"max_tokens": 300},
                 "event_sink": lambda name, data: events.append((name, data))})

    assert result.status == "completed", result.error
    assert result.final_content == "Lisbon: 24C."
    assert result.budgets["context_tokens"]["ceiling"] == 6000
    assert result.compactions >= 1
    assert [data["sent_tokens"] for name, data in events if name == "context_overflow"] == [9000]
    refused, answered = _bodies(llmock)
    assert str(refused["messages"]).count("sunny and 21C") == 1500
    assert "cleared" in str(answered["messages"])  # the old results went, their calls stayed
    assert str(answered["messages"]).count("tool_use_id") == 3
