"""Spend across runs: :class:`SpendStore`, the reservations and settled totals behind the
``spend_limits`` setting (DESIGN.md section 15).

A window (one limit, one scope key, one calendar window) is spent when its settled use plus its
open reservations reach the limit. Every request reserves its estimate before it is sent and
settles what it really spent after; both are one ``BEGIN IMMEDIATE`` transaction, so the check
and the reservation are atomic across threads and processes (SQLite serializes writers). A
reservation never settled (a killed process) carries an expiry, the run's transcript lock TTL,
after which it no longer counts. Settling never depends on the reservation still being there:
what a request spent is always added once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents_api import clock
from datamachine.storage._tx import Connected, connection_lock, db_label, immediate, query

__all__ = ["SpendStore", "WindowKey", "WindowUse"]


@dataclass(frozen=True, slots=True)
class WindowKey:
    """One spend window: a limit, the scope it is counted for, and the window's start."""

    limit: str
    scope_key: str
    start: str  # ISO 8601 UTC, e.g. 2026-11-24T00:00:00Z


@dataclass(frozen=True, slots=True)
class WindowUse:
    """What a window holds: settled use, and open (unexpired) reservations."""

    key: WindowKey
    settled: int
    reserved: int

    @property
    def used(self) -> int:
        """Settled plus reserved: what counts against the limit."""
        return self.settled + self.reserved


_USE = ("SELECT COALESCE((SELECT amount FROM spend_settled WHERE limit_name = ? AND "
        "scope_key = ? AND window_start = ?), 0), COALESCE((SELECT SUM(amount) FROM "
        "spend_reservations WHERE limit_name = ? AND scope_key = ? AND window_start = ? AND "
        "expires_at > ?), 0)")


def _window_key(key: WindowKey) -> str:
    # What a PostgreSQL transaction locks for one window (see datamachine.storage._pg).
    return f"spend:{key.limit}\x1f{key.scope_key}\x1f{key.start}"


class SpendStore:
    """Reserve, settle and read spend per window (see the module docstring)."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def reserve(self, reservation: str, items: Sequence[tuple[WindowKey, int, int]],
                ttl: float) -> tuple[bool, list[int]]:
        """Reserve ``amount`` in every window of ``items`` (``(key, amount, limit)``), all or
        none: refused when a window is spent (use >= limit) or the amount would take it past
        its limit. Returns (reserved, each window's use before this reservation)."""
        now = clock.now()
        keys = [_window_key(key) for key, _, _ in items]
        with immediate(self._db, self._lock, self._label, "reserve spend", keys) as conn:
            conn.execute("DELETE FROM spend_reservations WHERE expires_at <= ?", [now])
            uses = []
            for key, _, _ in items:
                row = conn.execute(_USE, [key.limit, key.scope_key, key.start, key.limit,
                                          key.scope_key, key.start, now]).fetchone()
                uses.append(int(row[0]) + int(row[1]))
            if any(use >= limit or use + amount > limit
                   for use, (_, amount, limit) in zip(uses, items, strict=True)):
                return False, uses
            conn.executemany(
                "INSERT INTO spend_reservations (id, limit_name, scope_key, window_start, "
                "amount, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(reservation, key.limit, key.scope_key, key.start, amount, now + ttl)
                 for key, amount, _ in items])
        return True, uses

    def settle(self, reservation: str, items: Sequence[tuple[WindowKey, int]]) -> None:
        """Drop ``reservation`` and add what its request spent to each window's settled use."""
        now = clock.now()
        keys = [_window_key(key) for key, _ in items]
        with immediate(self._db, self._lock, self._label, "settle spend", keys) as conn:
            conn.execute("DELETE FROM spend_reservations WHERE id = ?", [reservation])
            conn.executemany(
                "INSERT INTO spend_settled (limit_name, scope_key, window_start, amount, "
                "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (limit_name, scope_key, "
                "window_start) DO UPDATE SET amount = spend_settled.amount + excluded.amount, "
                "updated_at = excluded.updated_at",
                [(key.limit, key.scope_key, key.start, amount, now)
                 for key, amount in items if amount > 0])

    def release(self, reservation: str) -> None:
        """Drop ``reservation`` (its request failed or was never sent)."""
        with immediate(self._db, self._lock, self._label, "release spend",
                       (f"spend-reservation:{reservation}",)) as conn:
            conn.execute("DELETE FROM spend_reservations WHERE id = ?", [reservation])

    def use(self, keys: Sequence[WindowKey]) -> list[WindowUse]:
        """What each window holds now."""
        now = clock.now()
        found = []
        with self._lock:
            for key in keys:
                row = self._db.conn.execute(_USE, [key.limit, key.scope_key, key.start,
                                                   key.limit, key.scope_key, key.start,
                                                   now]).fetchone()
                found.append(WindowUse(key, int(row[0]), int(row[1])))
        return found

    def windows(self, starts: dict[str, str]) -> list[WindowUse]:
        """Every scope key with use in the current window of each limit (``{limit: start}``),
        for ``datamachine spend``."""
        now = clock.now()
        found: dict[WindowKey, list[int]] = {}
        with self._lock:
            for limit, start in starts.items():
                for row in query(self._db.conn,
                                 "SELECT scope_key, amount FROM spend_settled WHERE "
                                 "limit_name = ? AND window_start = ?", [limit, start]):
                    found.setdefault(WindowKey(limit, row["scope_key"], start), [0, 0])[0] = \
                        int(row["amount"])
                for row in query(self._db.conn,
                                 "SELECT scope_key, SUM(amount) AS amount FROM "
                                 "spend_reservations WHERE limit_name = ? AND window_start = ? "
                                 "AND expires_at > ? GROUP BY scope_key", [limit, start, now]):
                    found.setdefault(WindowKey(limit, row["scope_key"], start), [0, 0])[1] = \
                        int(row["amount"])
        return [WindowUse(key, settled, reserved)
                for key, (settled, reserved) in sorted(found.items(),
                                                       key=lambda item: (item[0].limit,
                                                                         item[0].scope_key))]
