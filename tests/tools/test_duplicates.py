"""Duplicate tool calls: a call that already succeeded with the same arguments is rejected."""

from __future__ import annotations

from typing import Any, SupportsIndex, cast

import pytest

from agents_api import Message
from agents_api.records import ToolRecord
from datamachine.tools import (
    DUPLICATE_PREFIX,
    ToolExecutor,
    duplicate_message,
    duplicate_mode,
    tool,
)
from datamachine.tools.history import TranscriptIndex
from datamachine.tools.results import REJECTED
from tests.tools.helpers import call, run_turns, tool_results


@tool
def search(query: str, filters: dict[str, Any] | None = None) -> list[str]:
    """Search."""
    return [query]


@tool(runtime={"duplicate_policy": "repeatable"})
def now() -> str:
    """The time (changes every call)."""
    return "12:00"


FLAKY_STATE: dict[str, int] = {}


@tool
def flaky(key: str) -> dict[str, Any]:
    """Fails the first time for each key."""
    FLAKY_STATE[key] = FLAKY_STATE.get(key, 0) + 1
    if FLAKY_STATE[key] == 1:
        return {"success": False, "error": "temporarily unavailable"}
    return {"success": True, "result": "ok"}


def outcomes(result: Any) -> list[tuple[object, object]]:
    return [(m.payload["success"], m.payload.get("error_type")) for m in tool_results(result)]


def test_same_arguments_in_another_key_order_are_a_duplicate() -> None:
    executor = ToolExecutor([search], mode="pipeline")
    result = run_turns(executor, [
        [call("search", "1", query="cats", filters={"year": 2024, "lang": "en"})],
        [{"id": "2", "name": "search",
          "parameters": {"filters": {"lang": "en", "year": 2024}, "query": "cats"}}],
    ])
    assert outcomes(result) == [(True, None), (False, "duplicate_tool_call")]
    rejected = tool_results(result)[1]
    assert rejected.payload[REJECTED] is True
    assert str(rejected.content).startswith("DUPLICATE REJECTED: search")
    # The rejected call stays in the transcript, its tool_call included.
    assert [m.type for m in result.messages].count("tool_call") == 2


def test_different_arguments_are_not_a_duplicate() -> None:
    result = run_turns(ToolExecutor([search]), [
        [call("search", "1", query="cats")],
        [call("search", "2", query="dogs")],
        [call("search", "3", query="cats", filters={"lang": "en"})],
    ])
    assert outcomes(result) == [(True, None), (True, None), (True, None)]


def test_a_call_whose_twin_failed_may_be_retried() -> None:
    FLAKY_STATE.clear()
    result = run_turns(ToolExecutor([flaky]), [
        [call("flaky", "1", key="a")],
        [call("flaky", "2", key="a")],
        [call("flaky", "3", key="a")],
    ])
    # Failed, then the retry succeeds, then the third identical call is the duplicate.
    assert outcomes(result) == [(False, "tool_error"), (True, None),
                                (False, "duplicate_tool_call")]


def test_a_call_with_no_result_in_the_transcript_may_be_retried() -> None:
    # A previous run crashed after the tool_call was stored but before its result.
    history = [
        Message(role="user", content="find cats"),
        Message.tool_call("search", {"query": "cats"}, 1, "old-1"),
    ]
    result = run_turns(ToolExecutor([search]), [[call("search", "new-1", query="cats")]],
                       messages=history)
    assert outcomes(result) == [(True, None)]


def test_successes_from_an_earlier_run_of_the_conversation_count() -> None:
    history = [
        Message(role="user", content="find cats"),
        Message.tool_call("search", {"query": "cats"}, 1, "old-1"),
        Message.tool_result("search", {"success": True, "result": ["cats"]}, 1, "old-1",
                            '["cats"]'),
    ]
    result = run_turns(ToolExecutor([search], mode="chat"),
                       [[call("search", "new-1", query="cats")]], messages=history)
    assert outcomes(result)[-1] == (False, "duplicate_tool_call")


def test_plain_dict_history_is_read_too() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "find cats"},
        {"role": "assistant", "content": "", "type": "tool_call",
         "metadata": {"tool_call_id": "x", "tool_name": "search",
                      "parameters": {"query": "cats"}}},
        {"role": "tool", "content": "[]", "type": "tool_result",
         "metadata": {"tool_call_id": "x", "tool_name": "search", "success": True}},
    ]
    result = run_turns(ToolExecutor([search]), [[call("search", "y", query="cats")]],
                       messages=history)
    assert outcomes(result)[-1] == (False, "duplicate_tool_call")


def test_repeatable_tools_are_never_rejected() -> None:
    result = run_turns(ToolExecutor([now]), [[call("now", str(i))] for i in range(4)])
    assert outcomes(result) == [(True, None)] * 4


def test_two_identical_calls_in_one_turn_reject_the_second() -> None:
    result = run_turns(ToolExecutor([search]), [
        [call("search", "1", query="cats"), call("search", "2", query="cats")],
    ])
    assert outcomes(result) == [(True, None), (False, "duplicate_tool_call")]


def test_rejections_are_marked_so_the_adapter_can_drop_them_from_execution_results() -> None:
    result = run_turns(ToolExecutor([search]), [
        [call("search", "1", query="cats")], [call("search", "2", query="cats")],
    ])
    records = cast("list[ToolRecord]", result.tool_execution_results)
    kept = [entry for entry in records if not entry["result"].get(REJECTED)]
    assert [entry["tool_call_id"] for entry in kept] == ["1"]
    assert records[1]["result"]["parameters"] == {"query": "cats"}


@pytest.mark.parametrize(
    ("mode", "expected_kind"),
    [
        ("pipeline", "pipeline"),
        ("chat", "chat"),
        ("system", "system"),
        ("my_extension", "chat"),
        (["my_extension", "chat"], "chat"),
        ("sandbox,pipeline", "pipeline"),
        (["system", "pipeline"], "pipeline"),
        (["audit", "system"], "system"),
    ],
)
def test_mode_picks_the_correction(mode: str | list[str], expected_kind: str) -> None:
    assert duplicate_mode(mode) == expected_kind


def test_each_mode_kind_gets_its_own_next_step() -> None:
    pipeline = duplicate_message("search", "pipeline")
    chat = duplicate_message("search", "chat")
    system = duplicate_message("search", "system")
    extension = duplicate_message("search", "cluckin_chuck")
    for text in (pipeline, chat, system):
        assert text.startswith(f"{DUPLICATE_PREFIX} search already succeeded with these exact "
                               "parameters")
    assert pipeline.endswith("move on to the next required pipeline action.")
    assert chat.endswith("Continue your response to the user using the result you already have.")
    assert system.endswith("Finish the task with the result you already have.")
    assert extension == chat
    assert len({pipeline, chat, system}) == 3


@pytest.mark.parametrize("mode", ["pipeline", "chat", "system", "cluckin_chuck"])
def test_the_rejection_in_the_transcript_uses_the_run_mode(mode: str) -> None:
    result = run_turns(ToolExecutor([search], mode=mode), [
        [call("search", "1", query="cats")], [call("search", "2", query="cats")],
    ])
    assert tool_results(result)[1].content == duplicate_message("search", mode)


def test_executor_without_a_transcript_remembers_outcomes_itself() -> None:
    executor = ToolExecutor([search])
    first = executor({"id": "1", "name": "search", "parameters": {"query": "a"}}, {})
    second = executor({"id": "2", "name": "search", "parameters": {"query": "a"}}, {})
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert first["success"] is True
    assert second["error_type"] == "duplicate_tool_call"


class CountingList(list[Any]):
    """A transcript that counts element reads, to prove the index never rescans."""

    reads = 0

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        CountingList.reads += 1
        return super().__getitem__(index)


def test_the_index_reads_each_message_once_per_run() -> None:
    CountingList.reads = 0
    transcript = CountingList([Message(role="user", content="go")])
    index = TranscriptIndex()
    for turn in range(1, 201):
        call_id = f"c{turn}"
        transcript.append(Message.tool_call("search", {"query": str(turn)}, turn, call_id))
        index.sync(transcript)
        assert index.open_key(call_id) == '{"query":"' + str(turn) + '"}'
        transcript.append(Message.tool_result("search", {"success": True}, turn, call_id, "ok"))
    index.sync(transcript)
    assert CountingList.reads == len(transcript)  # 401 reads for 401 messages, not ~40,000
    assert len(index.successful) == 200


def test_a_replaced_transcript_is_read_from_the_start() -> None:
    index = TranscriptIndex()
    first = [Message.tool_call("search", {"q": 1}, 1, "a"),
             Message.tool_result("search", {"success": True}, 1, "a", "ok")]
    index.sync(first)
    assert index.succeeded("search", '{"q":1}')
    index.sync([Message(role="user", content="fresh start")])
    assert not index.succeeded("search", '{"q":1}')
