"""The ``tool_intents`` table: what a run was about to do before an effectful tool call.

DESIGN.md section 24. Before a call of an ``idempotent`` or ``write`` tool (or any approved
call) runs, its run stores an :class:`Intent` in a transaction that proves the session's lock;
the call's result, stored with its turn, settles it in the same commit. An intent still
``pending`` when a run goes on from the stored transcript is a call whose outcome nobody
stored: the run that died may or may not have done it. Every function runs inside a
transaction the caller opened (the run's
:class:`~datamachine.storage.transcript_writer.TranscriptWriter`); none commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agents_api.jsontext import canonical_json
from datamachine.storage._tx import Conn, query, write_later, write_many_later
from datamachine.storage.transcript_rows import json_object

__all__ = ["PENDING", "SETTLED", "Intent", "settle", "store", "unsettled"]

PENDING = "pending"
SETTLED = "settled"
# The error_type of a call the run's time limit cut off (agents_api's loop writes it).
CUT_OFF = "deadline_exceeded"


@dataclass(frozen=True, slots=True)
class Intent:
    """One effectful call about to run.

    ``turn``: the turn of the run that asked for it (its envelopes carry it); ``arguments``:
    the checked arguments (stored as canonical JSON); ``effects``: the tool's declaration
    (``"idempotent"`` or ``"write"``, ``"read"`` for an approved read); ``approval``: what let
    it run when a person approved it (the pause's id, or ``"asked"`` for
    ``confirm_continuation``'s yes), None otherwise. An approved call is in doubt after a crash
    whatever its effects: its approval was used up when it started.
    """

    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    idempotency_key: str
    effects: str
    turn: int = 0
    approval: str | None = None

    @property
    def in_doubt(self) -> bool:
        """Whether a run that finds it unsettled must not simply run it again."""
        return self.approval is not None or self.effects != "idempotent"

    def call(self) -> dict[str, Any]:
        """The call as a paused run's waiting call (``pending["tool_calls"]``)."""
        return {"id": self.call_id, "name": self.tool_name, "parameters": dict(self.arguments),
                "turn": self.turn}


def store(conn: Conn, session_id: str, intent: Intent, now: float) -> None:
    """Store ``intent`` as pending (again, for a call run once more: same key, same row)."""
    # ``seq`` numbers the session's intents in the order they were first stored: a run that
    # goes on meets its unsettled calls in the order they ran, whatever the clock said.
    write_later(
        conn,
        "INSERT INTO tool_intents (session_id, idempotency_key, seq, call_id, turn, tool_name, "
        "arguments, effects, approval, state, created_at, settled_at) "
        "VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM tool_intents WHERE "
        "session_id = ?), ?, ?, ?, ?, ?, ?, ?, ?, NULL) "
        "ON CONFLICT (session_id, idempotency_key) DO UPDATE SET call_id = excluded.call_id, "
        "turn = excluded.turn, tool_name = excluded.tool_name, "
        "arguments = excluded.arguments, effects = excluded.effects, "
        "approval = excluded.approval, state = excluded.state, "
        "created_at = excluded.created_at, settled_at = NULL",
        [session_id, intent.idempotency_key, session_id, intent.call_id, intent.turn,
         intent.tool_name, canonical_json(intent.arguments), intent.effects, intent.approval,
         PENDING, now])


def settle(conn: Conn, session_id: str, keys: Sequence[str], now: float) -> None:
    """Mark the intents of ``keys`` settled: their calls' results are stored in this commit."""
    if keys:
        write_many_later(
            conn,
            "UPDATE tool_intents SET state = ?, settled_at = ? "
            "WHERE session_id = ? AND idempotency_key = ?",
            [(SETTLED, now, session_id, key) for key in keys])


def unsettled(conn: Conn, session_id: str) -> list[Intent]:
    """The session's pending intents, oldest first."""
    found = query(conn, "SELECT call_id, tool_name, arguments, idempotency_key, effects, turn, "
                        "approval FROM tool_intents WHERE session_id = ? AND state = ? "
                        "ORDER BY seq", [session_id, PENDING])
    return [Intent(row["call_id"], row["tool_name"], json_object(row["arguments"]),
                   row["idempotency_key"], row["effects"], int(row["turn"]), row["approval"])
            for row in found]


def result_calls(messages: Iterable[Any]) -> list[tuple[str, bool]]:
    """The tool results among ``messages`` (Message objects or envelopes), in order: each
    one's call id, and whether the run's time limit cut the call off (it may still be
    running, so its outcome is unknown)."""
    found = []
    for message in messages:
        if isinstance(message, dict):
            kind, metadata = message.get("type"), message.get("metadata")
            payload = message.get("payload")
        else:
            kind, metadata = getattr(message, "type", None), getattr(message, "metadata", None)
            payload = getattr(message, "payload", None)
        if kind == "tool_result" and isinstance(metadata, dict):
            call_id = metadata.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                cut_off = isinstance(payload, dict) and payload.get("error_type") == CUT_OFF
                found.append((call_id, cut_off))
    return found

