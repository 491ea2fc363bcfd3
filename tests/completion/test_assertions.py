"""Unit tests: assertion parsing and evaluation, nudge text, preflight, policies on their own."""

from __future__ import annotations

from typing import Any

import pytest

from agents_api import Message
from datamachine.completion import (
    DESCRIBED_ACTION_TEXT,
    NUDGE_TEXT,
    AssertionTracker,
    DefaultCompletionPolicy,
    PipelineCompletionPolicy,
    build_nudge,
    parse_assertions,
    unavailable_required_tool_names,
)
from datamachine.completion.assertions import has_value, lookup_path, strict_equal
from datamachine.completion.nudges import describes_tool_action, diagnostic_copy, truncate
from datamachine.errors import InvalidCompletionAssertions, UsageError
from datamachine.tools.results import REJECTED
from tests.completion.helpers import handler_tool, publish

OK = {"success": True, "result": {"ok": True}}


def tracker(config: dict[str, Any]) -> AssertionTracker:
    parsed, _ = parse_assertions(config)
    return AssertionTracker(parsed)


# -- parsing ---------------------------------------------------------------------------------
def test_lists_are_trimmed_deduplicated_and_empties_dropped() -> None:
    parsed, warnings = parse_assertions({
        "required_tool_names": [" a ", "a", "", "b"],
        "required_engine_data_keys": "post_id",
        "minimum_successful_tool_counts": {" fetch ": 2, "": 3},
    })
    assert parsed.required_tool_names == ["a", "b"]
    assert parsed.required_engine_data_keys == ["post_id"]
    assert parsed.minimum_successful_tool_counts == {"fetch": 2}
    assert warnings == []


def test_outcome_names_are_sanitized_defaulted_and_kept_distinct() -> None:
    parsed, _ = parse_assertions({"complete_when_any": [
        {"name": "  Post Published! ", "tools": ["publish"]},
        {"tools": [{"name": "draft", "required_output": " url "}]},
        {"name": "???", "tools": ["x"]},
        {"name": "post_published", "tools": ["y"]},
    ]})
    assert [o.name for o in parsed.complete_when_any] == [
        "post_published", "outcome_2", "outcome_3", "post_published_4"]
    assert parsed.complete_when_any[1].tools[0].required_output == ["url"]


def test_unknown_keys_are_warnings_at_every_level() -> None:
    parsed, warnings = parse_assertions({
        "required_tools": ["a"],
        "complete_when_any": [{"nmae": "x", "tools": [{"name": "a", "success": True}]}],
    })
    assert not parsed.required_tool_names
    assert len(warnings) == 3
    assert warnings[0].startswith("completion_assertions: unknown key 'required_tools'")
    assert "complete_when_any[0]: unknown key 'nmae'" in warnings[1]
    assert "complete_when_any[0].tools[0]: unknown key 'success'" in warnings[2]


@pytest.mark.parametrize(("config", "where"), [
    ({"required_tool_names": 3}, "completion_assertions.required_tool_names"),
    ({"required_tool_names": ["a", 1]}, "completion_assertions.required_tool_names"),
    ({"minimum_successful_tool_counts": {"a": 0}},
     "completion_assertions.minimum_successful_tool_counts.a"),
    ({"minimum_successful_tool_counts": {"a": True}},
     "completion_assertions.minimum_successful_tool_counts.a"),
    ({"minimum_successful_tool_counts": ["a"]},
     "completion_assertions.minimum_successful_tool_counts"),
    ({"complete_when_any": {"a": {}}}, "completion_assertions.complete_when_any"),
    ({"complete_when_any": [{"tools": []}]}, "completion_assertions.complete_when_any[0].tools"),
    ({"complete_when_any": [{"tools": [{"name": " "}]}]},
     "completion_assertions.complete_when_any[0].tools[0].name"),
    ({"complete_when_any": [{"tools": [{"name": "a", "required_parameters": ["x"]}]}]},
     "completion_assertions.complete_when_any[0].tools[0].required_parameters"),
    ({"complete_when_any": [{"tools": [{"name": "a", "min_successful_calls": "2"}]}]},
     "completion_assertions.complete_when_any[0].tools[0].min_successful_calls"),
])
def test_wrong_types_name_the_field(config: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidCompletionAssertions) as info:
        parse_assertions(config)
    assert str(info.value).startswith(where + ":")
    assert isinstance(info.value, UsageError)


def test_empty_config_asserts_nothing() -> None:
    parsed, _ = parse_assertions(None)
    assert parsed.configured is False
    assert AssertionTracker(parsed).evaluate({}).complete


# -- evaluation -----------------------------------------------------------------------------
def test_only_successful_unrejected_results_count() -> None:
    t = tracker({"required_tool_names": ["a"], "minimum_successful_tool_counts": {"a": 2}})
    assert t.record("a", {"success": False, "error": "x"}) is False
    assert t.record("a", {"success": True, REJECTED: True}) is False
    assert t.record("a", OK) is True
    evaluation = t.evaluate()
    assert evaluation.satisfied == {"tool_names": ["a"]}
    assert evaluation.missing == {"tool_counts": ["a: 1/2"]}
    assert evaluation.required == {"tool_names": ["a"], "tool_counts": ["a>=2"]}
    # A tool's own "rejected" is data: only the executor's mark (a key no tool can set) counts.
    assert t.record("a", {"success": True, "rejected": True}) is True
    assert t.evaluate().complete
    t.record("a", OK)
    assert t.evaluate().complete
    assert t.evaluate().satisfied["tool_counts"] == ["a>=2"]


@pytest.mark.parametrize(("value", "present"), [
    ("x", True), (0, True), (False, True), ([0], True),
    (None, False), ("", False), ("   ", False), ([], False), ({}, False),
])
def test_engine_data_values_must_be_non_empty(value: Any, present: bool) -> None:
    t = tracker({"required_engine_data_keys": ["k"]})
    assert t.evaluate({"k": value}).complete is present
    assert has_value(value) is present


def test_engine_data_keys_may_be_dotted_paths() -> None:
    t = tracker({"required_engine_data_keys": ["outputs.post_id", "flat.key"]})
    evaluation = t.evaluate({"outputs": {"post_id": 3}, "flat.key": "v"})
    assert evaluation.complete


def test_required_output_is_found_at_root_under_data_and_under_result() -> None:
    t = tracker({"complete_when_any": [{"name": "o", "tools": [
        {"name": "a", "required_output": ["root", "nested.x", "inner", "deep"]}]}]})
    t.record("a", {"success": True, "root": 1, "data": {"nested": {"x": "y"}},
                   "result": {"inner": "z", "data": {"deep": [1]}}})
    assert t.evaluate().satisfied == {"complete_when_any": ["o"]}


def test_required_output_is_found_under_the_tools_own_result_key() -> None:
    # The normalized result wraps what the tool returned; the tool put its data under "result".
    t = tracker({"complete_when_any": [{"name": "o", "tools": [
        {"name": "a", "required_output": ["html_url", "number"]}]}]})
    t.record("a", {"success": True,
                   "result": {"result": {"html_url": "https://x/1"}, "data": {"number": 1}}})
    assert t.evaluate().satisfied == {"complete_when_any": ["o"]}


def test_missing_entries_name_the_outcome_and_what_it_lacks() -> None:
    t = tracker({"complete_when_any": [
        {"name": "live", "tools": [{"name": "publish", "required_output": ["url", "id"]},
                                   {"name": "notify"}]},
        {"name": "twice", "tools": [{"name": "publish", "min_successful_calls": 2,
                                     "required_output": "url"}]},
    ]})
    t.record("publish", {"success": True, "result": {"id": 1}})
    assert t.evaluate().missing == {"complete_when_any": [
        "live: publish.url, notify", "twice: publish.url, publish x2"]}


def test_first_satisfied_outcome_wins() -> None:
    t = tracker({"complete_when_any": [{"name": "first", "tools": ["a"]},
                                       {"name": "second", "tools": ["b"]}]})
    t.record("b", OK)
    t.record("a", OK)
    assert t.evaluate().satisfied == {"complete_when_any": ["first"]}


def test_required_parameters_use_strict_equality_on_the_called_parameters() -> None:
    t = tracker({"complete_when_any": [{"name": "o", "tools": [{
        "name": "a", "required_parameters": {"n": 1, "flag": True, "opts.mode": "x"}}]}]})
    t.record("a", OK, {"n": 1.0, "flag": True, "opts": {"mode": "x"}})
    t.record("a", OK, {"n": 1, "flag": 1, "opts": {"mode": "x"}})
    t.record("a", OK, {"n": 1, "flag": True})
    assert not t.evaluate().complete
    t.record("a", OK, {"n": 1, "flag": True, "opts": {"mode": "x"}, "extra": 2})
    assert t.evaluate().complete


def test_parameters_default_to_the_results_own_parameters_key() -> None:
    t = tracker({"complete_when_any": [{"tools": [
        {"name": "a", "required_parameters": {"q": "x"}}]}]})
    t.record("a", {**OK, "parameters": {"q": "x"}})
    assert t.evaluate().complete


@pytest.mark.parametrize(("a", "b", "equal"), [
    (1, 1, True), (1, 1.0, False), (1, True, False), ("1", 1, False), (None, None, True),
    ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}, True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ([1, 2], [2, 1], False), ([1], (1,), True),
])
def test_strict_equal(a: Any, b: Any, equal: bool) -> None:
    assert strict_equal(a, b) is equal


def test_lookup_path_walks_lists_and_reports_missing() -> None:
    data = {"items": [{"id": 4}]}
    assert lookup_path(data, "items.0.id") == 4
    assert not has_value(lookup_path(data, "items.3.id"))
    assert not has_value(lookup_path(data, "items.x"))


# -- nudges ------------------------------------------------------------------------------------
def test_nudge_appends_the_first_non_empty_user_message() -> None:
    messages = [Message(role="system", content="sys"), Message(role="user", content="  "),
                Message(role="user", content=" Do the thing. "),
                Message(role="user", content="later")]
    assert build_nudge(messages) == f"{NUDGE_TEXT} Original request: Do the thing."
    assert build_nudge([]) == NUDGE_TEXT
    parts = [Message(role="user", content=[{"type": "text", "text": "hi"}])]
    assert build_nudge(parts).endswith('Original request: [{"type":"text","text":"hi"}]')


def test_truncation_keeps_the_limit_including_the_ellipsis() -> None:
    assert truncate("abc", 3) == "abc"
    assert truncate("abcd", 3) == "..."
    assert truncate("x" * 301, 300) == "x" * 297 + "..."
    assert len(diagnostic_copy("y" * 5000)) == 2000


@pytest.mark.parametrize(("text", "described"), [
    ("AI ACTION (Turn 4): Executing publish", True),
    ("  ai action(turn 12):   executing  x", True),
    ("I will run AI ACTION (Turn 4): Executing", False),
    ("AI ACTION (Turn four): Executing x", False),
])
def test_described_tool_action(text: str, described: bool) -> None:
    assert describes_tool_action(text) is described


# -- preflight -------------------------------------------------------------------------------
def test_preflight_requires_outcome_tools_only_when_no_outcome_is_reachable() -> None:
    parsed, _ = parse_assertions({
        "required_tool_names": ["a"], "minimum_successful_tool_counts": {"b": 1, "a": 2},
        "complete_when_any": [{"tools": ["c", "d"]}, {"tools": ["e"]}]})
    assert unavailable_required_tool_names(parsed, ["a", "b", "e"]) == []
    assert unavailable_required_tool_names(parsed, ["a", "c"]) == ["b", "d", "e"]


# -- policies on their own -------------------------------------------------------------------
def context(**extra: Any) -> dict[str, Any]:
    return {"mode": "chat", "turn": 1, "payload": {}, **extra}


def test_default_policy_nudges_until_assertions_hold_then_completes() -> None:
    policy = DefaultCompletionPolicy({"required_tool_names": ["publish"]})
    messages = [Message(role="user", content="Ship it.")]
    first = policy.record_natural_completion(messages, "done", context())
    assert first.complete is False
    assert first.message == f"{NUDGE_TEXT} Original request: Ship it."
    assert first.context["missing"] == {"tool_names": ["publish"]}
    decision = policy.record_tool_result("publish", publish, OK, context(parameters={}))
    assert decision.complete is False  # tool calls never end a default-policy run
    assert policy.record_natural_completion(messages, "done", context()).complete is True


def test_default_policy_asks_for_a_real_tool_call_after_a_described_action() -> None:
    policy = DefaultCompletionPolicy()
    decision = policy.record_natural_completion([], "AI ACTION (Turn 1): Executing x", context())
    assert (decision.complete, decision.message) == (False, DESCRIBED_ACTION_TEXT)
    no_tools = policy.record_natural_completion([], "AI ACTION (Turn 1): Executing x",
                                                context(tool_names=[]))
    assert no_tools.complete is True


def test_pipeline_policy_tracks_handlers_and_messages_stay_empty() -> None:
    blog, social = handler_tool("blog"), handler_tool("social")
    policy = PipelineCompletionPolicy(None, ["blog", "social"])
    waiting = policy.record_tool_result("post_to_blog", blog, OK, context())
    assert (waiting.complete, waiting.message) == (False, "")
    assert waiting.context["remaining_handlers"] == ["social"]
    natural = policy.record_natural_completion([], "done", context())
    assert natural.complete is False
    assert natural.message.startswith(NUDGE_TEXT)
    assert natural.context["remaining_handlers"] == ["social"]
    failed = policy.record_tool_result("post_to_social", social, {"success": False}, context())
    assert failed.complete is False
    done = policy.record_tool_result("post_to_social", social, OK, context())
    assert done.complete is True
    assert done.context["executed_handlers"] == ["blog", "social"]
