"""The per-turn fast paths give exactly what the slow paths they replace give."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from agents_api import LoopResult, Message, TurnResult
from agents_api._drive import ThreadCall, drive_async, drive_sync
from agents_api.construct import construct, construct_all
from datamachine.conversation.result import ConversationResult
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.normalize import already_normal, normalize_response


def _same(a: BaseModel, b: BaseModel) -> None:
    assert type(a) is type(b)
    assert list(a.__dict__.items()) == list(b.__dict__.items())
    assert a.model_fields_set == b.model_fields_set
    assert a.model_dump() == b.model_dump()
    assert repr(a) == repr(b)


@pytest.mark.parametrize(("cls", "values"), [
    (Message, {"schema_": "agents-api.message", "version": 1, "type": "text", "role": "user",
               "content": "hi", "payload": {}, "metadata": {}}),
    (TurnResult, {"content": "x", "tool_calls": [], "usage": {}, "request_metadata": {},
                  "complete": False, "continuation_messages": []}),
    (TurnResult, {"content": "only some fields"}),
    (LoopResult, {"messages": [], "status": "error", "turn_count": 2}),
    (ConversationResult, {"messages": [], "status": "completed", "turn_count": 3}),
    (ConversationResult, {"turn_count": 2, "not_a_field": 1}),
    (ProviderRequest, {"messages": [{"role": "user", "content": "x"}], "provider": "p"}),
])
def test_construct_builds_what_model_construct_builds(cls: type[BaseModel],
                                                      values: dict[str, Any]) -> None:
    _same(construct(cls, **values), cls.model_construct(**values))


def test_construct_gives_each_instance_fresh_mutable_defaults() -> None:
    class Holder(BaseModel):
        items: list[int] = Field(default_factory=list)
        fixed: list[int] = [1]  # a mutable default, which pydantic copies per instance

    first, second = construct(Holder), construct(Holder)
    first.items.append(1)
    first.fixed.append(2)
    assert second.items == []
    assert second.fixed == [1]
    _same(construct(Holder), Holder.model_construct())


def test_construct_all_falls_back_when_a_field_is_missing() -> None:
    built = construct_all(TurnResult, {"content": "x"})
    _same(built, TurnResult.model_construct(content="x"))


def test_message_builders_match_model_construct() -> None:
    _same(Message.text("user", "hi"), Message.model_construct(
        schema_="agents-api.message", version=1, type="text", role="user", content="hi",
        payload={}, metadata={}))
    _same(Message.tool_call("t", {"a": 1}, 2, "c"), Message.model_construct(
        schema_="agents-api.message", version=1, type="tool_call", role="assistant", content="",
        payload={"tool_name": "t", "parameters": {"a": 1}, "turn": 2},
        metadata={"tool_call_id": "c"}))


NORMAL = [
    ProviderResponse(content="", tool_calls=[{"id": "c1", "name": "double",
                                              "parameters": {"x": 1}}], finish_reason=None),
    ProviderResponse(content="thinking", tool_calls=[
        {"id": "c1", "name": "a", "parameters": {}},
        {"id": "c2", "name": "b", "parameters": {"nested": {"k": [1, 2]}}}],
        usage={"prompt_tokens": 3, "total_tokens": 4.5}, finish_reason="tool_calls", raw={"r": 1}),
    ProviderResponse(content="The answer is 4.", finish_reason="stop"),
    ProviderResponse(content='<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'),
    ProviderResponse(content=""),
]
UNUSUAL = [
    ProviderResponse(tool_calls=[{"name": "double", "parameters": {"x": 1}}]),
    ProviderResponse(tool_calls=[{"id": "", "name": "double", "parameters": {}}]),
    ProviderResponse(tool_calls=[{"id": "c", "name": " double ", "parameters": {}}]),
    ProviderResponse(tool_calls=[{"id": "c", "tool_name": "double", "parameters": {}}]),
    ProviderResponse(tool_calls=[{"id": "c", "name": "d", "parameters": {}, "extra": 1}]),
    ProviderResponse(usage={"prompt_tokens": 1, "details": {"cached": 1}, "flag": True}),
]


@pytest.mark.parametrize("response", NORMAL)
def test_already_normal_response_skips_renormalizing_with_the_same_result(
    response: ProviderResponse,
) -> None:
    fast = already_normal(response)
    assert fast is not None
    slow = normalize_response(response, provider="p", turn=3)
    assert fast.model_dump() == slow.model_dump()
    if response.tool_calls:
        assert fast.tool_calls[0]["parameters"] is not response.tool_calls[0]["parameters"]


@pytest.mark.parametrize("response", UNUSUAL)
def test_unusual_response_takes_the_full_normalization(response: ProviderResponse) -> None:
    assert already_normal(response) is None


def _steps_yielding(call: ThreadCall) -> Generator[Any, Any, Any]:
    try:
        return ("value", (yield call))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def _boom() -> None:
    raise ValueError("no")


async def _twice(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize(("fn", "args", "seconds"), [
    (lambda x: 2 * x, (21,), 5.0),
    (_boom, (), 5.0),
    (time.sleep, (0.5,), 0.05),
    (lambda x: _twice(x), (4,), 5.0),  # a coroutine handed back from the thread is awaited
    (lambda: 1, (), 0.0),
])
def test_thread_call_driven_sync_matches_the_awaited_path(
    fn: Any, args: tuple[Any, ...], seconds: float,
) -> None:
    sync = drive_sync(_steps_yielding(ThreadCall(fn, args, seconds)))
    awaited = asyncio.run(drive_async(_steps_yielding(ThreadCall(fn, args, seconds))))
    assert sync == awaited


_ODD_VALUES: list[Any] = [
    {"b": 1, "a": [1.5, None, True, "é \" \\ \n"], "c": {"z": float("nan"), "y": -0.0}},
    "plain", 7, 2.5, float("inf"), None, False, [], {},
    {"when": __import__("datetime").date(2026, 11, 22), "path": __import__("pathlib").Path("/x")},
    {1: "int key", "s": "str key"},
]


@pytest.mark.parametrize("options", [
    {"sort_keys": True, "ensure_ascii": False},
    {"sort_keys": False, "ensure_ascii": False, "separators": (",", ":")},
    {"sort_keys": True, "ensure_ascii": True, "separators": (",", ":")},
])
@pytest.mark.parametrize("value", _ODD_VALUES)
def test_json_encoder_writes_what_json_dumps_writes(value: Any, options: dict[str, Any]) -> None:
    import json

    from agents_api.jsontext import json_encoder

    encode = json_encoder(default=str, **options)
    try:
        expected = json.dumps(value, default=str, **options)
    except TypeError:  # int and str keys cannot be sorted together: both refuse
        with pytest.raises(TypeError):
            encode(value)
        return
    assert encode(value) == expected


def test_json_encoder_reports_a_cycle_like_json_dumps() -> None:
    from agents_api.jsontext import json_encoder

    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular reference"):
        json_encoder()(cyclic)
    # The shared encoder keeps no state from the failed call.
    assert json_encoder()({"ok": [1, 2]}) == '{"ok": [1, 2]}'


def test_json_encoder_without_default_refuses_unknown_objects() -> None:
    from agents_api.jsontext import json_encoder

    with pytest.raises(TypeError, match="not JSON serializable"):
        json_encoder(default=None)({"x": object()})


_PLAIN_JSON: list[Any] = [
    {"b": 1, "a": [1.5, None, True, "é \" \\ \n \u2028 \x00"], "c": {"z": float("nan"), "y": -0.0}},
    "plain", 7, 2.5, 1e300, 123456789.123, 10**30, float("-inf"), None, False, [], {},
    {1: "int key", "s": "str key", 2.5: "float key", False: "bool key"},
    {"nested": [{"deep": [[], {}, [1, [2, [3]]]]}], "emoji": "\U0001f600"},
]


@pytest.mark.parametrize("value", _PLAIN_JSON)
def test_compact_json_writes_what_json_dumps_writes_for_json_values(value: Any) -> None:
    import json

    from agents_api.jsontext import compact_json

    assert compact_json(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_compact_json_writes_values_json_cannot_hold_as_documented() -> None:
    import dataclasses
    import datetime as dt
    import enum
    import json

    from agents_api.jsontext import compact_json

    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: int

    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    value = {"when": dt.datetime(2026, 1, 2, 3, 4, 5), "colour": Colour.RED, "tags": {"a"},
             "point": Point(1), "other": Opaque(), "tiny": 1e-7}
    assert json.loads(compact_json(value)) == {
        "when": "2026-01-02T03:04:05", "colour": "red", "tags": ["a"], "point": {"x": 1},
        "other": "opaque!", "tiny": 1e-7}


def test_compact_json_hands_what_pydantic_refuses_to_the_standard_encoder() -> None:
    import json

    from agents_api.jsontext import compact_json

    # Bytes that are not UTF-8: pydantic-core refuses them; the standard encoder writes str().
    assert json.loads(compact_json({"raw": b"\xff"})) == {"raw": "b'\\xff'"}
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular reference"):
        compact_json(cyclic)


def test_a_copied_tool_does_not_reuse_its_originals_provider_json() -> None:
    import json

    from datamachine.tools import Tool

    tool = Tool(name="ping", description="Ping.", parameters={"type": "object"},
                function=lambda: "pong")
    assert json.loads(tool.provider_json())["description"] == "Ping."
    copy = tool.model_copy(update={"description": "Changed."})
    assert json.loads(copy.provider_json()) == copy.to_provider_dict()
    assert json.loads(tool.provider_json())["description"] == "Ping."


def test_a_successful_result_is_copied_so_the_executors_dict_stays_its_own() -> None:
    from agents_api._tools import normalize_tool_result

    constant = {"success": True, "result": "done"}
    result = normalize_tool_result(constant)
    result["seen"] = 1
    assert constant == {"success": True, "result": "done"}
