"""One ``/chat`` request as one run on a chat session.

:func:`run_chat_turn` is the single seam between the HTTP layer and the conversation layer.
It takes the session's transcript lock *before* reading the stored messages (so two requests on
one session can never both start from the same history: the second gets
``transcript_lock_contention`` without running), then runs the session exactly as ``host.chat``
does, turn limits included (DESIGN.md section 6).

It is synchronous on purpose: the server runs it in a worker thread, so a run whose tool calls
another site (possibly this one again, which must be answered with a cycle refusal) never
blocks the event loop.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from datamachine.conversation.result import ConversationResult
from datamachine.server.chain import PAYLOAD_KEY, CallerContext

if TYPE_CHECKING:
    from datamachine.host import Host
    from datamachine.storage.transcripts import TranscriptStore

__all__ = ["LOCK_TTL_SECONDS", "ChatTurn", "HeldLock", "run_chat_turn"]

# The run renews the lock after every turn, so this only bounds how long a crashed server
# blocks a session (the loop's own default).
LOCK_TTL_SECONDS = 300


@dataclass(frozen=True)
class ChatTurn:
    """What one validated ``/chat`` request asks for."""

    messages: list[dict[str, str]]
    caller: CallerContext
    session_id: str | None = None
    mode: str = "chat"
    provider: str | None = None
    model: str | None = None
    max_turns: int | None = None
    tools: dict[str, Any] = field(default_factory=dict)


class HeldLock:
    """A transcript lock the caller already took, handed to the run as its ``transcript_lock``.

    The loop's ``acquire`` gets the token already held (so the run does not contend with its
    own caller); ``renew`` and ``release`` go to the store, so the run keeps and frees the lock
    exactly as it would its own.
    """

    def __init__(self, store: TranscriptStore, session_id: str, token: str) -> None:
        self._store = store
        self._session_id = session_id
        self._token = token

    def acquire(self, session_id: str, ttl: float) -> str | None:
        """The held token for this session; None (contention) for any other."""
        return self._token if session_id == self._session_id else None

    def renew(self, session_id: str, token: str, ttl: float) -> bool:
        """Extend the held lock (called by the loop after every turn)."""
        return self._store.renew(session_id, token, ttl)

    def release(self, session_id: str, token: str) -> bool:
        """Release the held lock; a second release is a no-op."""
        return self._store.release(session_id, token)


def _contention(session_id: str, turn: ChatTurn) -> ConversationResult:
    return ConversationResult(
        status="transcript_lock_contention",
        completed=False,
        error=f"Chat session {session_id!r} is busy with another request; retry when it ends.",
        error_code="transcript_lock_contention",
        transcript_session_id=session_id,
        mode=turn.mode,
        provider=turn.provider or "",
        model=turn.model or "",
    )


def run_chat_turn(host: Host, turn: ChatTurn) -> ConversationResult:
    """Run ``turn`` on its chat session (a new one when ``turn.session_id`` is None).

    Raises :class:`datamachine.errors.ChatSessionNotFound` for an unknown session,
    :class:`SessionAborted` for an aborted one, and ``UsageError`` for arguments the run
    refuses; returns a ``transcript_lock_contention`` result, without running, when another
    request holds the session.
    """
    from datamachine.conversation.continuation import chat_turns_on

    store = host.transcripts
    if turn.session_id is None:
        session_id, existing = uuid.uuid4().hex, False
    else:
        session_id, existing = turn.session_id, True
        host.chat_sessions.get(session_id)  # unknown id: ChatSessionNotFound before any write
    token = store.acquire(session_id, LOCK_TTL_SECONDS)
    if token is None:
        return _contention(session_id, turn)
    try:
        payload: dict[str, Any] = {
            PAYLOAD_KEY: turn.caller.to_payload(),
            "transcript_lock": HeldLock(store, session_id, token),
            "transcript_lock_ttl": LOCK_TTL_SECONDS,
        }
        # host.chat's rules: the session's turn limit is checked after every provider turn;
        # with nobody to confirm over HTTP, a session at its limit is aborted (409).
        return chat_turns_on(host, session_id, turn.messages, turn.tools or None,
                             turn.provider, turn.model, payload, mode=turn.mode,
                             max_turns=turn.max_turns, create=not existing)
    finally:
        store.release(session_id, token)  # no-op when the run already released it
