"""The builders that skip validation for the loop's own values make what pydantic makes.

``agents_api.results.built`` / ``updated`` / ``unchecked`` and the ``Message`` builders set a
model's state directly (the per-turn cost of ``model_copy`` was the largest single item of a
turn). They rely on pydantic's instance layout; these tests compare each with pydantic's own
copy and validation, so an upgrade that changes the layout fails here.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from agents_api import Message
from agents_api.results import LoopResult, built, unchecked, updated
from datamachine.conversation.result import ConversationResult
from datamachine.providers.base import ProviderRequest, ProviderResponse


class _Deferred(BaseModel):
    model_config = ConfigDict(defer_build=True)

    name: str
    tags: list[str] = Field(default_factory=list)
    _secret: str = PrivateAttr(default="kept")


class _Extra(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = "x"


def _same(fast: BaseModel, slow: BaseModel) -> None:
    assert type(fast) is type(slow)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_extra == slow.model_extra
    assert fast.__pydantic_private__ == slow.__pydantic_private__


@pytest.mark.parametrize(("make", "validated"), [
    (lambda: Message.text("user", "hi"), lambda: Message(role="user", content="hi")),
    (lambda: Message.text("assistant", "ok", {"k": 1}),
     lambda: Message(role="assistant", content="ok", metadata={"k": 1})),
    (lambda: Message.tool_call("double", {"n": 2}, 3, "c1"),
     lambda: Message(type="tool_call", role="assistant",
                     payload={"tool_name": "double", "parameters": {"n": 2}, "turn": 3},
                     metadata={"tool_call_id": "c1"})),
    (lambda: Message.tool_result("double", {"success": True, "result": 4}, 3, "c1", "4"),
     lambda: Message(type="tool_result", role="tool", content="4",
                     payload={"success": True, "result": 4, "tool_name": "double",
                              "turn": 3},
                     metadata={"tool_call_id": "c1"})),
])
def test_message_builders_equal_validated_messages(make, validated) -> None:  # type: ignore[no-untyped-def]
    fast, slow = make(), validated()
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.to_json() == slow.to_json()
    assert Message.model_validate(fast.model_dump()) == fast
    # Nothing is shared between two built messages.
    other = make()
    assert other.payload is not fast.payload
    assert other.metadata is not fast.metadata


def test_message_builders_of_a_subclass_keep_its_fields() -> None:
    class Tagged(Message):
        tag: str = "t"

    message = Tagged.text("user", "hi")
    assert type(message) is Tagged
    assert message.tag == "t"
    assert message.content == "hi"


def test_updated_is_model_copy_with_update() -> None:
    request = ProviderRequest(messages=[], tools=[], provider="p", model="m", mode="chat",
                              payload={"a": 1}, turn=0, request_timeout=5.0,
                              connect_timeout=1.0, options={"temperature": 0})
    update = {"messages": [{"role": "user", "content": "hi"}], "turn": 2}
    _same(updated(request, **update), request.model_copy(update=update))
    deferred = _Deferred(name="a")
    _same(updated(deferred, tags=["x"]), deferred.model_copy(update={"tags": ["x"]}))
    extra = _Extra(name="a", more=1)
    copied = updated(extra, name="b")
    _same(copied, extra.model_copy(update={"name": "b"}))
    assert copied.model_extra is not extra.model_extra


def test_updated_models_stay_assignable_and_independent() -> None:
    response = ProviderResponse(content="hi", tool_calls=[], usage={"total_tokens": 1})
    copy = updated(response, content="bye")
    copy.content = "changed"
    assert response.content == "hi"
    assert "content" in copy.model_fields_set


def test_unchecked_equals_validated_and_names_missing_factory_fields() -> None:
    fast = unchecked(LoopResult, messages=[], final_content="done", turn_count=1,
                     completed=True, status="completed", flags=[], usage={},
                     tool_execution_results=[], last_tool_calls=[], request_metadata={},
                     budgets={}, warnings=[], metadata={})
    slow = LoopResult(messages=[], final_content="done", turn_count=1, completed=True,
                      status="completed", flags=[], usage={}, tool_execution_results=[],
                      last_tool_calls=[], request_metadata={}, budgets={}, warnings=[],
                      metadata={})
    assert fast == slow
    assert fast.model_dump_json() == slow.model_dump_json()
    with pytest.raises(ValueError, match=r"needs a value for: .*warnings"):
        unchecked(ConversationResult, status="completed")


def test_built_fills_a_deferred_model_that_was_never_validated() -> None:
    class Late(BaseModel):
        model_config = ConfigDict(defer_build=True)

        value: int

    late = built(Late, {"value": 3}, {"value"})
    assert late.model_dump() == {"value": 3}
    assert late == Late(value=3)
