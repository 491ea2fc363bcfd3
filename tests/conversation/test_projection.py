"""The incremental chat projection: its byte count and prompt hash, from first principles."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agents_api import Message
from datamachine.conversation.projection import ChatProjector


def _transcript() -> list[Message]:
    return [
        Message.text("system", "Be brief. «ü» \"quoted\" \n newline"),
        Message.text("user", "Double 2, then 3 and 4 together."),
        Message.tool_call("double", {"x": 2}, 1, "call_1"),
        Message.tool_result("double", {"success": True, "result": 4}, 1, "call_1", "4"),
        # An assistant text message that adopts the next turn's calls.
        Message.text("assistant", "Now both at once."),
        Message.tool_call("double", {"x": 3, "a": [1, {"b": None}]}, 2, "call_2"),
        Message.tool_call("double", {"x": 4}, 2, "call_3"),
        Message.tool_result("double", {"success": True, "result": 6}, 2, "call_2", "6"),
        Message.tool_result("double", {"success": False, "error": "no"}, 2, "call_3", "no"),
        Message.tool_call("double", {"x": 5}, 3, "call_4"),
        Message.tool_result("double", {"success": True, "result": [10]}, 3, "call_4", "[10]"),
        Message(role="user", content=[{"type": "text", "text": "parts"}]),
    ]


def _compact(value: Any, **options: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, **options)


def test_bytes_is_the_exact_size_of_the_chat_list_as_compact_json() -> None:
    projector = ChatProjector()
    messages = _transcript()
    # Projected a few messages at a time, as turns append them.
    for end in (2, 4, 5, 9, len(messages)):
        chat = projector.sync(messages[:end])
        assert projector.bytes == len(_compact(chat).encode())
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant",
                                         "tool", "tool", "assistant", "tool", "user"]
    assert [c["id"] for c in chat[4]["tool_calls"]] == ["call_2", "call_3"]


def test_prompt_hash_covers_every_projected_piece_in_order() -> None:
    projector = ChatProjector()
    projector.sync(_transcript())
    expected = hashlib.sha256()
    for message in _transcript():
        if message.type == "tool_call":
            if message.metadata["tool_call_id"] in ("call_1", "call_4"):  # opens a message
                expected.update(b'{"role":"assistant","content":"","tool_calls":[')
            call = {"id": message.metadata["tool_call_id"], "name": message.payload["tool_name"],
                    "parameters": message.payload["parameters"]}
            expected.update(_compact(call, sort_keys=True).encode())
        elif message.type == "tool_result":
            expected.update(_compact({"role": "tool",
                                      "tool_call_id": message.metadata["tool_call_id"],
                                      "content": message.content}).encode())
        else:
            expected.update(_compact({"role": message.role,
                                      "content": message.content}).encode())
    assert projector.prompt_sha256() == expected.hexdigest()


def test_the_hash_changes_with_anything_the_model_reads() -> None:
    base = ChatProjector()
    base.sync(_transcript())
    changed = _transcript()
    changed[5] = Message.tool_call("double", {"x": 30, "a": [1, {"b": None}]}, 2, "call_2")
    other = ChatProjector()
    other.sync(changed)
    assert other.prompt_sha256() != base.prompt_sha256()
