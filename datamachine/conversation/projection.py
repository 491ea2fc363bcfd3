"""Projecting a transcript of envelopes onto OpenAI-shaped chat messages, incrementally.

The loop appends envelopes (text, tool_call, tool_result); providers want chat messages where an
assistant message carries all of a turn's ``tool_calls`` and each result is a ``tool`` message.
The projector converts only what was appended since the last request, so a turn never
re-serializes or re-hashes the whole history.

Alongside the chat list it keeps two running figures about what the model is sent:

- ``bytes``: the exact length of the chat list as compact JSON (``separators=(",", ":")``,
  UTF-8). Each entry's size is added as the entry is made (and grown when a tool call joins an
  assistant message), so it costs one string quote per field, not an encoding of the list.
- the prompt hash: SHA-256 over the compact JSON of each projected piece in order (a text or
  ``tool`` message, the opening of an assistant message carrying tool calls, each tool call
  with its parameters' keys sorted). It identifies the prompt exactly without storing it, and
  is recomputed the same way from a stored transcript by projecting it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from agents_api import Message
from agents_api.jsontext import canonical_bytes, compact_bytes
from datamachine.tools.arguments import sendable_parameters

__all__ = ["ChatProjector"]

_TOOL_CALLS_OPEN = '{"role":"assistant","content":"","tool_calls":['
# Added to an assistant text message when it adopts its first tool call: ,"tool_calls":[]
_ADOPT_BYTES = len(',"tool_calls":[]')


class ChatProjector:
    """Stateful, append-only projection of one run's transcript (see module docstring)."""

    __slots__ = ("_adopt", "_current", "_current_turn", "_hash", "_keys", "_seen", "bytes",
                 "chat")

    def __init__(self, keys: Mapping[str, tuple[object, str]] | None = None) -> None:
        """``keys``: call id -> (parameters object, canonical JSON) that the run's tool index
        already wrote (used when the parameters are that very object)."""
        self.chat: list[dict[str, Any]] = []
        self._seen = 0
        self._current: dict[str, Any] | None = None
        self._current_turn: object = None
        self._adopt = False
        self._hash = hashlib.sha256()
        self.bytes = 2  # "[]"
        self._keys = keys if keys is not None else {}

    def sync(self, messages: list[Message]) -> list[dict[str, Any]]:
        """Project the envelopes appended since the last call; return the whole chat list."""
        for message in messages[self._seen:]:
            self._add(message)
        self._seen = len(messages)
        return self.chat

    def prompt_sha256(self) -> str:
        """Running hash over everything projected so far (see module docstring)."""
        return self._hash.copy().hexdigest()

    def _entry(self, entry: dict[str, Any], encoded: bytes) -> None:
        """Append a chat message whose compact JSON is ``encoded``."""
        self._hash.update(encoded)
        self.bytes += len(encoded) + (1 if self.chat else 0)
        self.chat.append(entry)

    def _add(self, message: Message) -> None:
        kind = message.type
        if kind == "tool_call":
            self._add_call(message)
        elif kind == "tool_result":
            content = (message.content if isinstance(message.content, str)
                       else compact_bytes(message.content).decode())
            call_id = str(message.metadata.get("tool_call_id", ""))
            result = {"role": "tool", "tool_call_id": call_id, "content": content}
            self._entry(result, compact_bytes(result))
            self._adopt = False
        else:
            role, text = message.role, message.content
            entry: dict[str, Any] = {"role": role, "content": text}
            self._entry(entry, compact_bytes(entry))
            if role == "assistant":
                self._current, self._current_turn, self._adopt = entry, None, True
            else:
                self._current, self._current_turn, self._adopt = None, None, False

    def _add_call(self, message: Message) -> None:
        payload = message.payload
        turn = payload.get("turn")
        call_id = str(message.metadata.get("tool_call_id", ""))
        name = str(payload.get("tool_name", ""))
        parameters = payload.get("parameters")
        if type(parameters) is not dict:
            parameters = sendable_parameters(parameters)
        call = {"id": call_id, "name": name, "parameters": parameters}
        # The call as the provider receives it, except that parameters' keys are sorted here
        # (id, name and parameters are in sorted order already).
        known = self._keys.get(call_id)
        encoded = (known[1].encode() if known is not None and known[0] is parameters
                   else canonical_bytes(parameters))
        text = (b'{"id":' + compact_bytes(call_id) + b',"name":' + compact_bytes(name)
                + b',"parameters":' + encoded + b"}")
        current = self._current
        if current is not None and (self._adopt or self._current_turn == turn):
            calls = current.get("tool_calls")
            if calls is None:  # an assistant text message takes its first call
                current["tool_calls"] = calls = []
                self.bytes += _ADOPT_BYTES
            self.bytes += len(text) + (1 if calls else 0)
            calls.append(call)
        else:
            current = {"role": "assistant", "content": "", "tool_calls": [call]}
            opening = _TOOL_CALLS_OPEN.encode()
            self._hash.update(opening)
            self.bytes += len(opening) + len(text) + 2 + (1 if self.chat else 0)  # "]}"
            self.chat.append(current)
            self._current = current
        self._hash.update(text)
        self._current_turn = turn
        self._adopt = False
