"""The thread path of a time rail matches the awaited one; one JSON encoder, three spellings."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Generator
from typing import Any

import pytest

from agents_api.drive import ThreadCall, drive_async, drive_sync
from agents_api.jsontext import canonical_json, compact_json


def _steps_yielding(call: ThreadCall[*tuple[object, ...]]) -> Generator[Any, Any, Any]:
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


_PLAIN_JSON: list[Any] = [
    {"b": 1, "a": [1.5, None, True, "é \" \\ \n \u2028 \x00"], "c": {"y": -0.0}},
    "plain", 7, 2.5, 1e300, 1e-7, 123456789.123, 10**30, None, False, [], {},
    {"nested": [{"deep": [[], {}, [1, [2, [3]]]]}], "emoji": "\U0001f600"},
]


@pytest.mark.parametrize("value", _PLAIN_JSON)
def test_compact_json_reads_back_as_the_value_and_has_no_whitespace(value: Any) -> None:
    text = compact_json(value)
    assert json.loads(text) == value
    assert json.loads(canonical_json(value)) == value
    assert ": " not in text.replace('": "', "")  # no separator whitespace


def test_canonical_json_sorts_keys_at_every_depth() -> None:
    one = {"b": {"y": 1, "x": [{"d": 1, "c": 2}]}, "a": 0}
    two = {"a": 0, "b": {"x": [{"c": 2, "d": 1}], "y": 1}}
    assert canonical_json(one) == canonical_json(two) == (
        '{"a":0,"b":{"x":[{"c":2,"d":1}],"y":1}}')
    with pytest.raises(TypeError):  # keys that cannot be ordered, as json.dumps refuses them
        canonical_json({1: "int key", "s": "str key"})


def test_values_json_cannot_hold_are_written_as_pydantic_writes_them() -> None:
    import datetime as dt
    import enum

    class Colour(enum.Enum):
        RED = "red"

    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    value = {"when": dt.datetime(2026, 1, 2, 3, 4, 5), "colour": Colour.RED, "tags": {"a"},
             "other": Opaque(), "raw": b"\xff", "nan": float("nan")}
    decoded = json.loads(compact_json(value))
    assert decoded["when"] == "2026-01-02T03:04:05"
    assert (decoded["colour"], decoded["tags"], decoded["other"]) == ("red", ["a"], "opaque!")
    assert decoded["raw"] == "_w=="  # bytes that are not UTF-8: URL-safe base64
    assert decoded["nan"] != decoded["nan"]  # NaN, as json.dumps writes it


def test_a_cycle_is_refused_with_a_value_error() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular reference"):
        compact_json(cyclic)


def test_a_copied_tool_does_not_reuse_its_originals_provider_json() -> None:
    from datamachine.tools import Tool

    tool = Tool(name="ping", description="Ping.", parameters={"type": "object"},
                function=lambda: "pong")
    assert json.loads(tool.provider_json())["description"] == "Ping."
    copy = tool.model_copy(update={"description": "Changed."})
    assert json.loads(copy.provider_json()) == copy.to_provider_dict()
    assert json.loads(tool.provider_json())["description"] == "Ping."


def test_a_successful_result_is_copied_so_the_executors_dict_stays_its_own() -> None:
    from agents_api import normalize_tool_result

    constant = {"success": True, "result": "done"}
    result = normalize_tool_result(constant)
    result["seen"] = 1
    assert constant == {"success": True, "result": "done"}
