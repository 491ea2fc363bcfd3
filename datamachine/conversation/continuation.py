"""Resuming work: ``continue_conversation`` (headless "+N turns") and chat sessions with turn
limits (DESIGN.md section 6).

Both run on the stored transcript of a session, so the model keeps its full context, and both
report the run's own ``turn_count`` next to the session's ``cumulative_turn_count``.
"""

from __future__ import annotations

from typing import Any

from agents_api import IterationBudget, Message, TurnResult
from datamachine.conversation.result import ConversationResult
from datamachine.errors import ChatSessionNotFound, UsageError
from datamachine.host import Host
from datamachine.registry import validate_budget_value
from datamachine.storage.chat_sessions import ChatSession

__all__ = ["chat_on", "chat_turns_on", "continue_conversation_on"]

CHAT_TURN_BUDGET = "chat_turns"


def continue_conversation_on(
    host: Host,
    session_id: str,
    extend_by: int,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
) -> ConversationResult:
    """Run at most ``extend_by`` more provider turns on a stored transcript.

    Provider, model and mode default to those recorded with the transcript. ``tools=None``
    runs with no tools; pass them again to keep them. A transcript left interrupted by a crash
    continues the same way.
    """
    from datamachine.conversation.run import run_conversation_on

    validate_budget_value("extend_by", extend_by)
    record = host.transcripts.get_transcript(session_id)
    chosen_provider = provider or record.provider or host.settings.get("default_provider",
                                                                        "scripted")
    chosen_model = model if model is not None else (record.model or "")
    result = run_conversation_on(
        host, record.messages, tools, chosen_provider, chosen_model, record.mode or "pipeline",
        {"transcript_session_id": session_id}, extend_by,
    )
    result.cumulative_turn_count = host.transcripts.get_transcript(session_id).cumulative_turn_count
    return result


def _limit_budget(session: ChatSession) -> IterationBudget:
    limit = session.max_turns
    ceiling = limit if isinstance(limit, int) else max(1, session.turn_count)
    return IterationBudget(CHAT_TURN_BUDGET, ceiling, session.turn_count)


def _confirmed(host: Host, session: ChatSession) -> bool:
    answer = host.first("confirm_continuation", budget=_limit_budget(session),
                        context={"kind": "chat_turn_limit", "session_id": session.id,
                                 "turn_count": session.turn_count,
                                 "max_turns": session.max_turns})
    return answer is True


def _aborted_result(session: ChatSession, messages: list[Message]) -> ConversationResult:
    return ConversationResult(
        messages=messages, status="aborted", completed=False, turn_count=0,
        warning=(f"Chat session {session.id!r} reached its turn limit ({session.max_turns}) "
                 "and was not continued; it is now aborted."),
        transcript_session_id=session.id, mode="chat",
    )


def chat_on(
    host: Host,
    session_id: str,
    message: str,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    payload: dict[str, Any] | None = None,
) -> ConversationResult:
    """One chat-mode run on a stored session: its messages plus ``message`` (see chat_turns_on).
    """
    if not isinstance(message, str) or not message.strip():
        raise UsageError("message must be a non-empty string.")
    return chat_turns_on(host, session_id, [{"role": "user", "content": message}], tools,
                         provider, model, payload)


def chat_turns_on(
    host: Host,
    session_id: str,
    new_messages: list[dict[str, Any]],
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    payload: dict[str, Any] | None = None,
    *,
    mode: Any = "chat",
    max_turns: int | None = None,
    create: bool = False,
) -> ConversationResult:
    """One run on a stored chat session: its messages plus ``new_messages``.

    The ``/chat`` endpoint calls this with the session's lock already held (a ``transcript_lock``
    in ``payload``), so the stored messages it reads cannot change under it.

    Each provider turn counts toward the session's limit. When the count reaches the limit
    (never for ``"unlimited"``), ``confirm_continuation`` is asked: True resets the count and the
    run goes on; False or no answer aborts the session (terminal) and the run stops with status
    ``aborted``. An aborted session refuses new messages with ``SessionAborted``.
    """
    from datamachine.conversation.run import emit_outside_run, run_conversation_on

    created = True
    try:
        session = host.chat_sessions.require_active(session_id)
        stored = host.chat_sessions.messages(session_id)
    except ChatSessionNotFound:
        if not create:
            raise
        # A new session is stored only once its first provider turn happened, so a request
        # refused before running leaves nothing behind.
        created, stored = False, []
        session = ChatSession(id=session_id, turn_count=0, status="active",
                              max_turns=host.chat_sessions.default_max_turns(),
                              created_at=0.0, updated_at=0.0)
    if session.limit_reached:
        if not _confirmed(host, session):
            closed = host.chat_sessions.abort(session_id)
            result = _aborted_result(closed, [Message(**m) for m in stored])
            emit_outside_run(host, payload, "completed", {
                "mode": "chat", "status": "aborted", "turn": 0, "turn_count": 0,
                "message_count": len(stored), "tool_results": 0, "budget": None,
                "budgets": {}, "error": None, "error_code": None, "session_id": session_id,
            })
            return result
        session = host.chat_sessions.reset_turns(session_id)

    aborted = False
    notice = (f"Chat session {session_id!r} reached its turn limit ({session.max_turns}) and "
              "was not continued; it is now aborted.")

    def count_turn(outcome: TurnResult) -> None:
        nonlocal aborted, created
        if not created:
            host.chat_sessions.create(max_turns=session.max_turns, session_id=session_id)
            created = True
        current = host.chat_sessions.add_turns(session_id, 1)
        if not current.limit_reached:
            return
        if _confirmed(host, current):
            host.chat_sessions.reset_turns(session_id)
            return
        host.chat_sessions.abort(session_id)
        aborted = True
        # Declined: this turn's tool calls do not run, and the run ends after it.
        outcome.tool_calls = []
        outcome.complete = True

    def settle(result: ConversationResult) -> None:
        if aborted and result.status in ("completed", "budget_exceeded", "incomplete"):
            result.status, result.completed, result.warning = "aborted", False, notice
            result.budget, result.flags, result.max_turns_reached = None, [], False
            if not result.final_content:
                result.final_content = notice

    result = run_conversation_on(
        host, [*stored, *new_messages], tools,
        provider or host.settings.get("default_provider", "scripted"),
        model if model is not None else host.settings.get("default_model", ""), mode,
        {**(payload or {}), "transcript_session_id": session_id}, max_turns, False,
        after_turn=count_turn, settle=settle,
    )
    if host.transcripts.exists(session_id):
        record = host.transcripts.get_transcript(session_id)
        result.cumulative_turn_count = record.cumulative_turn_count
    return result
