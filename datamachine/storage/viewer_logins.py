"""The run viewer's open logins: :class:`ViewerLoginStore` (the table ``ui_logins``).

A login is stored by an id the viewer derives from its session (never the cookie itself), so
signing out ends a session on the server, not only in the browser: a cookie copied before
opens nothing afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents_api import clock
from datamachine.storage._tx import Connected, connection_lock, db_label, immediate, query_one

__all__ = ["ViewerLogin", "ViewerLoginStore"]


@dataclass(frozen=True, slots=True)
class ViewerLogin:
    """One stored login: the viewer token it was made with, when, and when it was signed out
    (None while open)."""

    token_name: str
    created_at: float
    ended_at: float | None


class ViewerLoginStore:
    """Record, read and end the viewer's logins."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def record(self, login_id: str, token_name: str, *, max_age: float) -> None:
        """Store login ``login_id`` of the token ``token_name`` as open from now, and forget
        the logins older than ``max_age`` seconds (no session outlives that age)."""
        now = clock.now()
        with immediate(self._db, self._lock, self._label, "record a viewer login",
                       (f"login:{token_name}",)) as conn:
            conn.execute("DELETE FROM ui_logins WHERE created_at < ?", [now - max_age])
            conn.execute("INSERT INTO ui_logins (id, token_name, created_at) VALUES (?, ?, ?)",
                         [login_id, token_name, now])

    def get(self, login_id: str) -> ViewerLogin | None:
        """The login ``login_id``, open or ended; None when none is stored (never made, or
        forgotten)."""
        with self._lock:
            row = query_one(self._db.conn, "SELECT token_name, created_at, ended_at FROM "
                                           "ui_logins WHERE id = ?", [login_id])
        if row is None:
            return None
        ended = row["ended_at"]
        return ViewerLogin(str(row["token_name"]), float(row["created_at"]),
                           None if ended is None else float(ended))

    def end(self, login_id: str, token_name: str | None) -> None:
        """Sign login ``login_id`` (of the token ``token_name``) out, from now on."""
        with immediate(self._db, self._lock, self._label, "end a viewer login",
                       (f"login:{token_name}",)) as conn:
            conn.execute("UPDATE ui_logins SET ended_at = ? WHERE id = ?",
                         [clock.now(), login_id])
