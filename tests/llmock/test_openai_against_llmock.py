"""The ``openai`` provider, whole runs and single requests, against LLMock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llmock.pytest_plugin import LLMock
from llmock.scenarios import Delay, Fail, Match, Reply, ToolCall

import datamachine
from datamachine.errors import ProviderError
from datamachine.host import Host
from datamachine.providers.base import ProviderRequest
from datamachine.providers.openai import OpenAIProvider

pytestmark = pytest.mark.usefixtures("checked_bodies")

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS: list[dict[str, Any]] = []


@datamachine.tool
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city.
    """
    CALLS.append({"city": city})
    return f"21C in {city}"


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def _chat_bodies(llmock: LLMock) -> list[dict[str, Any]]:
    return [r.body for r in llmock.requests if r.path.endswith("/chat/completions")]


def test_a_tool_loop_runs_the_tool_then_completes(llmock: LLMock, host: Host) -> None:
    # LLMock's own tool mode: it calls the offered tool with schema-valid arguments, and
    # answers in text once the tool's result comes back.
    result = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini", mode="chat")

    assert result.status == "completed", result.error
    assert len(CALLS) == 1
    assert result.final_content
    assert result.usage["total_tokens"] > 0
    first, second = _chat_bodies(llmock)
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather"]
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_runaway_is_stopped_by_its_budget_with_pressure_and_a_tool_less_summary(
    llmock: LLMock, host: Host,
) -> None:
    # Every request that offers tools gets a call, forever (with new arguments each time).
    for n in range(10):
        llmock.add(Reply(tool_calls=(ToolCall("get_weather", {"city": f"city {n}"}),),
                         match=Match(tools=True)))

    result = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini",
                                   max_turns=4, payload={"budget_pressure": True})

    assert result.status == "budget_exceeded"
    assert result.turn_count == 4
    assert len(CALLS) == 4
    bodies = _chat_bodies(llmock)
    assert len(bodies) == 5  # four turns and the summary
    pressure = [m["content"] for m in bodies[3]["messages"]
                if m["role"] in ("system", "user") and "budget" in str(m["content"]).lower()]
    assert pressure, "the last turn's request should carry a budget pressure notice"
    summary = bodies[-1]
    assert "tools" not in summary
    assert summary["messages"][-1]["content"].startswith("[BUDGET EXHAUSTED]")
    assert "4 tool call(s) ran" in summary["messages"][-1]["content"]
    assert result.final_content  # LLMock's text answer to the summary request


def test_malformed_arguments_are_recovered(llmock: LLMock, host: Host) -> None:
    llmock.break_tool_call("malformed_arguments")

    result = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini")

    assert result.status == "completed", result.error
    failure = result.tool_execution_results[0]["result"]
    assert failure["error_type"] == "invalid_arguments"
    assert CALLS == []
    second = _chat_bodies(llmock)[1]
    # The broken call goes back as {} (its tool result says what was wrong).
    assert second["messages"][-2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert second["messages"][-1]["content"] == failure["error"]


def test_a_final_answer_cut_off_by_the_token_limit_is_incomplete(
    llmock: LLMock, host: Host,
) -> None:
    llmock.add(Reply(text="The weather in Paris is", finish_reason="length"))

    result = host.run_conversation(USER, [], "openai", "gpt-4o-mini",
                                   payload={"model_options": {"max_tokens": 5}})

    assert result.status == "incomplete"
    assert "output_truncated" in result.flags
    assert result.warning is not None
    assert "output token limit" in result.warning
    assert _chat_bodies(llmock)[0]["max_tokens"] == 5


# -- retries and timeouts, one request at a time ---------------------------------------------

def _request(**overrides: Any) -> ProviderRequest:
    data: dict[str, Any] = {"messages": USER, "provider": "openai", "model": "gpt-4o-mini",
                            "request_timeout": 5.0, "connect_timeout": 2.0}
    data.update(overrides)
    return ProviderRequest(**data)


def _provider(**kwargs: Any) -> OpenAIProvider:
    # A short backoff keeps real waits small; the server's Retry-After is waited for real,
    # so LLMock can judge whether the client waited as long as it asked.
    return OpenAIProvider(backoff_base=0.02, backoff_max=0.05, **kwargs)


@pytest.mark.parametrize("transport", ["sync", "async"])
def test_429_with_retry_after_is_waited_for_then_succeeds(llmock: LLMock, transport: str) -> None:
    llmock.rate_limit(times=2, retry_after=0.1)
    provider = _provider()

    if transport == "sync":
        response = provider.complete_sync(_request())
    else:
        async def in_a_loop() -> Any:
            pending = provider.complete(_request())
            assert not isinstance(pending, datamachine.ProviderResponse)
            answer = await pending
            await provider.aclose()
            return answer

        response = asyncio.run(in_a_loop())
    provider.close()

    assert response.content
    assert [r.status for r in llmock.requests] == [429, 429, 200]
    # LLMock asks for "retry-after: 1" and "retry-after-ms: 100": the finer one was honoured.
    waited = llmock.requests[1].started_at - llmock.requests[0].ended_at
    assert 0.09 <= waited < 0.9
    llmock.assert_resilient(strict=True)


def test_5xx_is_retried_with_backoff_then_given_up_after_provider_max_retries(
    llmock: LLMock,
) -> None:
    # LLMock sends Retry-After (and retry-after-ms) with a 503; 20 ms keeps the test quick.
    llmock.add(Fail(503, retry_after=0.02, times=None))
    provider = _provider()

    with pytest.raises(ProviderError) as caught:
        provider.complete_sync(_request())
    provider.close()

    assert (caught.value.code, caught.value.status, caught.value.attempts) == (
        "provider_http_error", 503, 4)
    assert [r.status for r in llmock.requests] == [503] * 4
    llmock.assert_resilient()  # no retry storm, nothing retried that should not be


def test_a_400_is_not_retried(llmock: LLMock) -> None:
    llmock.fail(400)
    with pytest.raises(ProviderError) as caught:
        _provider().complete_sync(_request())
    assert caught.value.status == 400
    assert len(llmock.requests) == 1
    llmock.assert_resilient(strict=True)


def test_a_slow_answer_is_a_timeout_naming_the_setting(llmock: LLMock, host: Host) -> None:
    llmock.add(Delay(1.0))
    host.settings.set("request_timeout", 0.2)

    slow = host.run_conversation(USER, [], "openai", "gpt-4o-mini")
    after = host.run_conversation(USER, [], "openai", "gpt-4o-mini")

    assert (slow.status, slow.error_code) == ("error", "provider_timeout")
    assert "request timeout of 0.2 s" in (slow.error or "")
    assert after.status == "completed"  # a timeout is not retried, and the pool still works


# -- streaming -------------------------------------------------------------------------------

def _stream_events(host: Host, tools: list[Any], **kwargs: Any) -> list[Any]:
    return list(host.stream_conversation(USER, tools, "openai", "gpt-4o-mini", **kwargs))


def test_a_streamed_tool_loop_against_llmock(llmock: LLMock, host: Host) -> None:
    llmock.pace(20)  # LLMock spaces its chunks like a model generating

    events = _stream_events(host, [get_weather])

    result = events[-1].result
    assert result is not None
    assert result.status == "completed", result.error
    assert len(CALLS) == 1
    deltas = [e.text for e in events if e.type == "text_delta"]
    assert len(deltas) > 1  # the answer came in pieces
    assert "".join(deltas).endswith(result.final_content)
    assert result.usage["total_tokens"] > 0  # stream_options.include_usage
    assert all(body["stream"] is True for body in _chat_bodies(llmock))


def test_a_disconnect_mid_stream_is_a_stream_error_keeping_the_partial_text(
    llmock: LLMock, host: Host,
) -> None:
    llmock.reply("The weather in Paris is sunny and warm today.")
    llmock.disconnect(after_chunks=3)

    events = _stream_events(host, [])

    result = events[-1].result
    assert result is not None
    assert (result.status, result.error_code) == ("error", "provider_stream_error")
    partial = "".join(e.text or "" for e in events if e.type == "text_delta")
    assert partial
    assert partial in "The weather in Paris is sunny and warm today."


def test_a_stream_cut_short_without_a_finish_reason_is_not_taken_as_an_answer(
    llmock: LLMock, host: Host,
) -> None:
    llmock.reply("The weather in Paris is sunny and warm today.")
    llmock.truncate(after_chunks=2)

    events = _stream_events(host, [])

    result = events[-1].result
    assert result is not None
    assert result.error_code == "provider_stream_error"
    assert "ended before the answer did" in (result.error or "")
    # (LLMock's verdict would call this "truncated_stream_accepted" because the client did not
    # retry; it did not accept it either: text already shown is not re-requested.)


def test_a_request_that_would_pass_total_tokens_is_never_sent(llmock: LLMock, host: Host) -> None:
    for n in range(10):  # a runaway: every request that offers tools gets a call
        llmock.add(Reply(tool_calls=(ToolCall("get_weather", {"city": f"city {n}"}),),
                         match=Match(tools=True)))
    events: list[tuple[str, dict[str, Any]]] = []

    def sink(event: str, payload: dict[str, Any]) -> None:
        events.append((event, payload))

    # A ceiling of one token: the first request's estimate does not fit; nothing is sent.
    refused = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini", payload={
        "budget_ceilings": {"total_tokens": 1}, "event_sink": sink})
    assert (refused.status, refused.turn_count, _chat_bodies(llmock)) == (
        "budget_exceeded", 0, [])
    first_estimate = next(p for e, p in events if e == "budget_exceeded")["needed"]
    # One turn, to learn what LLMock reports for it.
    one = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini", max_turns=1,
                                payload={"final_summary": False})
    first_usage = one.usage["total_tokens"]
    assert len(_chat_bodies(llmock)) == 1
    # Room for the first request and its answer, not for the second request's estimate.
    ceiling = max(first_estimate, first_usage) + 1
    result = host.run_conversation(USER, [get_weather], "openai", "gpt-4o-mini", payload={
        "budget_ceilings": {"total_tokens": ceiling}})
    assert (result.status, result.budget, result.turn_count) == (
        "budget_exceeded", "total_tokens", 1)
    assert len(_chat_bodies(llmock)) == 2  # one more request: the second, and the summary,
    # were never sent (the log is LLMock's own)
    assert result.budgets["total_tokens"]["current"] == first_usage <= ceiling
    assert result.flags == ["max_total_tokens_reached"]
