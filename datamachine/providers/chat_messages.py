"""The chat message shape every provider request carries, and the projection from a transcript.

A transcript is a list of :class:`agents_api.Message` envelopes (text, ``tool_call`` and
``tool_result`` are separate entries). Providers speak OpenAI-style chat messages instead, so
``ProviderRequest.messages`` holds dicts of exactly these shapes:

* ``{"role": "system" | "user" | "assistant", "content": str}`` (content may also be a list of
  content parts, passed through untouched);
* an assistant turn that called tools: ``{"role": "assistant", "content": str,
  "tool_calls": [{"id": str, "name": str, "parameters": dict}]}``: the same call shape as
  ``ProviderResponse.tool_calls``, so a response's calls can be copied in as they are
  (the OpenAI wire form ``{"id", "type": "function", "function": {"name", "arguments"}}`` is
  accepted too);
* a tool result: ``{"role": "tool", "tool_call_id": str, "content": str}``.

:func:`to_chat_messages` builds these from a transcript; :class:`ChatMessage` validates them.
Provider-specific translation (for example ``parameters`` to a JSON ``arguments`` string) is
each provider's business, not the request builder's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agents_api import Message
from agents_api.jsontext import compact_json
from agents_api.message import normalize_message
from datamachine.tools.arguments import sendable_parameters

__all__ = ["ChatMessage", "ChatToolCall", "to_chat_messages"]


class ChatToolCall(BaseModel):
    """One tool call inside an assistant chat message: ``{"id", "name", "parameters"}``."""

    model_config = ConfigDict(defer_build=True, extra="ignore")

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _accept_wire_shape(cls, data: Any) -> Any:
        # The OpenAI wire form nests name/arguments under "function", arguments as JSON text.
        if isinstance(data, Mapping) and isinstance(data.get("function"), Mapping):
            function = data["function"]
            return {"id": data.get("id"), "name": function.get("name"),
                    "parameters": function.get("arguments")}
        return data

    @field_validator("parameters", mode="before")
    @classmethod
    def _sendable(cls, value: Any) -> dict[str, Any]:
        # JSON text is decoded; arguments that never decoded are sent back as {}.
        return sendable_parameters(value)


class ChatMessage(BaseModel):
    """One chat message as providers receive it (see the module docstring for the shapes)."""

    model_config = ConfigDict(defer_build=True, extra="ignore")

    role: str = Field(min_length=1)
    content: Any = None
    name: str | None = None
    tool_calls: list[ChatToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_or_parts(cls, value: Any) -> Any:
        # Tool results may be structured; models read text, so anything else becomes JSON.
        if value is None or isinstance(value, str | list):
            return value
        return compact_json(value)

    @model_validator(mode="after")
    def _tool_needs_id(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError(
                "a 'tool' message needs 'tool_call_id' (the id of the call it answers)")
        return self


def _is_envelope(item: Message | Mapping[str, Any]) -> bool:
    if isinstance(item, Message):
        return True
    return item.get("schema") == "agents-api.message" or (
        "version" in item and "type" in item and "payload" in item
    )


def to_chat_messages(messages: Iterable[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Project a transcript onto provider chat messages (the shapes in the module docstring).

    Envelopes are translated: text (and ``final_result``/``error``) keep role and content;
    ``tool_call`` envelopes of one turn become the ``tool_calls`` of a single assistant message
    (the turn's text, when it directly precedes them, becomes that message's content) with the
    turn's tool results after it, which is the order OpenAI-compatible servers require; a
    ``tool_result`` becomes a ``tool`` message. Plain chat dicts pass through unchanged.
    """
    out: list[dict[str, Any]] = []
    # The assistant message collecting the current turn's calls (while only tool results have
    # followed it), and an assistant text message its turn's first call may still join.
    open_calls: int | None = None
    open_turn: object = None
    joinable_text: int | None = None
    for index, item in enumerate(messages):
        if not isinstance(item, Message | Mapping):
            raise TypeError(f"messages[{index}] must be a dict or agents_api.Message, "
                            f"got {type(item).__name__}")
        if not _is_envelope(item):
            out.append(dict(item))
            open_calls = joinable_text = None
            continue
        envelope = normalize_message(item, index)
        if envelope.type == "tool_call":
            call = {"id": str(envelope.metadata.get("tool_call_id") or f"call_{index}"),
                    "name": str(envelope.payload.get("tool_name", "")),
                    "parameters": sendable_parameters(envelope.payload.get("parameters"))}
            turn = envelope.payload.get("turn")
            if open_calls is not None and turn == open_turn:
                out[open_calls]["tool_calls"].append(call)
                continue
            if joinable_text is not None:
                out[joinable_text]["tool_calls"] = [call]
                open_calls = joinable_text
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                open_calls = len(out) - 1
            open_turn, joinable_text = turn, None
            continue
        if envelope.type == "tool_result":
            call_id = envelope.metadata.get("tool_call_id")
            if call_id:
                out.append({"role": "tool", "tool_call_id": str(call_id),
                            "content": envelope.content})
            else:
                # Without an id a server cannot pair the result with a call; keep it readable.
                out.append({"role": "user", "content": envelope.content})
                open_calls = None
            joinable_text = None
            continue
        out.append({"role": envelope.role, "content": envelope.content})
        open_calls = None
        joinable_text = len(out) - 1 if envelope.role == "assistant" else None
    return out
