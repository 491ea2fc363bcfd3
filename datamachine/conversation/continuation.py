"""Resuming work: ``continue_conversation`` (headless "+N turns", DESIGN.md section 10).

It runs on the stored transcript of a session, so the model keeps its full context, and reports
the run's own ``turn_count`` next to the session's ``cumulative_turn_count``. Like a chat run it
takes the session's lock before it reads the stored transcript; on a chat session its turns
count toward the session's limit, exactly as a chat's do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agents_api import LockLost
from agents_api.drive import Steps
from datamachine.conversation.chat import (
    ChatTurnGate,
    HookFailed,
    abort_before_run,
    contention_result,
    failed_before_run,
    pause_before_run,
    refuse_if_paused,
)
from datamachine.conversation.conversation_run import ConversationRun
from datamachine.conversation.pausing import CONFIRMATION_SETTING
from datamachine.conversation.result import ConversationResult
from datamachine.errors import ChatSessionNotFound, UsageError
from datamachine.payload_keys import DEFAULT_LOCK_TTL
from datamachine.registry import validate_budget_value
from datamachine.services import Services

__all__ = ["TranscriptFinished", "chat_gate", "continuation_steps"]


class TranscriptFinished(Exception):
    """The transcript to continue was finished by another run (see ``unfinished_only``)."""

    def __init__(self, record: Any) -> None:
        super().__init__(f"transcript {getattr(record, 'id', '?')} is finished")
        self.record = record


def continuation_steps(
    services: Services,
    session_id: str,
    extend_by: int,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    *,
    output_type: Any = None,
    payload: Mapping[str, Any] | None = None,
    lock_ttl: int = DEFAULT_LOCK_TTL,
    unfinished_only: Callable[[Any], bool] | None = None,
) -> Steps[ConversationResult]:
    """Run at most ``extend_by`` more provider turns on a stored transcript (as steps).

    Provider, model and mode default to those recorded with the transcript. ``tools=None``
    runs with no tools; pass them again to keep them. A transcript left interrupted by a crash
    continues the same way. Another run on the session: ``transcript_lock_contention``; a
    paused one: :class:`~datamachine.errors.SessionAwaitingConfirmation` (answer it with
    ``resume``). ``payload``: more of the run's payload (a queued job's ``job_id`` and
    options); ``lock_ttl``: the transcript lock's TTL for this run. ``unfinished_only``: a test
    of the stored transcript (read under the lock); when it fails, nothing runs and
    :class:`TranscriptFinished` carries the stored record (a queued job's transcript that
    another attempt finished meanwhile).
    """
    validate_budget_value("extend_by", extend_by)
    store = services.transcripts
    known = store.summary(session_id)  # an unknown id fails before any write
    token = store.acquire(session_id, lock_ttl)
    if token is None:
        return contention_result(services, session_id, known.mode or "pipeline", provider,
                                 model, None)
    try:
        refuse_if_paused(services, session_id)
        gate = chat_gate(services, session_id,
                         pause=services.settings.get(CONFIRMATION_SETTING) == "pause")
    except BaseException:  # aborted or paused: give the lock back
        store.release(session_id, token)
        raise
    writer = store.open_writer(session_id, token, lock_ttl,
                               on_turn=gate.write if gate is not None else None)
    try:
        record = store.get_transcript(session_id)  # read now that nothing can change it
        if unfinished_only is not None and not unfinished_only(record):
            raise TranscriptFinished(record)
        if gate is not None and gate.pause and gate.at_limit:
            return pause_before_run(services, gate, writer, [], tools,
                                    provider or record.provider or services.default_provider(None),
                                    model if model is not None else (record.model or ""),
                                    record.mode or "chat", None)
        if gate is not None and not gate.open(writer):
            return abort_before_run(services, gate.session, writer, None)
        check_recorded_modes(record.mode, services.modes)
        run = ConversationRun.create(
            services, record.messages, tools,
            provider or record.provider or services.default_provider(None),
            model if model is not None else (record.model or ""), record.mode or "pipeline",
            {**(payload or {}), "transcript_session_id": session_id,
             **({"output_type": output_type} if output_type is not None else {})},
            extend_by, writer=writer, turn_gate=gate,
            cumulative_base=record.cumulative_turn_count)
        return (yield from run.steps())
    except (LockLost, HookFailed) as exc:  # at the limit's question, before the run
        return failed_before_run(services, session_id, exc, known.mode or "pipeline", provider,
                                 model, None)
    finally:
        writer.release()  # the run frees the lock itself; this covers the paths before it


def check_recorded_modes(recorded: str | None, known: Mapping[str, str]) -> None:
    """A transcript recorded in a mode no plugin declares now (its plugin was removed) cannot
    go on as it was: say that it is the *recorded* mode, and what to do."""
    missing = [mode for mode in (recorded or "").split(",") if mode and mode not in known]
    if missing:
        raise UsageError(
            f"This transcript was recorded in mode {recorded!r}, and no loaded plugin declares "
            f"{', '.join(map(repr, missing))} now (known modes: {', '.join(sorted(known))}). "
            "Install the plugin that declares it (or check DATAMACHINE_LOAD_PLUGINS) to continue "
            "the run.")


def chat_gate(services: Services, session_id: str, *, pause: bool) -> ChatTurnGate | None:
    """On a chat session (read under its lock): its turn gate; otherwise None. Raises
    SessionAborted for an aborted one."""
    try:
        session = services.chat_sessions.require_active(session_id)
    except ChatSessionNotFound:
        return None
    return ChatTurnGate(services, session, create=False, pause=pause)
