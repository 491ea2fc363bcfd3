"""Ids as a person types them: the one stored id that a unique prefix starts.

Shared by :meth:`TranscriptStore.resolve` and :meth:`ChatSessionStore.resolve`, and through them
by every id argument of the command line. Any prefix length is accepted, as long as it starts
exactly one stored id (as ``git`` and ``llm`` do); a whole id is found by an equality lookup
first, so an id that is also the start of a longer one still means itself.

Why ``GLOB`` and not ``LIKE``: ``GLOB`` is case-sensitive like the ids themselves, and SQLite
turns a ``GLOB 'literal*'`` on a primary key into a range search of its index (``LIKE`` scans
the table unless ``case_sensitive_like`` is on). The three characters ``GLOB`` treats as
wildcards are escaped as one-character sets, so an id holding ``*``, ``?`` or ``[`` is a literal.
PostgreSQL has no ``GLOB``; its ids are ``COLLATE "C"``, where ``LIKE`` is case-sensitive and a
literal prefix is a range search too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from datamachine.errors import AmbiguousIdPrefix
from datamachine.storage._tx import Conn, dialect
from datamachine.storage.locks import check_session_id

__all__ = ["MAX_LISTED", "ambiguous", "glob_prefix", "like_prefix", "match_prefix",
           "resolve_prefix"]

# How many candidate ids an ambiguous prefix names in its error.
MAX_LISTED = 5

Table = Literal["transcripts", "chat_sessions"]


def glob_prefix(text: str) -> str:
    """The ``GLOB`` pattern of every string starting with ``text`` (taken literally)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text) + "*"


def like_prefix(text: str) -> str:
    """The ``LIKE`` pattern (escape ``\\``) of every string starting with ``text`` literally."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def match_prefix(conn: Conn, table: Table, prefix: object) -> tuple[str, list[str]]:
    """``prefix`` checked as an id (``UsageError`` if it cannot be one), and the stored ids it
    names: ``[prefix]`` when it is a whole stored id, else up to ``MAX_LISTED + 1`` ids starting
    with it, sorted (empty: none). Call it holding the connection's lock."""
    text = check_session_id(prefix)
    if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", [text]).fetchone() is not None:
        return text, [text]
    if text.strip() != text and text.strip():
        # Pasted from a listing with a space around it: a stored id never has one, so the
        # prefix is what is inside.
        text = text.strip()
        if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", [text]).fetchone() is not None:
            return text, [text]
    if dialect(conn) == "postgresql":
        # The ids are COLLATE "C" there: LIKE 'literal%' is a range search of the key's index.
        found = conn.execute(f"SELECT id FROM {table} WHERE id LIKE ? ESCAPE '\\' ORDER BY id "
                             "LIMIT ?", [like_prefix(text), MAX_LISTED + 1]).fetchall()
    else:
        found = conn.execute(f"SELECT id FROM {table} WHERE id GLOB ? ORDER BY id LIMIT ?",
                             [glob_prefix(text), MAX_LISTED + 1]).fetchall()
    return text, [str(row[0]) for row in found]


def ambiguous(prefix: str, matches: list[str], noun: str) -> AmbiguousIdPrefix:
    """The error of a prefix that starts several ``noun`` ids (``matches``, sorted)."""
    listed = ", ".join(matches[:MAX_LISTED]) + (", ..." if len(matches) > MAX_LISTED else "")
    return AmbiguousIdPrefix(
        f"Ambiguous {noun} id prefix {prefix!r}: it starts {listed}; give more characters.",
        prefix=prefix, matches=matches[:MAX_LISTED])


def resolve_prefix(conn: Conn, table: Table, prefix: object, noun: str,
                   not_found: Callable[[str], Exception]) -> str:
    """The one stored id ``prefix`` names; ``not_found(prefix)`` when none starts with it,
    :class:`AmbiguousIdPrefix` naming the candidates when several do. Call it holding the
    connection's lock."""
    text, found = match_prefix(conn, table, prefix)
    if not found:
        raise not_found(text)
    if len(found) > 1:
        raise ambiguous(text, found, noun)
    return found[0]
