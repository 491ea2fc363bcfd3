"""datamachine.testing's models (DESIGN.md 25): ``TestModel`` calls every offered tool once with
arguments made from its schema, then answers with the results as JSON; ``FunctionModel(fn)``
answers with what ``fn(messages, tools)`` returns. Both are plugins that register a provider,
and both answer with ``allow_model_requests`` off, where any other provider raises
``ModelRequestsDisabled`` from every run entry point."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterator
from typing import Any, Literal

import pytest

import bootstrap
import datamachine
from datamachine import ModelRequestsDisabled, ProviderResponse, hookimpl, tool
from datamachine.host import Host
from datamachine.testing import FunctionModel, TestModel

ASK = [{"role": "user", "content": "Where is my order?"}]
RECEIVED: list[tuple[str, dict[str, Any]]] = []


@tool
def get_order(order_id: str, expand: bool = False) -> dict[str, str]:
    """Look up an order.

    Args:
        order_id: The order number.
        expand: Whether to include the lines.
    """
    RECEIVED.append(("get_order", {"order_id": order_id, "expand": expand}))
    return {"order_id": order_id, "status": "shipped"}


@tool
def ship_by(day: datetime.date, speed: Literal["slow", "fast"], boxes: list[int]) -> str:
    """Book a shipment.

    Args:
        day: When.
        speed: How fast.
        boxes: Box sizes.
    """
    RECEIVED.append(("ship_by", {"day": day, "speed": speed, "boxes": boxes}))
    return f"booked {speed} on {day.isoformat()}"


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    RECEIVED.clear()
    yield
    RECEIVED.clear()


def booted(*plugins: object) -> Host:
    return bootstrap.boot(db_path=":memory:", plugins=plugins, load_entrypoints=False)


# -- TestModel ----------------------------------------------------------------------------

def test_test_model_calls_every_tool_once_then_answers_with_the_results_as_json() -> None:
    model = TestModel()
    with booted(model) as host:
        assert host.providers.get("test") is model  # a provider like any registered one
        result = host.run_conversation(ASK, [get_order, ship_by], provider="test")
    assert (result.status, result.turn_count) == ("completed", 2)
    assert sorted(RECEIVED, key=lambda item: item[0]) == [
        ("get_order", {"order_id": "a", "expand": False}),
        ("ship_by", {"day": datetime.date(2024, 1, 1), "speed": "slow", "boxes": [0]})]
    assert json.loads(result.final_content) == {
        "get_order": {"order_id": "a", "status": "shipped"},
        "ship_by": "booked slow on 2024-01-01"}
    first, second = model.requests
    assert [call["name"] for call in second.messages[1]["tool_calls"]] == ["get_order",
                                                                           "ship_by"]
    assert first.provider == "test"
    assert result.usage["prompt_tokens"] > 50  # estimated as pydantic-ai does
    assert result.usage["completion_tokens"] > 0


def test_test_model_options_choose_the_tools_the_answer_and_the_arguments() -> None:
    model = TestModel(call_tools=["get_order"], custom_output_text="All done.", seed=1)
    with booted(model) as host:
        result = host.run_conversation(ASK, [get_order, ship_by], provider="test")
    assert result.final_content == "All done."
    assert RECEIVED == [("get_order", {"order_id": "b", "expand": False})]


def test_test_model_without_tools_says_it_called_none() -> None:
    with booted(TestModel()) as host:
        result = host.run_conversation(ASK, provider="test")
    assert result.final_content == "success (no tool calls)"


@tool(runtime={"duplicate_policy": "repeatable"})
def roll() -> int:
    """Roll a die."""
    RECEIVED.append(("roll", {}))
    return 4


def test_test_model_calls_the_tools_again_for_the_next_chat_message() -> None:
    with booted(TestModel()) as host:
        session = host.chat_sessions.create()
        first = host.chat(session.id, "first", [roll], provider="test")
        second = host.chat(session.id, "second", [roll], provider="test")
    assert (first.final_content, second.final_content) == ('{"roll": 4}', '{"roll": 4}')
    assert (first.turn_count, second.turn_count) == (2, 2)
    assert RECEIVED == [("roll", {}), ("roll", {})]


def test_test_model_refuses_a_call_tools_that_is_not_a_list() -> None:
    with pytest.raises(datamachine.UsageError, match="call_tools"):
        TestModel(call_tools="get_order")


def test_a_test_model_imported_into_a_test_module_is_not_collected(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="""
        from datamachine.testing import TestModel

        def test_one():
            assert TestModel().name == "test"
    """)
    ran = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    ran.assert_outcomes(passed=1)


# -- FunctionModel ------------------------------------------------------------------------

def test_function_model_answers_with_what_the_function_returns() -> None:
    seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append((messages, tools))
        if messages[-1]["role"] == "user":
            return {"tool_calls": [{"name": "get_order", "parameters": {"order_id": "A-7"}}]}
        return f"Order A-7: {json.loads(messages[-1]['content'])['status']}."

    function = FunctionModel(model)
    with booted(function) as host:
        assert host.providers.get("function") is function
        result = host.run_conversation(ASK, [get_order], provider="function")
    assert (result.status, result.final_content) == ("completed", "Order A-7: shipped.")
    assert RECEIVED == [("get_order", {"order_id": "A-7", "expand": False})]
    assert [tool["name"] for tool in seen[0][1]] == ["get_order"]
    assert len(function.requests) == 2


def test_function_model_takes_a_provider_response_an_exception_and_async_functions() -> None:
    async def later(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        await asyncio.sleep(0)
        return ProviderResponse(content="async answer", usage={"total_tokens": 3})

    with booted(FunctionModel(later)) as host:
        answered = host.run_conversation(ASK, provider="function")
    assert (answered.final_content, answered.usage["total_tokens"]) == ("async answer", 3)
    with booted(FunctionModel(lambda messages, tools: TimeoutError("no answer"))) as host:
        failed = host.run_conversation(ASK, provider="function")
    assert (failed.status, failed.error) == ("error", "no answer")
    with booted(FunctionModel(lambda messages, tools: 42)) as host:
        bad = host.run_conversation(ASK, provider="function")
    assert bad.error_code == "provider_bad_response"
    assert "FunctionModel's function returned int" in (bad.error or "")


def test_function_model_needs_a_function() -> None:
    with pytest.raises(datamachine.UsageError, match="fn must be callable"):
        FunctionModel("not a function")  # type: ignore[arg-type]


# -- allow_model_requests off -------------------------------------------------------------

def test_the_test_models_answer_on_dm_host_where_requests_are_off(dm_host: Host) -> None:
    dm_host.providers.register(TestModel())
    dm_host.providers.register(FunctionModel(lambda messages, tools: "from fn"))
    assert dm_host.settings.get("allow_model_requests") is False
    assert dm_host.run_conversation(ASK, [get_order], provider="test").status == "completed"
    assert dm_host.run_conversation(ASK, provider="function").final_content == "from fn"
    assert dm_host.run_conversation(ASK, provider="scripted").final_content.startswith("echo")


def test_every_entry_point_raises_instead_of_returning_an_error(dm_host: Host,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                ) -> None:
    # A test that forgot to check result.status passed: the refusal was an error *result*.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(ModelRequestsDisabled) as refused:
        dm_host.run_conversation(ASK, provider="openai", model="m")
    assert refused.value.provider == "openai"
    with pytest.raises(ModelRequestsDisabled):
        asyncio.run(dm_host.arun_conversation(ASK, provider="openai", model="m"))
    with pytest.raises(ModelRequestsDisabled):
        dm_host.stream_conversation(ASK, provider="openai", model="m")

    async def consume() -> None:
        async for _ in dm_host.astream_conversation(ASK, provider="openai", model="m"):
            pass

    with pytest.raises(ModelRequestsDisabled):
        asyncio.run(consume())
    with pytest.raises(ModelRequestsDisabled):
        datamachine.run_conversation(ASK, provider="openai", model="m")  # the default host
    assert dm_host.transcripts.list() == []  # refused before anything ran


class _FirstAnswer:
    """Answers (as the app's configured provider) until switched off, then declines."""

    def __init__(self) -> None:
        self.on = True

    @hookimpl
    def provider_availability(self, provider: str, model: str) -> bool:
        return True

    @hookimpl
    def text_result(self, request: Any) -> Any:
        if not self.on:
            return None
        if request.tools and not any(m["role"] == "tool" for m in request.messages):
            return {"tool_calls": [{"name": "get_order", "parameters": {"order_id": "A"}}]}
        return {"content": "answered"}


def test_a_declining_text_result_hook_raises_after_the_run_on_every_entry_point() -> None:
    hook = _FirstAnswer()
    with booted(hook) as host:
        first = host.run_conversation(ASK, [get_order], "openai", "m", max_turns=1,
                                      payload={"confirmation": "pause"})
        assert first.status == "awaiting_confirmation"
        session = host.chat_sessions.create()
        assert host.chat(session.id, "hi", provider="openai", model="m").status == "completed"
        stopped = host.run_conversation(ASK, [get_order], "openai", "m", max_turns=1)
        host.settings.set("allow_model_requests", False)
        hook.on = False
        with pytest.raises(ModelRequestsDisabled, match="provider 'openai' was not called"):
            host.run_conversation(ASK, provider="openai", model="m")
        with pytest.raises(ModelRequestsDisabled):
            host.chat(session.id, "again", provider="openai", model="m")
        assert stopped.transcript_session_id is not None
        with pytest.raises(ModelRequestsDisabled):
            host.continue_conversation(stopped.transcript_session_id, 1, [get_order])
        assert first.transcript_session_id is not None
        with pytest.raises(ModelRequestsDisabled):
            host.resume(first.transcript_session_id, True, 1, [get_order])


def test_the_chat_endpoint_answers_503_with_requests_off(dm_host: Host) -> None:
    from datamachine.server.errors import problem_for

    problem = problem_for(ModelRequestsDisabled("off", provider="openai"))
    assert (problem.status, problem.code) == (503, "model_requests_disabled")
