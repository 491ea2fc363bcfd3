"""What every run on a stored session shares: chat, continue and resume (DESIGN.md 6, 10, 16).

Each takes the session's transcript lock *before* it reads the session or its stored history, so
two requests on one session can never both start from the same history: the second gets
``transcript_lock_contention`` without running (:func:`contention_result`). A run can also end
before its loop starts: paused at a chat session's limit (:func:`pause_before_run`), declined
there (:func:`abort_before_run`), or failed while a person was asked (:func:`failed_before_run`);
each still stores what it must and emits the terminal event a run emits. A session whose run
waits for a person takes nothing new until it is answered (:func:`refuse_if_paused`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agents_api import Message
from agents_api.results import terminal_payload
from datamachine.budgets_builtin import CHAT_TURNS
from datamachine.conversation.events import emit_outside_run
from datamachine.conversation.pausing import (
    PausedRun,
    kept_payload,
    paused_runs,
    pending_warning,
    stored_pending,
)
from datamachine.conversation.payload import split_payload
from datamachine.conversation.result import ConversationResult
from datamachine.conversation.spec import normalize_tools
from datamachine.errors import SessionAwaitingConfirmation, TranscriptNotFound, UsageError
from datamachine.payload_keys import RuntimeOptions
from datamachine.storage.chat_sessions import MaxTurns
from datamachine.storage.transcript_writer import TranscriptWriter
from datamachine.tools.in_doubt import InDoubt

if TYPE_CHECKING:
    from datamachine.conversation.chat import ChatTurnGate
    from datamachine.host import Services

__all__ = [
    "HookFailed",
    "abort_before_run",
    "check_session_payload",
    "contention_result",
    "failed_before_run",
    "limit_notice",
    "limit_stop",
    "pause_before_run",
    "refuse_if_paused",
    "settle_without_run",
]


def limit_notice(session_id: str, max_turns: MaxTurns) -> str:
    """Why a chat session at its turn limit was not continued."""
    return (f"Chat session {session_id!r} reached its turn limit ({max_turns}) and was not "
            "continued; it is now aborted.")


class HookFailed(Exception):
    """``confirm_continuation`` raised while a session at its limit was asked before a run."""

    code = "budget_hook_failed"


def check_session_payload(payload: Mapping[str, Any] | None) -> RuntimeOptions:
    """The run's runtime options; a chat session is stored by the host, never by the payload's
    store."""
    _, runtime = split_payload(payload)
    if runtime.transcript_persister is not None or runtime.transcript_lock is not None:
        raise UsageError("A chat session is stored by the host: leave transcript_persister "
                         "and transcript_lock out of a chat run's payload.")
    return runtime


def refuse_if_paused(services: Services, session_id: str) -> None:
    """A session whose run waits for a person takes nothing new until it is answered (read
    under the session's lock)."""
    try:
        stored = services.transcripts.summary(session_id)
    except TranscriptNotFound:
        return
    pending = stored_pending(stored.status, stored.result)
    if pending is not None:
        raise SessionAwaitingConfirmation(
            f"Session {session_id!r} is paused: {pending_warning(pending)}",
            session_id=session_id, pending=pending)


def contention_result(services: Services, session_id: str, mode: str, provider: str | None,
                      model: str | None, payload: Mapping[str, Any] | None) -> ConversationResult:
    """What a run on a session another run holds returns (it did not run), with the events a
    run emits: ``transcript_lock_contention`` and the terminal ``completed``."""
    emit_outside_run(services, payload, "transcript_lock_contention",
                     {"mode": mode, "session_id": session_id})
    try:
        earlier = services.transcripts.summary(session_id).cumulative_turn_count
    except TranscriptNotFound:
        earlier = 0
    result = ConversationResult(
        status="transcript_lock_contention", completed=False,
        error=f"Session {session_id!r} is busy with another run; retry when it ends.",
        error_code="transcript_lock_contention", transcript_session_id=session_id,
        cumulative_turn_count=earlier, mode=mode, provider=provider or "", model=model or "")
    emit_outside_run(services, payload, "completed", _terminal(result, mode))
    return result


def failed_before_run(services: Services, session_id: str, exc: Exception, mode: Any,
                      provider: str | None, model: str | None,
                      payload: Mapping[str, Any] | None) -> ConversationResult:
    """What a run returns when it failed before its loop started (its lock lost while a person
    answered the limit's question, or the question's hook raised), with its terminal event."""
    label = mode if isinstance(mode, str) else ",".join(mode)
    cause = exc.__cause__ if isinstance(exc, HookFailed) and exc.__cause__ else exc
    result = ConversationResult(
        status="error", completed=False, error=str(cause) or type(cause).__name__,
        error_code=str(getattr(exc, "code", "error")), transcript_session_id=session_id,
        mode=label, provider=provider or "", model=model or "")
    emit_outside_run(services, payload, "failed", {**_terminal(result, label),
                                                   "session_id": session_id})
    return result


def unsettled_plan(services: Services, writer: TranscriptWriter) -> InDoubt | None:
    """The calls a run that died left unsettled on the writer's session (read under its lock),
    for the run that goes on (DESIGN.md 24); None when there are none. A call whose tool the
    run does not offer is run again (or reconciled) with the host's tool of that name."""
    found = writer.unsettled_intents()
    if not found:
        return None
    registered = services.tools.tools()
    return InDoubt(found,
                   {intent.tool_name: registered[intent.tool_name] for intent in found
                    if intent.tool_name in registered})


def settle_without_run(services: Services, writer: TranscriptWriter, messages: list[Message],
                       result: ConversationResult,
                       payload: Mapping[str, Any] | None) -> ConversationResult:
    """Store ``messages`` and ``result`` for a run decided before any turn (paused at a limit,
    declined on resume), and emit its terminal event."""
    request = {"provider": result.provider or None, "model": result.model or None,
               "mode": result.mode}
    writer.begin(messages, request)
    writer.persist(messages, request, result)
    emit_outside_run(services, payload, "completed",
                     {**_terminal(result, result.mode), "session_id": writer.session_id})
    return result


def pause_before_run(services: Services, gate: ChatTurnGate, writer: TranscriptWriter,
                     new_messages: list[dict[str, Any]], tools: Any, provider: str,
                     model: str, mode: Any, payload: Mapping[str, Any] | None
                     ) -> ConversationResult:
    """A message to a session already at its limit, with ``confirmation="pause"``: the
    message is stored and the run waits for ``resume`` before its first turn."""
    label = mode if isinstance(mode, str) else ",".join(mode)
    offered = normalize_tools(tools)
    pause_id = uuid.uuid4().hex
    pending = {"kind": "chat_turn_limit", "budget": CHAT_TURNS, "tool_call": None,
               "tool_calls": [], "tools": sorted(offered), "pause_id": pause_id}
    messages = [*(Message(**m) for m in writer.history()),
                *(Message(**m) for m in new_messages)]
    result = ConversationResult(
        messages=messages, status="awaiting_confirmation", completed=False,
        budget=CHAT_TURNS, warning=pending_warning(pending), pending=pending,
        warnings=list(gate.warnings), cumulative_turn_count=writer.stored_turns(),
        transcript_session_id=gate.session_id, mode=label, provider=provider, model=model)
    clean, runtime = split_payload(payload)
    settle_without_run(services, writer, messages, result, payload)
    paused_runs(services).keep(gate.session_id, PausedRun(
        tools=offered, payload=kept_payload(clean, runtime), pause_id=pause_id))
    return result


def abort_before_run(services: Services, gate: ChatTurnGate, writer: TranscriptWriter,
                      payload: Mapping[str, Any] | None) -> ConversationResult:
    """The result of a run declined at the limit before it started (the gate aborted it): it
    names the budget ``chat_turns`` as every budget stop does."""
    session = gate.session
    result = ConversationResult(
        messages=[Message(**m) for m in writer.history()], status="aborted", completed=False,
        turn_count=0, cumulative_turn_count=writer.stored_turns(),
        warning=limit_notice(session.id, session.max_turns), warnings=list(gate.warnings),
        transcript_session_id=session.id, mode="chat", **limit_stop(gate))
    emit_outside_run(services, payload, "completed", {**_terminal(result, "chat"),
                                                      "session_id": session.id})
    return result


def limit_stop(gate: ChatTurnGate) -> dict[str, Any]:
    """What a result stopped by a chat session's limit says about it, as any budget stop
    does: ``budget``, the flag ``max_chat_turns_reached`` and the ``chat_turns`` snapshot."""
    spent = gate.budget()
    return {"budget": spent.name(), "flags": [spent.to_response_flag()],
            "budgets": {spent.name(): spent.snapshot()}}


def _terminal(result: ConversationResult, mode: str) -> dict[str, Any]:
    return {"mode": mode, **terminal_payload(result)}
