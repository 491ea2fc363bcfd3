"""The executor: argument checks, failures as readable results, sync and async, context."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any

import pytest

from agents_api import IterationBudget, arun_loop
from datamachine.errors import InvalidToolRuntimeRule
from datamachine.registry import IterationBudgetRegistry
from datamachine.tools import ToolContext, ToolExecutor, tool
from datamachine.tools.results import REJECTED, is_rejected
from tests.tools.helpers import ScriptedRunner, call, run_turns, tool_results


@tool
def add(a: int, b: int, scale: float = 1.0) -> float:
    """Add two integers and scale the sum."""
    return (a + b) * scale


@tool
def explode(reason: str) -> None:
    """Always fails."""
    raise RuntimeError(reason)


@tool
async def slow_upper(text: str) -> str:
    """Upper-case text, asynchronously."""
    await asyncio.sleep(0)
    return text.upper()


@tool
async def async_explode() -> None:
    """Fails after awaiting."""
    await asyncio.sleep(0)
    raise ValueError("async boom")


def run_one(executor: ToolExecutor, tool_name: str, /, **params: Any) -> dict[str, Any]:
    result = executor({"id": "c1", "name": tool_name, "parameters": params}, {"turn": 1})
    assert isinstance(result, dict), "sync tools must not return an awaitable"
    return result


def test_sync_tool_result_carries_tool_name_and_parameters() -> None:
    result = run_one(ToolExecutor([add]), "add", a=2, b=3)
    assert result == {"success": True, "result": 5.0, "tool_name": "add",
                      "parameters": {"a": 2, "b": 3}}


def test_missing_required_parameters_message_is_exact() -> None:
    result = run_one(ToolExecutor([add]), "add")
    assert result["success"] is False
    assert result["error"] == 'Tool "add" requires the following parameters: a, b.'
    assert result["error_type"] == "invalid_arguments"
    assert result["missing_parameters"] == ["a", "b"]


def test_empty_required_values_count_as_missing() -> None:
    @tool
    def greet(name: str) -> str:
        """Greet."""
        return name

    for empty in ("", None):
        result = run_one(ToolExecutor([greet]), "greet", name=empty)
        assert result["error"] == 'Tool "greet" requires the following parameters: name.'


def test_wrong_types_are_reported_per_parameter() -> None:
    result = run_one(ToolExecutor([add]), "add", a="two", b=[1], scale="x")
    assert result["error_type"] == "invalid_arguments"
    assert result["error"] == (
        'Tool "add" received invalid arguments: a: Input should be a valid integer, unable to '
        'parse string as an integer (got "two"); b: Input should be a valid integer (got [1]); '
        'scale: Input should be a valid number, unable to parse string as a number (got "x"). '
        "Fix them and call again.")
    assert len(result["invalid_arguments"]) == 3


def test_integral_floats_are_passed_as_ints_and_null_optionals_use_defaults() -> None:
    seen: dict[str, Any] = {}

    @tool
    def page(number: int, size: int = 20) -> None:
        """Page."""
        seen.update(number=number, size=size)

    result = run_one(ToolExecutor([page]), "page", number=3.0, size=None)
    assert result["success"] is True
    assert seen == {"number": 3, "size": 20}
    assert isinstance(seen["number"], int)


def test_enum_and_array_item_types_are_checked() -> None:
    @tool
    def pick(colour: str, ids: list[int]) -> None:
        """Pick."""

    executor = ToolExecutor([tool(name="pick", parameters={
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "blue"]},
                       "ids": {"type": "array", "items": {"type": "integer"}}},
        "required": ["colour", "ids"]})(pick.function)])
    result = run_one(executor, "pick", colour="green", ids=[1, "2"])
    assert "colour must be one of \"red\", \"blue\" (got \"green\")" in result["error"]
    assert "ids[1] must be an integer (got \"2\")" in result["error"]


def test_unknown_parameters_are_named_when_the_function_cannot_take_them() -> None:
    result = run_one(ToolExecutor([add]), "add", a=1, b=2, c=3)
    assert result["error_type"] == "invalid_arguments"
    assert result["unknown_parameters"] == ["c"]
    assert result["error"] == ('Tool "add" received invalid arguments: c is not a parameter of '
                               "this tool. Its parameters are: a, b, scale. Fix them and call "
                               "again.")


def test_kwargs_functions_receive_every_parameter() -> None:
    @tool(parameters={"type": "object", "properties": {}})
    def anything(**kwargs: Any) -> dict[str, Any]:
        """Anything."""
        return kwargs

    assert run_one(ToolExecutor([anything]), "anything", x=1, y="z")["result"] == {"x": 1, "y": "z"}


def test_json_string_arguments_are_decoded_and_other_shapes_refused() -> None:
    executor = ToolExecutor([add])
    ok = executor({"id": "1", "name": "add", "parameters": '{"a": 1, "b": 1}'}, {})
    assert isinstance(ok, dict)
    assert ok["result"] == 2.0
    bad = executor({"id": "2", "name": "add", "parameters": "[1, 2]"}, {})
    assert isinstance(bad, dict)
    assert bad["error_type"] == "invalid_arguments"
    assert "they are JSON a list, not an object" in bad["error"]
    assert "You sent: [1, 2]" in bad["error"]


def test_arguments_that_are_not_json_say_where_and_what_was_sent() -> None:
    executor = ToolExecutor([add])
    broken = executor({"id": "1", "name": "add", "parameters": '{"a": 1,, "b": 2}'}, {})
    assert isinstance(broken, dict)
    assert broken["success"] is False
    assert broken["error_type"] == "invalid_arguments"
    assert "not valid JSON (Expecting property name enclosed in double quotes at character 9)" \
        in broken["error"]
    assert "Call 'add' again with its arguments as one JSON object." in broken["error"]


def test_arguments_cut_off_mid_object_are_called_cut_off() -> None:
    executor = ToolExecutor([add])
    for raw in ('{"a": 1, "b": ', '{"a": 1, "b": "tw', '{"a": 1'):
        result = executor({"id": "1", "name": "add", "parameters": raw}, {})
        assert isinstance(result, dict)
        assert result["error_type"] == "invalid_arguments", raw
        assert "cut off" in result["error"], raw


def test_an_unknown_tool_with_broken_arguments_is_reported_as_unknown() -> None:
    result = ToolExecutor([add])({"id": "1", "name": "nope", "parameters": "{"}, {})
    assert isinstance(result, dict)
    assert result["error_type"] == "tool_not_found"


def test_unknown_tool_is_a_failed_result_listing_available_tools() -> None:
    result = run_one(ToolExecutor([add, explode]), "subtract", a=1)
    assert result["success"] is False
    assert result["error"] == "Tool 'subtract' not found. Available tools: add, explode."
    assert result["error_type"] == "tool_not_found"
    assert result["available_tools"] == ["add", "explode"]


def test_raising_tool_becomes_a_result_the_model_can_read() -> None:
    result = run_one(ToolExecutor([explode]), "explode", reason="disk full")
    assert result["success"] is False
    assert result["error_type"] == "tool_exception"
    assert result["error"].startswith("Tool 'explode' failed: RuntimeError: disk full.")
    assert result["exception"] == "RuntimeError"


def test_tool_reported_failures_and_successes_are_normalized() -> None:
    @tool
    def post(title: str) -> dict[str, Any]:
        """Post."""
        if title == "bad":
            return {"success": False, "error": "Title rejected by the site.", "code": 422}
        if title == "silent":
            return {"success": False}
        if title == "card":
            return {"success": False, "message": "card declined", "code": 402}
        return {"success": True, "url": "https://example.test/1"}

    executor = ToolExecutor([post])
    assert run_one(executor, "post", title="ok")["result"] == {"url": "https://example.test/1"}
    failed = run_one(executor, "post", title="bad")
    assert failed["error"] == "Title rejected by the site."
    assert failed["code"] == 422
    assert failed["error_type"] == "tool_error"
    assert run_one(executor, "post", title="silent")["error"] == "Tool execution failed."
    # Without an error, the tool's message is what the model reads.
    declined = run_one(executor, "post", title="card")
    assert (declined["error"], declined["code"]) == ("card declined", 402)


def test_non_json_values_are_made_json_ready_instead_of_failing() -> None:
    import datetime

    @tool
    def when() -> dict[str, Any]:
        """When."""
        return {"at": datetime.date(2026, 1, 2), "tags": {"a"}}

    assert run_one(ToolExecutor([when]), "when")["result"] == {"at": "2026-01-02", "tags": ["a"]}


def test_async_tool_returns_an_awaitable_only_for_async_tools() -> None:
    executor = ToolExecutor([add, slow_upper])
    pending = executor({"id": "1", "name": "slow_upper", "parameters": {"text": "hi"}}, {})
    assert inspect.isawaitable(pending)
    assert isinstance(pending, Awaitable)
    result = asyncio.run(_await(pending))
    assert result["result"] == "HI"
    assert result["parameters"] == {"text": "hi"}
    assert not inspect.isawaitable(
        executor({"id": "2", "name": "add", "parameters": {"a": 1, "b": 2}}, {}))


def test_async_tool_that_raises_becomes_a_failed_result() -> None:
    executor = ToolExecutor([async_explode])
    pending = executor({"id": "1", "name": "async_explode", "parameters": {}}, {})
    assert isinstance(pending, Awaitable)
    result = asyncio.run(_await(pending))
    assert result["error_type"] == "tool_exception"
    assert "ValueError: async boom" in result["error"]


async def _await(pending: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    return await pending


def test_context_exposes_payload_without_runtime_objects_mode_turn_and_engine_data() -> None:
    seen: list[ToolContext] = []

    @tool
    def record(note: str, context: ToolContext) -> str:
        """Record a note in the job's engine data."""
        seen.append(context)
        context.engine_data.setdefault("notes", []).append(note)
        return note

    engine_data: dict[str, Any] = {"existing": True}
    payload = {"job_id": 7, "engine_data": engine_data, "event_sink": object(),
               "transcript_lock": object(), "tool_runtime_rules": []}
    executor = ToolExecutor([record], mode="system", payload=payload)
    result = run_turns(executor, [[call("record", "a", note="one")],
                                  [call("record", "b", note="two")]])
    assert result.status == "completed"
    assert engine_data == {"existing": True, "notes": ["one", "two"]}
    assert executor.engine_data is engine_data
    first, second = seen
    assert (first.mode, first.turn, second.turn) == ("system", 1, 2)
    assert first.tool_name == "record"
    assert first.tool_call_id == "a"
    assert first.payload["job_id"] == 7
    assert "event_sink" not in first.payload
    assert "transcript_lock" not in first.payload
    assert "tool_runtime_rules" not in first.payload
    with pytest.raises(TypeError):
        first.payload["job_id"] = 8  # type: ignore[index]


def test_multi_mode_runs_show_tools_the_label_and_the_modes() -> None:
    seen: list[ToolContext] = []

    @tool
    def where(context: ToolContext) -> None:
        """Where."""
        seen.append(context)

    ToolExecutor([where], mode=["cluckin", "chat"])({"id": "1", "name": "where"}, {})
    ToolExecutor([where], mode="pipeline")({"id": "2", "name": "where"}, {})
    assert [(c.mode, c.modes) for c in seen] == [("cluckin,chat", ("cluckin", "chat")),
                                                 ("pipeline", ("pipeline",))]


def test_explicit_engine_data_is_used_when_given() -> None:
    @tool
    def mark(context: ToolContext) -> None:
        """Mark."""
        context.engine_data["marked"] = True

    engine_data: dict[str, Any] = {}
    executor = ToolExecutor([mark], payload={"engine_data": {"other": 1}}, engine_data=engine_data)
    run_one(executor, "mark")
    assert engine_data == {"marked": True}


def test_context_budget_is_created_from_the_registry_once_and_shared() -> None:
    registry = IterationBudgetRegistry(settings_lookup={"max_lookups": 4}.get)
    registry.register("lookups", {"default": 2, "min": 1, "max": 3, "setting": "max_lookups"})
    budgets_seen: list[IterationBudget] = []

    @tool(runtime={"duplicate_policy": "repeatable"})
    def lookup(context: ToolContext) -> int:
        """Look up."""
        budget = context.budget("lookups")
        budgets_seen.append(budget)
        return budget.increment()

    warnings: list[str] = []
    executor = ToolExecutor([lookup], registry=registry, warnings=warnings)
    run_budgets: dict[str, IterationBudget] = {}
    for turn in (1, 2):
        executor({"id": str(turn), "name": "lookup", "parameters": {}},
                 {"turn": turn, "budgets": run_budgets})
    assert budgets_seen[0] is budgets_seen[1] is run_budgets["lookups"]
    budget = run_budgets["lookups"]
    assert (budget.current(), budget.ceiling(), budget.hard_ceiling()) == (2, 3, 3)
    # The setting asked for 4; the clamp applied 3 and the run is told.
    assert len(warnings) == 1
    assert "requested ceiling 4" in warnings[0]


def test_context_budget_returns_a_budget_the_run_already_has() -> None:
    mine = IterationBudget("lookups", 9)

    @tool
    def peek(context: ToolContext) -> int:
        """Peek."""
        return context.budget("lookups").ceiling()

    result = ToolExecutor([peek])({"id": "1", "name": "peek", "parameters": {}},
                                  {"budgets": {"lookups": mine}})
    assert isinstance(result, dict)
    assert result["result"] == 9


def test_budget_added_by_a_tool_stops_the_loop_after_the_call_that_spends_it() -> None:
    registry = IterationBudgetRegistry()
    registry.register("emails", {"default": 2, "min": 1, "max": 5})

    @tool(runtime={"duplicate_policy": "repeatable"})
    def send_email(to: str, context: ToolContext) -> str:
        """Send an email."""
        context.budget("emails").increment()
        return f"sent to {to}"

    executor = ToolExecutor([send_email], registry=registry)
    turns = [[call("send_email", f"c{i}", to="a@example.test")] for i in range(5)]
    result = run_turns(executor, turns)
    assert result.status == "budget_exceeded"
    assert result.budget == "emails"
    assert "max_emails_reached" in result.flags
    assert result.turn_count == 2
    assert result.budgets["emails"]["current"] == 2


def test_one_failing_tool_never_ends_the_run() -> None:
    executor = ToolExecutor([add, explode])
    result = run_turns(executor, [
        [call("explode", "1", reason="first"), call("nope", "2"), call("add", "3", a=1)],
        [call("add", "4", a=1, b=2)],
    ])
    assert result.status == "completed"
    assert result.final_content == "done"
    outcomes = [(m.payload["tool_name"], m.payload["success"]) for m in tool_results(result)]
    assert outcomes == [("explode", False), ("nope", False), ("add", False), ("add", True)]
    assert tool_results(result)[-1].content == "3.0"


def test_async_tools_run_inside_arun_loop() -> None:
    executor = ToolExecutor([slow_upper, add])
    runner = ScriptedRunner([[call("slow_upper", "1", text="hi"), call("add", "2", a=1, b=1)]])

    async def main() -> Any:
        return await arun_loop([{"role": "user", "content": "go"}], runner,
                               turn_budget=IterationBudget("conversation_turns", 5),
                               tool_executor=executor)

    result = asyncio.run(main())
    assert [m.content for m in tool_results(result)] == ["HI", "2.0"]


def test_async_tools_also_work_from_the_sync_loop() -> None:
    result = run_turns(ToolExecutor([slow_upper]), [[call("slow_upper", "1", text="ok")]])
    assert [m.content for m in tool_results(result)] == ["OK"]


def test_bad_runtime_rules_fail_when_the_executor_is_built() -> None:
    with pytest.raises(InvalidToolRuntimeRule, match=r"tool_runtime_rules\[0\]\.max_calls"):
        ToolExecutor([add], payload={"tool_runtime_rules": [
            {"after_tool": "a", "limited_tools": ["b"], "max_calls": 0,
             "then_require_one_of": ["c"]}]})


@pytest.mark.parametrize("returned", [
    {"success": True, "result": {"id": 7}, "rejected": True},
    {"success": True, "result": {"id": 7}, "_dm_rejected": True},
    {"success": False, "error": "the site said no", "rejected": True},
    {"success": False, "error": "the site said no", "_dm_rejected": True},
])
def test_a_tool_cannot_forge_the_executors_refusal_mark(returned: dict[str, Any]) -> None:
    # A tool returning "rejected": true hid its own result from tool_execution_results and
    # the completion counts. Only the executor marks a refusal, under a key no tool can set.
    @tool
    def publish() -> dict[str, Any]:
        """Publish."""
        return dict(returned)

    result = run_one(ToolExecutor([publish]), "publish")
    assert not is_rejected(result)
    assert REJECTED not in result
    assert result.get("rejected") is returned.get("rejected")  # the tool's own data, kept
