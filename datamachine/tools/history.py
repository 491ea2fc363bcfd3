"""An incremental index of the tool calls in a run's transcript.

Duplicate checks and runtime rules both ask questions about earlier calls ("did this exact call
already succeed?", "was tool A called since B?"). Rescanning the whole transcript on every call
makes each turn slower than the last, and the loop's per-turn overhead is a measured product
feature. So this index keeps a cursor into the live transcript and reads only the messages
appended since the previous call: each message is looked at once per run.

The transcript is the source of truth (not the executor's own memory), so calls and results
from earlier runs of a continued conversation count too. Calls are paired with their results by
``tool_call_id``; a result without one is paired with the oldest open call of the same tool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agents_api import Message
from agents_api.jsontext import canonical_json
from datamachine.tools.arguments import coerce_parameters
from datamachine.tools.results import REJECTED

__all__ = ["CallObserver", "CompletedCall", "TranscriptIndex", "canonical_json",
           "coerce_parameters"]



@dataclass(frozen=True, slots=True)
class CompletedCall:
    """A tool call whose result is in the transcript."""

    name: str
    parameters: Mapping[str, Any]
    key: str
    success: bool
    rejected: bool


class CallObserver(Protocol):
    """Something that learns from each completed call in transcript order (a runtime rule)."""

    def observe(self, call: CompletedCall) -> None:
        """Record one completed call."""

    def reset(self) -> None:
        """Forget everything (the transcript was replaced)."""


@dataclass(slots=True)
class _OpenCall:
    name: str
    parameters: Mapping[str, Any]
    key: str


class TranscriptIndex:
    """Successful ``(tool name, canonical parameters)`` pairs and open calls of one run."""

    __slots__ = ("_anonymous", "_cursor", "_observers", "_open", "_source", "keys",
                 "successful")

    def __init__(self, observers: Sequence[CallObserver] = ()) -> None:
        self.successful: set[tuple[str, str]] = set()
        # Call id -> (its parameters object, their canonical JSON), for the prompt hash of the
        # same run (conversation.projection), which would otherwise encode them again.
        self.keys: dict[str, tuple[object, str]] = {}
        self._open: dict[str, _OpenCall] = {}
        self._observers = tuple(observers)
        self._source: Sequence[Any] | None = None
        self._cursor = 0
        self._anonymous = 0

    def sync(self, messages: Sequence[Any]) -> None:
        """Read the messages appended since the last sync (all of them for a new transcript)."""
        if messages is not self._source or len(messages) < self._cursor:
            self._reset(messages)
        end = len(messages)
        for index in range(self._cursor, end):
            self._read(messages[index])
        self._cursor = end

    def open_key(self, call_id: str) -> str | None:
        """The canonical parameters of an open call (the current one, once synced)."""
        entry = self._open.get(call_id)
        return entry.key if entry is not None else None

    def succeeded(self, name: str, key: str) -> bool:
        """Whether this exact call already succeeded in the transcript."""
        return (name, key) in self.successful

    # -- direct feeding, for executors used without a transcript ---------------------------
    def record_call(self, call_id: str, name: str, parameters: Mapping[str, Any]) -> str:
        """Open a call seen outside a transcript; returns its canonical key."""
        key = canonical_json(parameters)
        self._open[call_id] = _OpenCall(name, parameters, key)
        return key

    def record_result(self, call_id: str, name: str, success: bool, rejected: bool) -> None:
        """Close a call seen outside a transcript with its outcome."""
        self._close(call_id, name, success, rejected)

    # -- internals -------------------------------------------------------------------------
    def _reset(self, messages: Sequence[Any]) -> None:
        self.successful = set()
        self._open = {}
        self._source = messages
        self._cursor = 0
        for observer in self._observers:
            observer.reset()

    def _read(self, message: Any) -> None:
        kind: Any
        if isinstance(message, Message):
            kind, payload, metadata = message.type, message.payload, message.metadata
        elif isinstance(message, Mapping):
            kind = message.get("type")
            payload = message.get("payload") or {}
            metadata = message.get("metadata") or {}
        else:
            return
        if kind == "tool_call":
            name = payload.get("tool_name")
            if not isinstance(name, str):
                return
            raw: object = payload.get("parameters")
            params = raw if type(raw) is dict else (coerce_parameters(raw) or {})
            call_id = str(metadata.get("tool_call_id") or "")
            key = canonical_json(params)
            if params is raw:
                self.keys[call_id] = (raw, key)
            if not call_id:
                self._anonymous += 1
                call_id = f"\0anonymous-{self._anonymous}"
            # A reused id whose call has no result yet replaces the old, unanswered call.
            self._open[call_id] = _OpenCall(name, params, key)
        elif kind == "tool_result":
            name = payload.get("tool_name")
            call_id = str(metadata.get("tool_call_id") or "")
            self._close(call_id, name if isinstance(name, str) else "",
                        payload.get("success") is True, payload.get(REJECTED) is True)

    def _close(self, call_id: str, name: str, success: bool, rejected: bool) -> None:
        entry = self._open.pop(call_id, None) if call_id else None
        if entry is None:
            for open_id, candidate in self._open.items():
                if candidate.name == name:
                    entry = self._open.pop(open_id)
                    break
        if entry is None:
            return  # a result with no call in view (trimmed transcript): nothing to learn
        if success:
            self.successful.add((entry.name, entry.key))
        if self._observers:
            completed = CompletedCall(entry.name, entry.parameters, entry.key, success, rejected)
            for observer in self._observers:
                observer.observe(completed)
