"""API tokens for the ``/chat`` endpoint: :class:`TokenStore`.

Only the SHA-256 of a token is stored, so a copied database file grants nothing. A token is long
and random (``secrets.token_urlsafe``), which is why a fast unsalted hash is enough here (unlike
passwords, there is nothing to brute-force). The plaintext is returned once, by ``create``.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import re
import secrets

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from datamachine.errors import DuplicateTokenName, InvalidTokenName
from datamachine.storage._tx import (
    Connected,
    connection_lock,
    db_label,
    immediate,
    query,
    query_one,
)

__all__ = ["TOKEN_PREFIX", "ApiToken", "TokenStore", "hash_token"]

TOKEN_PREFIX = "dm_"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class ApiToken(BaseModel):
    """A token as listed: its name and dates, never the token or its hash."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    name: str
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        """True until the token is revoked."""
        return self.revoked_at is None


def hash_token(token: str) -> str:
    """The hex SHA-256 stored for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidTokenName(
            f"A token name is 1-100 letters, digits, '.', '_' or '-' (starting with a letter or "
            f"digit), got {name!r}."
        )
    return name


class TokenStore:
    """Create, verify, revoke and list API tokens."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def create(self, name: str) -> str:
        """Make a token named ``name`` and return it (``dm_...``); it is never shown again.

        An active token with that name raises :class:`DuplicateTokenName`; a revoked one's name
        may be reused (the revoked row is replaced).
        """
        checked = _check_name(name)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = clock.now()
        with immediate(self._db, self._lock, self._label, "create an API token") as conn:
            cursor = conn.execute(
                "INSERT INTO api_tokens (name, token_hash, created_at, revoked_at) "
                "VALUES (?, ?, ?, NULL) ON CONFLICT (name) DO UPDATE SET "
                "token_hash = excluded.token_hash, created_at = excluded.created_at, "
                "revoked_at = NULL WHERE api_tokens.revoked_at IS NOT NULL",
                [checked, hash_token(token), now],
            )
            if cursor.rowcount != 1:
                raise DuplicateTokenName(
                    f"An active API token is already named {checked!r}; revoke it first "
                    f"(`datamachine tokens revoke {checked}`) or choose another name."
                )
        return token

    def revoke(self, name: str) -> bool:
        """Revoke the active token named ``name``; False if there is none."""
        with immediate(self._db, self._lock, self._label, "revoke an API token") as conn:
            cursor = conn.execute(
                "UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                [clock.now(), name],
            )
            return cursor.rowcount == 1

    def verify(self, token: str) -> str | None:
        """The name of the active token ``token``, else None."""
        # Every issued token is ASCII; anything else (a lone surrogate from a bad header
        # decoder, which UTF-8 cannot even encode) is simply not one of ours.
        if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) \
                or not token.isascii():
            return None
        digest = hash_token(token)
        with self._lock:
            row = query_one(self._db.conn, "SELECT name, token_hash FROM api_tokens "
                                           "WHERE token_hash = ? AND revoked_at IS NULL", [digest])
        # The lookup is by hash (an attacker cannot steer it byte by byte); the constant-time
        # comparison makes the final check independent of where two hashes differ.
        if row is None or not hmac.compare_digest(str(row["token_hash"]), digest):
            return None
        return str(row["name"])

    def list(self) -> builtins.list[ApiToken]:
        """Every token, active and revoked, by name."""
        with self._lock:
            rows = query(self._db.conn,
                         "SELECT name, created_at, revoked_at FROM api_tokens ORDER BY name")
        return [ApiToken(**dict(row)) for row in rows]
