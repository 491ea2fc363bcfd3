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
