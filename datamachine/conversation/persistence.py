"""The host's transcript store as one run's persister, sharing each envelope's JSON.

The store writes every message as ``Message.to_json()``, and the run's prompt hash reads the
same text. Encoding is the largest part of a turn's bookkeeping, so this wrapper encodes each
message once: it hands the text to the store and to the run's projector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents_api import Message
from datamachine.conversation.projection import ChatProjector
from datamachine.storage.transcripts import TranscriptStore

__all__ = ["RunTranscript"]


class RunTranscript:
    """``begin`` / ``append_turn`` / ``persist`` of ``store`` for one run (see module docstring)."""

    __slots__ = ("_projector", "_store")

    def __init__(self, store: TranscriptStore, projector: ChatProjector) -> None:
        self._store = store
        self._projector = projector

    def _encode(self, messages: Sequence[Message]) -> list[str]:
        texts = []
        remember = self._projector.remember
        for message in messages:
            text = message.to_json()
            remember(message, text)
            texts.append(text)
        return texts

    def begin(self, session_id: str, messages: Sequence[Message],
              request: Mapping[str, Any] | None = None) -> None:
        """Store the run's starting messages (see ``TranscriptStore.begin``)."""
        self._store.begin(session_id, messages, request, encoded=self._encode(messages))

    def append_turn(self, session_id: str, turn: int, messages: Sequence[Message]) -> None:
        """Store one finished turn (see ``TranscriptStore.append_turn``)."""
        self._store.append_turn(session_id, turn, messages, encoded=self._encode(messages))

    def persist(self, messages: Sequence[Message], request: Mapping[str, Any],
                result: Any) -> str:
        """Finish the run (see ``TranscriptStore.persist``)."""
        return self._store.persist(messages, request, result)
