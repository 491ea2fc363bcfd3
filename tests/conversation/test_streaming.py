"""stream_conversation / astream_conversation: events as they happen, the result last."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Iterator
from typing import Any

import pytest

import bootstrap
import datamachine
from datamachine import StreamEvent
from datamachine.host import Host
from tests.providers.fake_openai import FakeOpenAIServer, Reply, chunk

USER = [{"role": "user", "content": "Double 2, then tell me."}]


@datamachine.tool
def double(n: int) -> int:
    """Double a number.

    Args:
        n: The number.
    """
    return 2 * n


SCRIPT = [{"content": "Let me see.", "tool_calls": [{"id": "c1", "name": "double",
                                                     "parameters": {"n": 2}}]},
          {"content": "It is 4."}]


@pytest.fixture
def host(tmp_path: Any) -> Iterator[Host]:
    booted = bootstrap.boot(str(tmp_path / "s.db"), load_entrypoints=False)
    try:
        yield booted
    finally:
        booted.close()


def test_events_arrive_in_order_and_the_result_is_last(host: Host) -> None:
    events = list(host.stream_conversation(USER, [double], "scripted", "m",
                                           payload={"script": SCRIPT}))
    kinds = [e.type for e in events]
    assert kinds[-1] == "result"
    assert kinds.count("result") == 1
    texts = [e.text for e in events if e.type == "text_delta"]
    assert texts == ["Let me see.", "It is 4."]  # a provider that cannot stream: one delta
    [call] = [e.tool_call for e in events if e.type == "tool_call"]
    assert call == {"id": "c1", "name": "double", "parameters": {"n": 2}}
    [done] = [e.tool_result for e in events if e.type == "tool_result"]
    assert done is not None
    assert done["result"]["result"] == 4
    names = [e.event for e in events if e.type == "event"]
    assert names[0] == "turn_started"
    assert names[-1] == "completed"
    result = events[-1].result
    assert result is not None
    assert (result.status, result.final_content) == ("completed", "It is 4.")


def test_a_streamed_run_stores_what_a_plain_run_stores(host: Host) -> None:
    plain = host.run_conversation(USER, [double], "scripted", "m", payload={"script": SCRIPT})
    streamed = list(host.stream_conversation(USER, [double], "scripted", "m",
                                                    payload={"script": SCRIPT}))[-1].result
    assert streamed is not None
    strip = {"created_at", "id"}

    def stored(session_id: str | None) -> list[dict[str, Any]]:
        assert session_id is not None
        return [{k: v for k, v in m.items() if k not in strip}
                for m in host.transcripts.get(session_id)]

    assert stored(streamed.transcript_session_id) == stored(plain.transcript_session_id)
    assert (streamed.status, streamed.turn_count) == (plain.status, plain.turn_count)


def _slow_server(server: FakeOpenAIServer, delay: float = 0.2) -> None:
    server.enqueue(Reply(stream=[chunk("The "), chunk("answer "), chunk("is "), chunk("4."),
                                 chunk(finish_reason="stop")], chunk_delay=delay))


def test_openai_text_arrives_while_the_model_is_still_writing(host: Host) -> None:
    with FakeOpenAIServer() as server:
        _slow_server(server)
        host.settings.set("openai_base_url", server.url + "/v1")
        started = time.perf_counter()
        arrivals = [(time.perf_counter() - started, event)
                    for event in host.stream_conversation(USER, [], "openai", "m")]
    deltas = [(at, e.text) for at, e in arrivals if e.type == "text_delta"]
    assert [text for _, text in deltas] == ["The ", "answer ", "is ", "4."]
    end = arrivals[-1][0]
    assert deltas[0][0] < end - 0.5  # measured: the first words long before the last
    result = arrivals[-1][1].result
    assert result is not None
    assert result.final_content == "The answer is 4."


def test_leaving_the_stream_early_aborts_the_run_keeps_the_transcript_and_frees_the_lock(
    host: Host,
) -> None:
    with FakeOpenAIServer() as server:
        _slow_server(server, delay=0.3)
        host.settings.set("openai_base_url", server.url + "/v1")
        seen: list[StreamEvent] = []
        for event in host.stream_conversation(USER, [], "openai", "m",
                                              payload={"transcript_session_id": "s1"}):
            seen.append(event)
            if event.type == "text_delta":
                break
    assert [e.text for e in seen if e.type == "text_delta"] == ["The "]
    stored = host.transcripts.summary("s1")
    assert stored.status == "aborted"
    # No budget stopped it (a chat limit's abort names chat_turns; this one names none).
    assert (stored.result["budget"], stored.result["flags"]) == (None, [])
    messages = host.transcripts.get("s1")
    assert messages[0]["content"] == USER[0]["content"]
    # The lock is free: the next run on the session starts at once.
    again = host.run_conversation(USER, [], "scripted", "m",
                                  payload={"transcript_session_id": "s1",
                                           "script": [{"content": "ok"}]})
    assert again.status == "completed"


def test_the_wall_clock_cuts_a_stream_and_keeps_the_partial_text(host: Host) -> None:
    with FakeOpenAIServer() as server:
        _slow_server(server, delay=0.4)
        host.settings.set("openai_base_url", server.url + "/v1")
        events = list(host.stream_conversation(USER, [], "openai", "m",
                                               payload={"max_seconds": 0.6}))
    result = events[-1].result
    assert result is not None
    assert result.status == "budget_exceeded"
    assert result.budget == "wall_clock_seconds"
    assert result.final_content.startswith("The ")
    assert result.final_content != "The answer is 4."


def test_astream_conversation_in_an_event_loop(host: Host) -> None:
    async def collect() -> list[StreamEvent]:
        return [event async for event in host.astream_conversation(
            USER, [double], "scripted", "m", payload={"script": SCRIPT})]

    events = asyncio.run(collect())
    assert events[-1].type == "result"
    assert [e.text for e in events if e.type == "text_delta"] == ["Let me see.", "It is 4."]


def test_the_callers_own_event_sink_still_hears_everything(host: Host) -> None:
    heard: list[str] = []
    events = list(host.stream_conversation(
        USER, [double], "scripted", "m",
        payload={"script": SCRIPT, "event_sink": lambda event, payload: heard.append(event)}))
    assert heard == [e.event if e.type == "event" else e.type for e in events
                     if e.type not in ("text_delta", "result")]


def test_leaving_an_async_stream_early_aborts_the_run_too(host: Host) -> None:
    with FakeOpenAIServer() as server:
        _slow_server(server, delay=0.3)
        host.settings.set("openai_base_url", server.url + "/v1")

        async def first_words() -> str:
            stream = host.astream_conversation(USER, [], "openai", "m",
                                               payload={"transcript_session_id": "s2"})
            async for event in stream:
                if event.type == "text_delta":
                    await stream.aclose()  # what leaving an "async for" early amounts to
                    return event.text or ""
            return ""

        assert asyncio.run(first_words()) == "The "
    assert host.transcripts.summary("s2").status == "aborted"
    assert host.transcripts.locks.held() == []


def _looping(turns: int) -> list[dict[str, Any]]:
    return [{"content": f"Turn {n}.", "tool_calls": [
        {"id": f"c{n}", "name": "double", "parameters": {"n": n}}]} for n in range(1, turns)]


def test_breaking_out_of_a_stream_at_the_second_turn_stops_the_run_there(host: Host) -> None:
    """A consumer that breaks and closes the iterator ends the run at its next safe point
    (DESIGN 13): it ran on to its turn budget before (52 model calls after the break, status
    budget_exceeded), because a run whose provider and tools never wait never let the
    stream's consumer act."""
    host.settings.set("max_turns", 60)
    script = _looping(60)
    stream = host.stream_conversation(USER, [double], "scripted", "m",
                                      payload={"script": script,
                                               "transcript_session_id": "left"})
    assert isinstance(stream, Generator)
    for event in stream:
        if event.type == "event" and event.event == "turn_started" and \
                event.payload is not None and event.payload["turn"] == 2:
            break
    stream.close()
    stored = host.transcripts.summary("left")
    assert stored.status == "aborted"
    assert stored.turn_count <= 3  # the turn it left in, at most one more
