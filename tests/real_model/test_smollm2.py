"""A real model through the ``openai`` provider: SmolLM2-135M on llama-cpp-python's server.

What only a real server shows: its request validation (a ``null`` content is a 500 there), its
chat template's tool-call format, and a small model's habit of never stopping.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
import datamachine
from agents_api import Decision
from datamachine.host import Host

pytestmark = pytest.mark.real_model


@datamachine.tool
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city name.
    """
    return f"It is 21C and sunny in {city}."


FORCED = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}},
          "temperature": 0, "max_tokens": 128}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def host(smollm2_url: str) -> Iterator[Host]:
    booted = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    booted.settings.set("openai_base_url", smollm2_url)
    booted.settings.set("request_timeout", 120)
    try:
        yield booted
    finally:
        booted.close()


class DoneOnWeather:
    """A completion policy: the run is complete once the weather tool has answered."""

    def record_tool_result(self, tool_name: str, tool: Any, result: Any,
                           context: dict[str, Any]) -> Decision:
        return Decision(complete=tool_name == "get_weather" and bool(result.get("success")))

    def record_natural_completion(self, messages: Any, content: str,
                                  context: dict[str, Any]) -> Decision:
        return Decision(complete=True)


def test_a_forced_tool_call_loop_completes(host: Host) -> None:
    result = host.run_conversation(USER, [get_weather], "openai", "smollm2",
                                   payload={"model_options": FORCED,
                                            "completion_policy": DoneOnWeather()})
    assert result.status == "completed", (result.error, result.messages)
    assert result.tool_execution_results[0]["result"]["success"] is True


def test_a_runaway_is_stopped_by_its_budget_with_a_summary(host: Host) -> None:
    # Forced to call the tool on every turn, the model can never answer: the budget stops it,
    # and the tool-less summary request (no tool_choice: the server would refuse it without
    # tools) gets a text answer.
    result = host.run_conversation(USER, [get_weather], "openai", "smollm2", max_turns=3,
                                   mode="chat", payload={"model_options": FORCED})
    assert result.status == "budget_exceeded", (result.error, result.messages)
    assert result.turn_count == 3
    assert result.final_content
    assert result.messages[-1].metadata.get("type") == "final_summary"


def test_a_streamed_tool_loop_runs_its_tools(host: Host) -> None:
    # The CLI streams by default on a terminal: every streamed call was 'tool_not_found'
    # ('get_weatherget_weather...': the server repeats the name in every chunk).
    events = list(host.stream_conversation(USER, [get_weather], "openai", "smollm2",
                                           payload={"model_options": FORCED,
                                                    "completion_policy": DoneOnWeather()}))
    results = [event.tool_result for event in events
               if event.type == "tool_result" and event.tool_result is not None]
    assert results, [event.type for event in events]
    assert results[0]["tool_name"] == "get_weather"
    assert results[0]["success"] is True
    assert "sunny" in str(results[0]["result"])
    final = events[-1].result
    assert final is not None
    assert final.status == "completed", (final.error, final.messages)
    # The server sends no usage in streams: not reported, never 0.
    assert final.usage["total_tokens"] is None


def test_the_recorded_bytes_still_describe_the_server(smollm2_url: str) -> None:
    # The replayed tests stand on tests/providers/recordings/: the live server must still
    # repeat the whole name and id in every tool-call chunk and send no usage in a stream.
    import json

    from tests.providers.replay import recorded_request
    from tests.real_model.recorder import record

    raw = record(smollm2_url.removesuffix("/v1"), recorded_request("llama_cpp_stream_tool_call"))
    chunks = [json.loads(line[len(b"data: "):]) for line in raw.split(b"\n")
              if line.startswith(b"data: {")]
    calls = [call for chunk in chunks for choice in chunk["choices"]
             for call in (choice["delta"].get("tool_calls") or [])]
    assert len(calls) > 2
    assert {call["function"]["name"] for call in calls} == {"get_weather"}
    assert len({call["id"] for call in calls}) == 1
    assert not any(chunk.get("usage") for chunk in chunks)
