"""Projecting a transcript of envelopes onto OpenAI-shaped chat messages, incrementally.

The loop appends envelopes (text, tool_call, tool_result); providers want chat messages where an
assistant message carries all of a turn's ``tool_calls`` and each result is a ``tool`` message.
The projector converts only what was appended since the last request and keeps a running
SHA-256 and byte count, so a turn never re-serializes or re-hashes the whole history. The hash
reads each envelope's ``Message.to_json()``, the text the transcript store writes; when the
store wrote a message first, the run hands its text over (:meth:`ChatProjector.remember`) so it
is encoded once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agents_api import Message

__all__ = ["ChatProjector"]


class ChatProjector:
    """Stateful, append-only projection of one run's transcript (see module docstring)."""

    __slots__ = ("_adopt", "_current", "_current_turn", "_hash", "_seen", "_texts", "bytes",
                 "chat")

    def __init__(self) -> None:
        self.chat: list[dict[str, Any]] = []
        self._seen = 0
        self._current: dict[str, Any] | None = None
        self._current_turn: object = None
        self._adopt = False
        self._hash = hashlib.sha256()
        self.bytes = 2  # the surrounding "[]"
        # id -> (message, its to_json() text), for messages encoded before they are projected.
        self._texts: dict[int, tuple[Message, str]] = {}

    def remember(self, message: Message, text: str) -> None:
        """Take ``message.to_json()`` from whoever encoded it first (the transcript store)."""
        self._texts[id(message)] = (message, text)

    def sync(self, messages: list[Message]) -> list[dict[str, Any]]:
        """Project the envelopes appended since the last call; return the whole chat list."""
        for message in messages[self._seen:]:
            self._add(message)
        self._seen = len(messages)
        return self.chat

    def prompt_sha256(self) -> str:
        """Running hash over every envelope projected so far."""
        return self._hash.copy().hexdigest()

    def _add(self, message: Message) -> None:
        known = self._texts.pop(id(message), None)
        text = known[1] if known is not None and known[0] is message else message.to_json()
        encoded = text.encode()
        self._hash.update(encoded)
        self.bytes += len(encoded) + 1
        kind = message.type
        if kind == "tool_call":
            payload = message.payload
            turn = payload.get("turn")
            call = {"id": str(message.metadata.get("tool_call_id", "")),
                    "name": str(payload.get("tool_name", "")),
                    "parameters": payload.get("parameters") or {}}
            current = self._current
            if current is not None and (self._adopt or self._current_turn == turn):
                current.setdefault("tool_calls", []).append(call)
            else:
                current = {"role": "assistant", "content": "", "tool_calls": [call]}
                self.chat.append(current)
                self._current = current
            self._current_turn = turn
            self._adopt = False
        elif kind == "tool_result":
            self.chat.append({"role": "tool",
                              "tool_call_id": str(message.metadata.get("tool_call_id", "")),
                              "content": message.content if isinstance(message.content, str)
                              else json.dumps(message.content)})
            self._adopt = False
        else:
            entry = {"role": message.role, "content": message.content}
            self.chat.append(entry)
            if message.role == "assistant":
                self._current, self._current_turn, self._adopt = entry, None, True
            else:
                self._current, self._current_turn, self._adopt = None, None, False
