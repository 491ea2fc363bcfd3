"""Runs against the bytes llama-cpp-python's server really sent (tests/providers/recordings/,
replayed by a loopback server): its streamed tool calls repeat the whole function name and id
in every chunk, its streams carry no usage, and an answer after a tool turn can be empty."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
from datamachine import tool
from datamachine.errors import ProviderError
from datamachine.host import Host
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.openai import OpenAIProvider
from tests.providers.fake_openai import RecordingSleep
from tests.providers.replay import (
    CLOSE,
    ReplayServer,
    cut_after_headers,
    recorded_request,
    recording,
)

STREAM_CALL = "llama_cpp_stream_tool_call"
CALL = "llama_cpp_tool_call"
STREAM_TEXT = "llama_cpp_stream_text_after_tool"
STREAM_EMPTY = "llama_cpp_stream_empty_after_tool"
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}},
          "temperature": 0, "max_tokens": 128}
RAN: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city name.
    """
    RAN.append(city)
    return f"It is 21C and sunny in {city}."


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def _host(server: ReplayServer) -> Host:
    host = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    host.settings.set("openai_base_url", server.url)
    return host


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-replay")


def _stream_run(host: Host, **kwargs: Any) -> Any:
    events = list(host.stream_conversation(WEATHER, [get_weather], "openai", "smollm2",
                                           **kwargs))
    assert events[-1].type == "result"
    return events


def test_a_streamed_llama_cpp_tool_call_runs_its_tool() -> None:
    # The assembler appended the repeated names: 'get_weatherget_weather...', tool_not_found.
    with ReplayServer(recording(STREAM_CALL), recording(STREAM_TEXT)) as server, \
            _host(server) as host:
        events = _stream_run(host, payload={"model_options": FORCED})
    calls = [event.tool_call for event in events if event.type == "tool_call"]
    assert [call["name"] for call in calls] == ["get_weather"]
    assert calls[0]["id"].startswith("call__0_get_weather_cmpl-")
    assert calls[0]["parameters"] == {"city": "Paris"}
    assert RAN == ["Paris"]
    result = events[-1].result
    assert result.status == "completed"
    assert result.final_content.startswith("I'm ready to assist you")
    assert "".join(e.text for e in events if e.type == "text_delta") == result.final_content
    # What was sent: the body the recording was made with, in datamachine's own words.
    first = server.requests[0]
    assert first["stream"] is True
    assert first["tool_choice"] == recorded_request(STREAM_CALL)["tool_choice"]
    assert server.requests[1]["messages"][-1]["role"] == "tool"


def test_streamed_and_not_streamed_answers_give_the_same_tool_call() -> None:
    request = ProviderRequest(messages=WEATHER, tools=[{
        "name": "get_weather", "description": "", "parameters": {"type": "object"}}],
        provider="openai", model="smollm2", request_timeout=10, connect_timeout=5)

    async def both(url: str) -> tuple[ProviderResponse, ProviderResponse]:
        provider = OpenAIProvider(base_url=url, api_key="k")
        try:
            whole = await provider.complete(request)  # type: ignore[misc]
            streamed = [delta async for delta in provider.stream(request)][-1].response
        finally:
            await provider.aclose()
        assert streamed is not None
        return whole, streamed

    with ReplayServer(recording(CALL), recording(STREAM_CALL)) as server:
        whole, streamed = asyncio.run(both(server.url))
    assert [(c["name"], c["parameters"]) for c in streamed.tool_calls] == \
        [(c["name"], c["parameters"]) for c in whole.tool_calls] == [
            ("get_weather", {"city": "Paris"})]
    assert (whole.finish_reason, streamed.finish_reason) == ("tool_calls", "tool_calls")
    assert whole.usage == {"prompt_tokens": 23, "completion_tokens": 8, "total_tokens": 31}
    assert streamed.usage == {}  # the stream reported none


def test_usage_a_stream_does_not_report_is_null_not_zero() -> None:
    # The result said tokens 0 (prompt 0, completion 0) for a server that reported nothing.
    with ReplayServer(recording(STREAM_CALL), recording(STREAM_TEXT)) as server, \
            _host(server) as host:
        result = _stream_run(host, payload={"model_options": FORCED})[-1].result
    assert result.turn_count == 2
    assert result.usage == {"prompt_tokens": None, "completion_tokens": None,
                            "total_tokens": None}


def test_usage_a_server_reports_is_summed_as_before() -> None:
    with ReplayServer(recording(CALL)) as server, _host(server) as host:
        result = host.run_conversation(WEATHER, [get_weather], "openai", "smollm2",
                                       single_turn=True, payload={"model_options": FORCED})
    assert RAN == ["Paris"]
    assert result.usage == {"prompt_tokens": 23, "completion_tokens": 8, "total_tokens": 31}


def test_an_empty_streamed_answer_after_a_tool_turn_is_assembled_as_empty_text() -> None:
    request = ProviderRequest(messages=WEATHER, provider="openai", model="smollm2",
                              request_timeout=10, connect_timeout=5)

    async def last(url: str) -> ProviderResponse | None:
        provider = OpenAIProvider(base_url=url, api_key="k")
        try:
            deltas = [delta async for delta in provider.stream(request)]
        finally:
            await provider.aclose()
        assert [delta.text for delta in deltas[:-1]] == []  # no text arrived at all
        return deltas[-1].response

    with ReplayServer(recording(STREAM_EMPTY)) as server:
        response = asyncio.run(last(server.url))
    assert response is not None
    assert (response.content, response.tool_calls, response.finish_reason, response.usage) == (
        "", [], "stop", {})


def test_an_empty_final_answer_after_a_tool_turn_is_nudged_then_incomplete() -> None:
    with ReplayServer(recording(STREAM_CALL), recording(STREAM_EMPTY),
                      recording(STREAM_EMPTY)) as server, _host(server) as host:
        result = _stream_run(host, payload={"model_options": FORCED})[-1].result
    assert RAN == ["Paris"]
    assert result.status == "incomplete"
    assert "empty_answer" in result.flags
    assert result.completion_nudge_count == 1
    assert result.final_content == ""


@pytest.mark.parametrize("breaks", [CLOSE, cut_after_headers(STREAM_CALL)],
                         ids=["closed-before-answering", "headers-then-nothing"])
def test_a_stream_that_breaks_before_its_first_byte_is_retried(breaks: bytes) -> None:
    sleep = RecordingSleep()
    with ReplayServer(breaks, recording(STREAM_CALL), recording(STREAM_TEXT)) as server, \
            _host(server) as host:
        host.providers.register(OpenAIProvider(name="llama", base_url=server.url,
                                               api_key="k", sleep=sleep, jitter=lambda: 0.0))
        events = list(host.stream_conversation(WEATHER, [get_weather], "llama", "smollm2",
                                               payload={"model_options": FORCED}))
        session = events[-1].result.transcript_session_id if events[-1].result else None
        records = host.transcripts.requests(session) if session else []
    result = events[-1].result
    assert result is not None
    assert result.status == "completed"
    assert RAN == ["Paris"]
    assert len(server.requests) == 3
    assert sleep.calls == [0.25]
    # The run viewer's record of the first request shows the attempt that broke.
    assert [(a["status"], a["waited"]) for a in records[0]["attempts"]] == [(None, 0.25)]


def test_a_request_the_server_drops_before_answering_is_retried_when_not_streamed() -> None:
    request = ProviderRequest(messages=WEATHER, provider="openai", model="smollm2",
                              request_timeout=10, connect_timeout=5)

    def send(*answers: bytes) -> tuple[ProviderResponse | ProviderError, list[float]]:
        sleep = RecordingSleep()
        with ReplayServer(*answers) as server:
            provider = OpenAIProvider(base_url=server.url, api_key="k", sleep=sleep,
                                      jitter=lambda: 0.0, max_retries=1)
            try:
                return provider.complete_sync(request), sleep.calls
            except ProviderError as exc:
                return exc, sleep.calls
            finally:
                provider.close()

    answer, waited = send(CLOSE, recording(CALL))
    assert isinstance(answer, ProviderResponse)
    assert answer.tool_calls[0]["name"] == "get_weather"
    assert waited == [0.25]
    failed, _ = send(CLOSE, CLOSE)
    assert isinstance(failed, ProviderError)
    assert failed.code == "provider_connection_error"
    assert "closed the connection before answering after 2 attempts" in str(failed)


def test_the_recordings_are_what_the_manifest_says() -> None:
    # Each recording answers its request: a stream for stream=True, JSON otherwise.
    for name in (STREAM_CALL, CALL, STREAM_TEXT, STREAM_EMPTY):
        head = recording(name).split(b"\r\n\r\n", 1)[0].decode()
        streamed = recorded_request(name)["stream"]
        assert ("text/event-stream" in head) is streamed
        assert head.startswith("HTTP/1.1 200 OK")
    body = recording(CALL).split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["usage"]["total_tokens"] == 31
