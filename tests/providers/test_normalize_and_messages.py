"""normalize_response() for hook answers, and the transcript-to-chat-message projection."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agents_api import Message
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderResponse
from datamachine.providers.chat_messages import ChatMessage, to_chat_messages
from datamachine.providers.normalize import normalize_response

# -- normalize_response ----------------------------------------------------------------------


def test_compact_dict_becomes_a_response_with_ids_and_finish_reason() -> None:
    response = normalize_response(
        {"content": "", "tool_calls": [{"name": "search", "parameters": {"q": "x"}},
                                       {"id": "mine", "tool_name": "fetch"}],
         "usage": {"prompt_tokens": 3, "total_tokens": 4, "details": {"a": 1}, "flag": True},
         "success": True},
        turn=2,
    )

    assert response.tool_calls == [
        {"id": "call_2_1", "name": "search", "parameters": {"q": "x"}},
        {"id": "mine", "name": "fetch", "parameters": {}},
    ]
    assert response.usage == {"prompt_tokens": 3, "total_tokens": 4}
    assert response.finish_reason == "tool_calls"


def test_normalizing_twice_changes_nothing() -> None:
    once = normalize_response(
        ProviderResponse(content='<tool_call name="x">{"a": 1}</tool_call>'))
    assert normalize_response(once) == once
    assert once.tool_calls == [{"id": "tag-tool-call-1", "name": "x", "parameters": {"a": 1}}]


def test_explicit_finish_reason_is_kept() -> None:
    assert normalize_response({"content": "cut", "finish_reason": "length"}).finish_reason == (
        "length")


@pytest.mark.parametrize(("value", "reason"), [
    ({"tool_calls": [{"parameters": {}}]}, "tool_calls.0.name"),
    ({"tool_calls": [{"name": "  "}]}, "tool_calls.0.name"),
    ({"content": ["not", "text"]}, "content"),
    ("just a string", "not a response"),
])
def test_invalid_hook_answers_fail_with_the_reason(value: Any, reason: str) -> None:
    with pytest.raises(ProviderError) as caught:
        normalize_response(value, provider="hooked")
    assert caught.value.code == "provider_bad_response"
    assert reason in str(caught.value)
    assert "hooked" in str(caught.value)


def test_arguments_that_are_not_an_object_are_kept_as_text_for_the_executor() -> None:
    response = normalize_response({"tool_calls": [
        {"id": "a", "name": "x", "parameters": "a=1"},
        {"id": "b", "name": "x", "parameters": [1, 2]},
        {"id": "c", "name": "x", "parameters": {"ok": True}},
    ]})
    assert [call["parameters"] for call in response.tool_calls] == ["a=1", "[1,2]", {"ok": True}]


# -- to_chat_messages ------------------------------------------------------------------------

def _transcript() -> list[Message]:
    return [
        Message.text("system", "Be brief."),
        Message.text("user", "Find pluggy and its docs."),
        Message.text("assistant", "Searching."),
        Message.tool_call("search", {"q": "pluggy"}, 1, "c1"),
        Message.tool_result("search", {"success": True, "result": 3}, 1, "c1", "3 hits"),
        Message.tool_call("fetch", {"url": "u"}, 1, "c2"),
        Message.tool_result("fetch", {"success": True, "result": "ok"}, 1, "c2", "ok"),
        Message.tool_call("search", {"q": "docs"}, 2, "c3"),
        Message.tool_result("search", {"success": False, "error": "x"}, 2, "c3", "x"),
        Message.text("assistant", "Done."),
    ]


def test_transcript_projects_to_chat_messages_grouping_each_turns_calls() -> None:
    assert to_chat_messages(_transcript()) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find pluggy and its docs."},
        {"role": "assistant", "content": "Searching.", "tool_calls": [
            {"id": "c1", "name": "search", "parameters": {"q": "pluggy"}},
            {"id": "c2", "name": "fetch", "parameters": {"url": "u"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3 hits"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c3", "name": "search", "parameters": {"q": "docs"}}]},
        {"role": "tool", "tool_call_id": "c3", "content": "x"},
        {"role": "assistant", "content": "Done."},
    ]


def test_projection_is_valid_input_for_chat_message() -> None:
    for message in to_chat_messages(_transcript()):
        ChatMessage.model_validate(message)


def test_envelope_dicts_and_plain_chat_dicts_are_accepted() -> None:
    plain = {"role": "tool", "tool_call_id": "z", "content": "kept as is"}
    out = to_chat_messages([Message.text("user", "hi").to_dict(), plain])
    assert out == [{"role": "user", "content": "hi"}, plain]


def test_tool_result_without_an_id_becomes_a_user_message() -> None:
    result = Message(type="tool_result", role="tool", content="orphan",
                     payload={"tool_name": "x"})
    assert to_chat_messages([result]) == [{"role": "user", "content": "orphan"}]


def test_chat_message_accepts_the_wire_tool_call_shape() -> None:
    message = ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "s", "arguments": '{"q": 1}'}}]})
    assert message.tool_calls[0].parameters == {"q": 1}


def test_chat_message_rejects_a_tool_message_without_its_call_id() -> None:
    with pytest.raises(ValidationError, match="tool_call_id"):
        ChatMessage.model_validate({"role": "tool", "content": "x"})


def test_structured_tool_content_is_sent_as_json_text() -> None:
    message = ChatMessage.model_validate({"role": "tool", "tool_call_id": "c",
                                          "content": {"hits": 3}})
    assert message.content == '{"hits":3}'


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "hi"},
    {"role": "system", "content": ""},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "name": "search", "parameters": {"q": "x", "n": [1, 2]}}]},
    {"role": "assistant", "content": "Looking.", "tool_calls": []},
    {"role": "tool", "tool_call_id": "c1", "content": "3 hits"},
    {"role": "user", "content": "hi", "name": "ada"},
])
def test_the_plain_message_fast_path_matches_the_validated_one(message: dict[str, Any]) -> None:
    from datamachine.providers.chat_messages import ChatMessage
    from datamachine.providers.openai_wire import _plain_wire_message, _wire_message

    assert _plain_wire_message(message) == _wire_message(ChatMessage.model_validate(message))


@pytest.mark.parametrize("message", [
    {"role": "user", "content": ["part"]},  # content parts: the model path
    {"role": "user", "content": "hi", "metadata": {}},  # an unknown key
    {"role": "tool", "content": "orphan"},  # no tool_call_id: the model path explains
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
])
def test_other_shapes_take_the_validated_path(message: dict[str, Any]) -> None:
    from datamachine.providers.openai_wire import _plain_wire_message

    assert _plain_wire_message(message) is None
