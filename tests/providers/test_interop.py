"""Whole runs through the ``openai`` provider against servers that are stricter than OpenAI.

The server here rejects what llama.cpp's server rejects (see ``strict_problem``); a tool loop
must get through it turn after turn.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import bootstrap
import datamachine
from datamachine.host import Host
from tests.providers.fake_openai import FakeOpenAIServer, Reply, completion, strict_problem


@datamachine.tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: What to look up.
    """
    return f"value of {key}"


@pytest.fixture
def strict_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(strict=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def host(strict_server: FakeOpenAIServer) -> Iterator[Host]:
    booted = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    booted.settings.set("openai_base_url", strict_server.url + "/v1")
    try:
        yield booted
    finally:
        booted.close()


def _call(call_id: str, key: str) -> dict[str, object]:
    return {"id": call_id, "type": "function",
            "function": {"name": "lookup", "arguments": f'{{"key": "{key}"}}'}}


def test_strict_server_refuses_a_null_content() -> None:
    # The check the server applies, so the test below cannot pass by accident.
    assert strict_problem({"messages": [{"role": "assistant", "content": None}]}) == (
        "messages.0.content: Input should be a valid string")
    assert strict_problem({"messages": [{"role": "assistant", "content": ""}]}) is None


def test_a_multi_turn_tool_loop_passes_a_strict_server(
    strict_server: FakeOpenAIServer, host: Host,
) -> None:
    strict_server.enqueue(
        Reply(body=completion(None, tool_calls=[_call("c1", "a")], finish_reason="tool_calls")),
        Reply(body=completion(None, tool_calls=[_call("c2", "b"), _call("c3", "c")],
                              finish_reason="tool_calls")),
        Reply(body=completion("a, b and c looked up")),
    )

    result = host.run_conversation([{"role": "user", "content": "look up a, b, c"}], [lookup],
                                   "openai", "test-model", mode="chat")

    assert result.status == "completed", result.error
    assert result.final_content == "a, b and c looked up"
    assert len(strict_server.requests) == 3
    last = strict_server.requests[-1].json["messages"]
    assistant = [m for m in last if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == ["", ""]
    assert [len(m["tool_calls"]) for m in assistant] == [1, 2]
    assert all(strict_problem(r.json) is None for r in strict_server.requests)


def test_an_answer_cut_off_by_the_token_limit_is_incomplete(
    strict_server: FakeOpenAIServer, host: Host,
) -> None:
    strict_server.enqueue(
        Reply(body=completion(None, tool_calls=[_call("c1", "a")], finish_reason="tool_calls")),
        Reply(body=completion("The value of a is", finish_reason="length")),
    )

    result = host.run_conversation([{"role": "user", "content": "look up a"}], [lookup],
                                   "openai", "test-model", mode="chat")

    assert result.status == "incomplete"
    assert result.completed is False
    assert "output_truncated" in result.flags
    assert result.warning is not None
    assert "output token limit" in result.warning
    assert result.final_content == "The value of a is"
    # What is stored says the same as what is returned.
    assert result.transcript_session_id is not None
    stored = host.transcripts.summary(result.transcript_session_id)
    assert stored.status == "incomplete"
    assert "output_truncated" in stored.result["flags"]


def test_a_call_with_broken_arguments_is_corrected_through_a_strict_server(
    strict_server: FakeOpenAIServer, host: Host,
) -> None:
    broken = {"id": "c1", "type": "function",
              "function": {"name": "lookup", "arguments": '{"key": "a"'}}
    strict_server.enqueue(
        Reply(body=completion(None, tool_calls=[broken], finish_reason="tool_calls")),
        Reply(body=completion(None, tool_calls=[_call("c2", "a")], finish_reason="tool_calls")),
        Reply(body=completion("a looked up")),
    )

    result = host.run_conversation([{"role": "user", "content": "look up a"}], [lookup],
                                   "openai", "test-model", mode="chat")

    assert result.status == "completed", result.error
    assert result.final_content == "a looked up"
    assert [r["result"].get("error_type") for r in result.tool_execution_results] == [
        "invalid_arguments", None]
    second = strict_server.requests[1].json["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "cut off" in second[-1]["content"]
    assert all(strict_problem(r.json) is None for r in strict_server.requests)
    assert strict_problem({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        broken]}]}) == "messages.0.tool_calls.0.function.arguments: not a JSON object"


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_run_time_limit_cuts_a_slow_http_answer(
    asynchronous: bool, host: Host,
) -> None:
    # A synchronous run's request cannot be cancelled from outside: it is given the run's
    # remaining time as its timeout. Either way the run stops on its time budget.
    import asyncio
    import time

    with FakeOpenAIServer() as slow:
        host.settings.set("openai_base_url", slow.url + "/v1")
        slow.enqueue(Reply(body=completion("too late"), delay=5))
        started = time.perf_counter()
        messages = [{"role": "user", "content": "hi"}]
        payload = {"max_seconds": 0.3}
        if asynchronous:
            result = asyncio.run(host.arun_conversation(messages, None, "openai", "m",
                                                        payload=payload))
        else:
            result = host.run_conversation(messages, None, "openai", "m", payload=payload)
        elapsed = time.perf_counter() - started

    assert result.status == "budget_exceeded", result.error
    assert result.budget == "wall_clock_seconds"
    assert elapsed < 3
