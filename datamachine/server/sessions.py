"""One ``/chat`` request as one run on a chat session.

:func:`run_chat_turn` is the single seam between the HTTP layer and the conversation layer.
It runs the session exactly as ``host.chat`` does: the transcript lock is taken *before* the
stored messages are read (so two requests on one session can never both start from the same
history: the second gets ``transcript_lock_contention`` without running), turn limits included
(DESIGN.md section 6).

It is synchronous on purpose: the server runs it in a worker thread, so a run whose tool calls
another site (possibly this one again, which must be answered with a cycle refusal) never
blocks the event loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from datamachine.conversation.result import ConversationResult
from datamachine.errors import ChatSessionNotFound
from datamachine.server.chain import PAYLOAD_KEY, CallerContext
from datamachine.server.errors import SESSION_NOT_FOUND_MESSAGE

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["LOCK_TTL_SECONDS", "ChatTurn", "require_owner", "run_chat_turn"]

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
    # A person's answer to a paused session instead of new messages: (approve, extend_by).
    resume: tuple[bool, int | None] | None = None
    confirmation: str | None = None
    # The name of the bearer token the request came with (spend limits scoped "token").
    token_name: str | None = None


def run_chat_turn(host: Host, turn: ChatTurn, *,
                  event_sink: Callable[[str, dict[str, Any]], None] | None = None,
                  on_text: Callable[[str], None] | None = None) -> ConversationResult:
    """Run ``turn`` on its chat session (a new one when ``turn.session_id`` is None).

    The caller has checked the session's owner with :func:`require_owner` (the endpoint does,
    before it answers with a stream). Raises :class:`datamachine.errors.ChatSessionNotFound`
    for an unknown session,
    :class:`SessionAborted` for an aborted one, ``SessionAwaitingConfirmation`` for a paused
    one (``SessionNotPaused`` when ``turn.resume`` answers a session that is not), and
    ``UsageError`` for arguments the run refuses; returns a ``transcript_lock_contention``
    result, without running, when another request holds the session.
    """
    from agents_api.drive import drive_sync
    from datamachine.conversation.chat import chat_turns_on
    from datamachine.conversation.resuming import resume_steps

    session_id = turn.session_id or uuid.uuid4().hex
    payload: dict[str, Any] = {PAYLOAD_KEY: turn.caller.to_payload(),
                               "transcript_lock_ttl": LOCK_TTL_SECONDS}
    if event_sink is not None:
        payload["event_sink"] = event_sink
    if turn.confirmation is not None:
        payload["confirmation"] = turn.confirmation
    if turn.token_name is not None:
        payload["token_name"] = turn.token_name
    if turn.resume is not None:
        approve, extend_by = turn.resume
        # The tools the token reaches now, not those of the paused run: an allowlist narrowed
        # while the run waited holds for the rest of it (a pending call to a tool dropped
        # meanwhile reads "not found").
        return drive_sync(resume_steps(host, session_id, approve, extend_by, turn.tools,
                                       payload))
    # host.chat's rules: the lock is taken before the session is read, and the session's turn
    # limit is checked after every provider turn; with nobody to confirm over HTTP, a session
    # at its limit is aborted (409).
    return chat_turns_on(host, session_id, turn.messages, turn.tools or None, turn.provider,
                         turn.model, payload, mode=turn.mode, max_turns=turn.max_turns,
                         create=turn.session_id is None, on_text=on_text)


def require_owner(host: Host, session_id: str, token_name: str | None) -> None:
    """A session continues only for the token that created it (DESIGN.md 20): an unknown
    session, one made through the Python API and another token's all raise the same
    :class:`ChatSessionNotFound`, so a caller cannot tell them apart."""
    session = host.chat_sessions.get(session_id)  # /chat answers chat sessions only
    if session.token_name is None or session.token_name != token_name:
        raise ChatSessionNotFound(SESSION_NOT_FOUND_MESSAGE)
