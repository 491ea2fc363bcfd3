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

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agents_api.jsontext import compact_json
from datamachine.storage._tx import Conn, query, write_later, write_many_later

__all__ = ["PENDING", "SETTLED", "Intent", "settle", "store", "unsettled"]

PENDING = "pending"
SETTLED = "settled"


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
    write_later(
        conn,
        "INSERT INTO tool_intents (session_id, idempotency_key, call_id, turn, tool_name, "
        "arguments, effects, approval, state, created_at, settled_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL) "
        "ON CONFLICT (session_id, idempotency_key) DO UPDATE SET state = excluded.state, "
        "approval = excluded.approval, created_at = excluded.created_at, settled_at = NULL",
        [session_id, intent.idempotency_key, intent.call_id, intent.turn, intent.tool_name,
         compact_json(intent.arguments), intent.effects, intent.approval, PENDING, now])


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
                        "ORDER BY created_at, idempotency_key", [session_id, PENDING])
    return [Intent(row["call_id"], row["tool_name"], _arguments(row["arguments"]),
                   row["idempotency_key"], row["effects"], int(row["turn"]), row["approval"])
            for row in found]


def result_call_ids(messages: Iterable[Any]) -> list[str]:
    """The call ids of the tool results among ``messages`` (Message objects or envelopes)."""
    found = []
    for message in messages:
        if isinstance(message, dict):
            kind, metadata = message.get("type"), message.get("metadata")
        else:
            kind, metadata = getattr(message, "type", None), getattr(message, "metadata", None)
        if kind == "tool_result" and isinstance(metadata, dict):
            call_id = metadata.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                found.append(call_id)
    return found


def _arguments(text: object) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
