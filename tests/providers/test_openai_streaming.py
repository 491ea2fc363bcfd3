"""The openai provider's stream(): SSE from a real loopback server, chunk by chunk."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderRequest, ProviderResponse, StreamDelta
from datamachine.providers.openai import OpenAIProvider
from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply, chunk


def _request() -> ProviderRequest:
    return ProviderRequest(messages=[{"role": "user", "content": "Hi"}], provider="openai",
                           model="m", request_timeout=5.0, connect_timeout=2.0)


def _provider(server: FakeOpenAIServer) -> OpenAIProvider:
    return OpenAIProvider(base_url=server.url + "/v1", api_key="k", sleep=RecordingSleep(),
                          jitter=lambda: 0.0)


def _collect(provider: OpenAIProvider) -> tuple[list[tuple[float, StreamDelta]], float]:
    async def run() -> tuple[list[tuple[float, StreamDelta]], float]:
        started = time.perf_counter()
        seen = [(time.perf_counter() - started, delta)
                async for delta in provider.stream(_request())]
        await provider.aclose()
        return seen, time.perf_counter() - started

    return asyncio.run(run())


def test_text_arrives_before_the_answer_ends_and_usage_comes_last(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.enqueue(Reply(stream=[
        chunk("Hel"), chunk("lo, "), chunk("world."), chunk(finish_reason="stop"),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})],
        chunk_delay=0.15))

    seen, total = _collect(_provider(openai_server))

    texts = [delta.text for _, delta in seen if delta.text]
    assert texts == ["Hel", "lo, ", "world."]
    first_at = seen[0][0]
    assert first_at < total - 0.4  # measured: the first words came well before the end
    last = seen[-1][1].response
    assert isinstance(last, ProviderResponse)
    assert (last.content, last.finish_reason) == ("Hello, world.", "stop")
    assert last.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    body = openai_server.requests[0].json
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_tool_call_deltas_split_across_chunks_are_assembled(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.enqueue(Reply(stream=[
        chunk(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "search", "arguments": ""}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"q": "plu'}}]),
        chunk(tool_calls=[{"index": 1, "id": "call_b", "type": "function",
                           "function": {"name": "fetch", "arguments": '{"url"'}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": 'ggy"}'}}]),
        chunk(tool_calls=[{"index": 1, "function": {"arguments": ': "u"}'}}]),
        chunk(finish_reason="tool_calls")]))

    seen, _ = _collect(_provider(openai_server))

    [(_, last)] = seen
    assert last.response is not None
    assert last.response.tool_calls == [
        {"id": "call_a", "name": "search", "parameters": {"q": "pluggy"}},
        {"id": "call_b", "name": "fetch", "parameters": {"url": "u"}}]
    assert last.response.finish_reason == "tool_calls"


@pytest.mark.parametrize("cut_after", [2, 1])
def test_a_stream_broken_mid_way_is_an_error_keeping_the_partial_text(
    openai_server: FakeOpenAIServer, cut_after: int,
) -> None:
    events: list[Any] = [chunk("The answer "), chunk("is 4")][:cut_after]
    openai_server.enqueue(Reply(stream=events, cut=True))

    with pytest.raises(ProviderError) as caught:
        _collect(_provider(openai_server))

    assert caught.value.code == "provider_stream_error"
    assert caught.value.partial_content == "".join(e["choices"][0]["delta"]["content"]
                                                  for e in events)
    assert "ended before the answer did" in str(caught.value)


def test_a_stream_that_ends_before_its_first_event_is_retried(
        openai_server: FakeOpenAIServer) -> None:
    # A stream cut before its first byte was a provider_stream_error at once, never retried.
    openai_server.enqueue(Reply(stream=[], cut=True),
                          Reply(stream=[chunk("ok"), chunk(finish_reason="stop")]))
    provider = _provider(openai_server)
    seen, _ = _collect(provider)
    assert [d.text for _, d in seen if d.text] == ["ok"]
    assert len(openai_server.requests) == 2
    assert isinstance(provider.sleep, RecordingSleep)
    assert provider.sleep.calls == [0.25]  # the backoff (base 0.5, no jitter) as for a 5xx


def test_a_stream_that_never_starts_fails_saying_so_after_its_retries(
        openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(*[Reply(stream=[], cut=True) for _ in range(4)])
    with pytest.raises(ProviderError) as caught:
        _collect(_provider(openai_server))
    assert caught.value.code == "provider_stream_error"
    assert caught.value.attempts == 4
    assert "ended before its first event after 4 attempts: HTTP 200 with an empty body" in str(
        caught.value)


def test_an_error_event_mid_stream_is_an_error(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(stream=[chunk("Par"), {"error": {"message": "overloaded"}}]))
    with pytest.raises(ProviderError, match="the server sent an error: overloaded") as caught:
        _collect(_provider(openai_server))
    assert caught.value.partial_content == "Par"


def test_a_429_is_retried_before_the_stream_starts(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(429, {"error": {"message": "slow down"}},
                                headers={"Retry-After": "1"}),
                          Reply(stream=[chunk("ok"), chunk(finish_reason="stop")]))
    provider = _provider(openai_server)
    seen, _ = _collect(provider)
    assert [d.text for _, d in seen if d.text] == ["ok"]
    assert isinstance(provider.sleep, RecordingSleep)
    assert provider.sleep.calls == [1.0]
