"""The transcript tables, one function per kind of write: what the store's one-off writes and a
run's :class:`~datamachine.storage.transcript_writer.TranscriptWriter` share.

Every function runs inside a transaction the caller opened; none commits. A ``transcripts`` row
holds exact counts after every write (``message_count``, this run's ``turn_count``, every
run's ``cumulative_turn_count``): a turn's messages and its counts land in one commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents_api.jsontext import compact_json
from agents_api.message import Message, normalize_message
from datamachine.storage._tx import Conn, query_one, write_later, write_many_later

__all__ = ["TITLE_LENGTH", "Counts", "append", "encode", "finish", "json_object", "read_counts",
           "start", "title_of"]

MessageLike = Message | Mapping[str, Any]

# How much of its first user message a transcript keeps as its title (the run viewer's list).
TITLE_LENGTH = 200
# The most timeline entries a session keeps over all its runs (the last ones).
SESSION_TIMELINE = 1000

# What a finished run's row keeps of its result (beside usage and budgets).
SUMMARY_FIELDS = ("status", "completed", "final_content", "budget", "flags", "warning", "error",
                  "error_code", "warnings", "turn_count", "cumulative_turn_count", "blocker",
                  "pending")


@dataclass(frozen=True, slots=True)
class Counts:
    """A transcript row's status and counts."""

    status: str
    message_count: int
    turn_count: int
    cumulative_turn_count: int

    def earlier_turns(self, turn: int | None = None) -> int:
        """Turns of the runs before the one writing now.

        A ``running`` row's ``turn_count`` belongs to the run writing it, unless that run is
        over: a finished row, or a write of a turn numbered at or below it (a new run that did
        not call :func:`start`).
        """
        ongoing = self.status == "running" and (turn is None or turn > self.turn_count)
        return self.cumulative_turn_count - (self.turn_count if ongoing else 0)


def encode(item: MessageLike) -> str:
    """A message as the compact JSON envelope the table stores."""
    return (item if isinstance(item, Message) else normalize_message(item)).to_json()


def _request_field(request: Mapping[str, Any], key: str) -> str | None:
    value = request.get(key)
    if isinstance(value, list | tuple):  # a list of modes is accepted; store them joined
        value = ",".join(str(v) for v in value)
    return None if value is None else str(value)


def json_object(text: object) -> dict[str, Any]:
    """A stored JSON object ({} when it is missing or not readable)."""
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _json_list(text: object) -> list[Any]:
    """A stored JSON list of objects ([] when it is missing or not readable)."""
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return []
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def _added(before: object, usage: Mapping[str, Any]) -> dict[str, Any]:
    """Every run's usage of a session so far: the stored total plus this run's, key by key
    (numbers only; a count no run reported stays None, "not reported")."""
    total = dict(before) if isinstance(before, dict) else {}
    for key, value in usage.items():
        previous = total.get(key, 0)
        if previous is None:  # not reported by the runs before: this run's, or still None
            total[key] = value
        elif (isinstance(value, int | float) and not isinstance(value, bool)
                and isinstance(previous, int | float) and not isinstance(previous, bool)):
            total[key] = previous + value
    return total


def read_counts(conn: Conn, sid: str) -> Counts | None:
    """The row's status and counts, or None when the session has no transcript yet."""
    row = query_one(conn, "SELECT status, message_count, turn_count, cumulative_turn_count "
                          "FROM transcripts WHERE id = ?", [sid])
    return None if row is None else _counts(row)


def _counts(row: Any) -> Counts:
    return Counts(row["status"], int(row["message_count"]), int(row["turn_count"]),
                  int(row["cumulative_turn_count"]))


def _insert(conn: Conn, sid: str, position: int, turn: int,
            encoded: Sequence[str], now: float, run_base: int) -> None:
    # ``run_base``: the session's turns before the run that writes them, which tells the
    # session's runs apart (each numbers its turns from 1 again).
    if encoded:
        write_many_later(
            conn,
            "INSERT INTO transcript_messages (session_id, position, turn, envelope, created_at, "
            "run_base) VALUES (?, ?, ?, ?, ?, ?)",
            [(sid, position + i, turn, text, now, run_base)
             for i, text in enumerate(encoded)])


def _insert_compactions(conn: Conn, sid: str, records: Sequence[Any], run_base: int,
                        now: float) -> None:
    """The run's compactions (see ``transcript_compactions``), numbered after the session's
    earlier ones; each a dict as ``datamachine.context`` records it."""
    found = query_one(conn, "SELECT COALESCE(MAX(seq), 0) AS last FROM transcript_compactions "
                            "WHERE session_id = ?", [sid])
    last = int(found["last"]) if found is not None else 0
    rows = []
    for offset, record in enumerate(r for r in records if isinstance(r, Mapping)):
        view = record.get("view")
        window = record.get("context_window")
        rows.append((sid, last + offset + 1, run_base, int(record.get("turn", 0)),
                     str(record.get("strategy", "")), int(record.get("tokens_before", 0)),
                     int(record.get("tokens_after", 0)), int(record.get("messages_removed", 0)),
                     int(record.get("upto", 0)), window if isinstance(window, int) else None,
                     record.get("summary"),
                     compact_json(view) if isinstance(view, list) else None, now))
    write_many_later(
        conn,
        "INSERT INTO transcript_compactions (session_id, seq, run_base, turn, strategy, "
        "tokens_before, tokens_after, messages_removed, upto, context_window, summary, view, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def title_of(messages: Sequence[MessageLike]) -> str | None:
    """The text of the first user message, cut to ``TITLE_LENGTH`` characters: what the run
    viewer lists a transcript by (None when no user message has text)."""
    for item in messages:
        role = item.role if isinstance(item, Message) else item.get("role")
        content = item.content if isinstance(item, Message) else item.get("content")
        if role == "user" and isinstance(content, str) and content.strip():
            # Stored as a plain column (not JSON-escaped like the envelopes): no lone
            # surrogate (not UTF-8) or NUL (PostgreSQL text refuses it) may reach it.
            text = content[:TITLE_LENGTH].encode("utf-8", "replace").decode("utf-8")
            return text.replace("\x00", "\ufffd")
    return None


def _create(conn: Conn, sid: str, request: Mapping[str, Any],
            now: float, messages: Sequence[MessageLike] = ()) -> Counts:
    conn.execute(
        "INSERT INTO transcripts (id, status, provider, model, mode, created_at, updated_at, "
        "token_name, title) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?)",
        [sid, _request_field(request, "provider"), _request_field(request, "model"),
         _request_field(request, "mode"), now, now, _request_field(request, "token_name"),
         title_of(messages)])
    return Counts("running", 0, 0, 0)


def start(conn: Conn, sid: str, messages: Sequence[MessageLike],
          request: Mapping[str, Any], now: float) -> Counts:
    """A run begins: store its starting messages beyond the stored ones; the row is
    ``running`` with ``turn_count`` 0 (the counts of the run that starts now)."""
    counts = read_counts(conn, sid) or _create(conn, sid, request, now, messages)
    new = [encode(m) for m in messages[counts.message_count:]]
    # Whatever ran before (a finished run, or one that was killed) is over now.
    earlier = counts.cumulative_turn_count
    _insert(conn, sid, counts.message_count, 0, new, now, earlier)
    write_later(
        conn,
        "UPDATE transcripts SET status = 'running', provider = COALESCE(?, provider), "
        "model = COALESCE(?, model), mode = COALESCE(?, mode), "
        "token_name = COALESCE(?, token_name), message_count = ?, "
        "turn_count = 0, cumulative_turn_count = ?, updated_at = ? WHERE id = ?",
        [_request_field(request, "provider"), _request_field(request, "model"),
         _request_field(request, "mode"), _request_field(request, "token_name"),
         counts.message_count + len(new), earlier, now, sid])
    return Counts("running", counts.message_count + len(new), 0, earlier)


def append(conn: Conn, sid: str, turn: int, messages: Sequence[MessageLike],
           now: float) -> Counts:
    """One finished turn: its messages after the stored ones, and the row's counts with them.

    A turn numbered at or below the row's own ``turn_count`` starts a new run on the session
    (one that did not call ``start``).
    """
    counts = read_counts(conn, sid) or _create(conn, sid, {}, now, messages)
    encoded = [encode(m) for m in messages]
    earlier = counts.earlier_turns(turn)
    _insert(conn, sid, counts.message_count, turn, encoded, now, earlier)
    after = Counts("running", counts.message_count + len(encoded), turn, earlier + turn)
    write_later(
        conn,
        "UPDATE transcripts SET status = 'running', turn_count = ?, cumulative_turn_count = ?, "
        "message_count = ?, updated_at = ? WHERE id = ?",
        [after.turn_count, after.cumulative_turn_count, after.message_count, now, sid])
    return after


def finish(conn: Conn, sid: str, messages: Sequence[MessageLike],
           request: Mapping[str, Any], result: Any, now: float) -> None:
    """A run ends: anything not stored yet, the final status, usage, budgets and summary.

    ``result`` is a ``LoopResult`` (or anything with its attributes).
    """
    found = query_one(conn, "SELECT status, message_count, turn_count, cumulative_turn_count, "
                            "usage, result, timeline FROM transcripts WHERE id = ?", [sid])
    counts = (_counts(found) if found is not None
              else _create(conn, sid, request, now, messages))
    new = [encode(m) for m in messages[counts.message_count:]]
    turn_count = int(getattr(result, "turn_count", 0) or 0)
    earlier = counts.earlier_turns()
    _insert(conn, sid, counts.message_count, turn_count, new, now, earlier)
    cumulative = earlier + turn_count
    summary = {key: getattr(result, key) for key in SUMMARY_FIELDS if hasattr(result, key)}
    # Product diagnostics a stop handler settled (a blocker, completion state); the
    # timeline has a column of its own, so listings never read it.
    summary.update(getattr(result, "metadata", None) or {})
    own = summary.pop("timeline", None)
    compactions = summary.pop("compactions", None)
    summary["cumulative_turn_count"] = cumulative
    usage = dict(getattr(result, "usage", None) or {})
    timeline = own if isinstance(own, list) else []
    if found is not None:  # every finish is a run of its own: it adds to the earlier ones'
        timeline = [*_json_list(found["timeline"]), *timeline][-SESSION_TIMELINE:]
        before = json_object(found["result"])
        if before:  # a run finished here before: the session's usage goes on from it
            summed = before.get("session_usage")
            summary["session_usage"] = _added(
                summed if isinstance(summed, dict) else json_object(found["usage"]), usage)
    if isinstance(compactions, list) and compactions:
        _insert_compactions(conn, sid, compactions, earlier, now)
    write_later(
        conn,
        "UPDATE transcripts SET status = ?, provider = COALESCE(?, provider), "
        "model = COALESCE(?, model), mode = COALESCE(?, mode), updated_at = ?, turn_count = ?, "
        "cumulative_turn_count = ?, message_count = ?, usage = ?, budgets = ?, result = ?, "
        "timeline = ? WHERE id = ?",
        [str(getattr(result, "status", "completed")), _request_field(request, "provider"),
         _request_field(request, "model"), _request_field(request, "mode"), now, turn_count,
         cumulative, counts.message_count + len(new),
         compact_json(usage),
         compact_json(getattr(result, "budgets", None) or {}), compact_json(summary),
         compact_json(timeline) if timeline else None, sid])
