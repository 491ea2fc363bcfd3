"""Tool calls written as text: each recognized form, de-duplication, caps, and garbage."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from datamachine.providers.text_tool_calls import MAX_TEXT_TOOL_CALLS, extract_text_tool_calls


def test_xml_function_calls_with_entities_and_json_values() -> None:
    text = (
        "I will search.\n<function_calls>\n"
        '<invoke name="search">\n'
        '<parameter name="q">cats &amp; dogs</parameter>\n'
        '<parameter name="filters">{"lang": "en"}</parameter>\n'
        '<parameter name="limit">5</parameter>\n'
        "</invoke>\n"
        '<invoke name="fetch"><parameter name="url"><![CDATA[https://x.test/?a=1&b=<2>]]>'
        "</parameter></invoke>\n"
        "</function_calls>"
    )

    assert extract_text_tool_calls(text) == [
        {"id": "xml-tool-call-1", "name": "search",
         "parameters": {"q": "cats & dogs", "filters": {"lang": "en"}, "limit": "5"}},
        {"id": "xml-tool-call-2", "name": "fetch",
         "parameters": {"url": "https://x.test/?a=1&b=<2>"}},
    ]


def test_invoke_outside_function_calls_is_ignored() -> None:
    assert extract_text_tool_calls('<invoke name="search"></invoke>') == []


@pytest.mark.parametrize("call", [
    {"name": "search", "arguments": {"q": "x"}},
    {"name": "search", "arguments": '{"q": "x"}'},
    {"name": "search", "parameters": {"q": "x"}},
    {"type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
])
def test_tool_call_block_with_one_call_in_any_common_shape(call: dict[str, Any]) -> None:
    text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    assert extract_text_tool_calls(text) == [
        {"id": "json-tool-call-1-1", "name": "search", "parameters": {"q": "x"}}]


def test_tool_call_block_with_a_list_keeps_given_ids() -> None:
    payload = {"tool_calls": [
        {"id": "call_9", "function": {"name": "a", "arguments": "{}"}},
        {"name": "b", "arguments": {"n": 1}},
        {"name": "bad name!", "arguments": {}},
    ]}
    text = f"<tool_call>{json.dumps(payload)}</tool_call>"

    assert extract_text_tool_calls(text) == [
        {"id": "call_9", "name": "a", "parameters": {}},
        {"id": "json-tool-call-1-2", "name": "b", "parameters": {"n": 1}},
    ]


def test_fenced_json_with_tool_calls() -> None:
    text = ("Calling now:\n```json\n"
            '{"tool_calls": [{"name": "ns/lookup", "arguments": {"id": 7}}]}\n```\nThanks.')
    assert extract_text_tool_calls(text) == [
        {"id": "fenced-tool-call-1-1", "name": "ns/lookup", "parameters": {"id": 7}}]


def test_fenced_json_without_tool_calls_is_just_an_example() -> None:
    text = 'Here is the record:\n```json\n{"name": "Ada", "parameters": {"age": 36}}\n```'
    assert extract_text_tool_calls(text) == []


def test_named_tool_call_tag() -> None:
    text = '<tool_call name="weather.get">{"city": "Oslo"}</tool_call> and <tool_call name="now">'
    text += "</tool_call>"
    assert extract_text_tool_calls(text) == [
        {"id": "tag-tool-call-1", "name": "weather.get", "parameters": {"city": "Oslo"}},
        {"id": "tag-tool-call-2", "name": "now", "parameters": {}},
    ]


def test_calls_are_reported_in_text_order_across_forms() -> None:
    text = ('<tool_call name="first">{}</tool_call>\n'
            '<function_calls><invoke name="second"></invoke></function_calls>\n'
            '<tool_call>{"name": "third", "arguments": {}}</tool_call>')
    assert [c["name"] for c in extract_text_tool_calls(text)] == ["first", "second", "third"]


def test_duplicates_by_name_and_canonical_parameters_keep_the_first() -> None:
    text = ('<tool_call name="search">{"q": "x", "n": 1}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {"n": 1, "q": "x"}}</tool_call>'
            '<tool_call name="search">{"q": "y"}</tool_call>'
            '```json\n{"tool_calls": [{"name": "search", "parameters": {"q": "y"}}]}\n```')

    calls = extract_text_tool_calls(text)

    assert calls == [
        {"id": "tag-tool-call-1", "name": "search", "parameters": {"q": "x", "n": 1}},
        {"id": "tag-tool-call-2", "name": "search", "parameters": {"q": "y"}},
    ]


def test_repeated_model_ids_are_made_unique() -> None:
    payload = {"tool_calls": [{"id": "c", "name": "a", "arguments": {}},
                              {"id": "c", "name": "b", "arguments": {}}]}
    calls = extract_text_tool_calls(f"<tool_call>{json.dumps(payload)}</tool_call>")
    assert [c["id"] for c in calls] == ["c", "c-2"]


def test_at_most_sixteen_calls() -> None:
    text = "".join(f'<tool_call name="t{i}">{{}}</tool_call>' for i in range(40))

    calls = extract_text_tool_calls(text)

    assert len(calls) == MAX_TEXT_TOOL_CALLS == 16
    assert calls[-1]["name"] == "t15"


def test_tool_names_must_match_the_allowed_pattern() -> None:
    long_name = "a" * 129
    text = (f'<tool_call name="{long_name}">{{}}</tool_call>'
            '<tool_call name="has space">{}</tool_call>'
            '<tool_call>{"name": "", "arguments": {}}</tool_call>'
            '<tool_call name="ok_name-1:v2">{}</tool_call>')
    assert [c["name"] for c in extract_text_tool_calls(text)] == ["ok_name-1:v2"]


@pytest.mark.parametrize("garbage", [
    "",
    "plain answer without any markup",
    "<tool_call>{not json}</tool_call>",
    "<tool_call>[1, 2, 3]</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "x", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "x", "arguments": [1]}</tool_call>',
    '<tool_call name="x">not json</tool_call>',
    '<tool_call name="x">["list"]</tool_call>',
    '<tool_call name="x">{"unclosed": true}',
    '<function_calls><invoke name="x"><parameter name="p">v</parameter></invoke>',
    "```json\n{\"tool_calls\": [{\"name\": \"x\"\n```",
    "```json\n{\"tool_calls\": \"x\"}\n```",
    "<<<>>> </tool_call> <tool_call <function_calls> ``` ```",
])
def test_garbage_in_gives_nothing_out(garbage: str) -> None:
    assert extract_text_tool_calls(garbage) == []


@pytest.mark.parametrize("value", [None, 42, b"<tool_call name='x'>{}</tool_call>", ["x"]])
def test_non_text_gives_nothing(value: object) -> None:
    assert extract_text_tool_calls(value) == []


def test_pathological_input_stays_fast() -> None:
    # Thousands of openers with no closer would be quadratic for a naive regex scan.
    text = "<tool_call>" * 20_000 + "<function_calls>" * 5_000 + "```json\n" * 5_000
    started = time.perf_counter()

    assert extract_text_tool_calls(text) == []

    assert time.perf_counter() - started < 1.0
