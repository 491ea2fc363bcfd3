"""API tokens for the ``/chat`` endpoint: :class:`TokenStore`.

Only the SHA-256 of a token is stored, so a copied database file grants nothing. A token is long
and random (``secrets.token_urlsafe``), which is why a fast unsalted hash is enough here (unlike
passwords, there is nothing to brute-force). The plaintext is returned once, by ``create``.

A token's *name* is the principal (DESIGN.md 20): the sessions it created, its spend windows and
its claims (``tools``, the tools it may use; ``site``, the caller site it may claim) belong to
the name. Re-issuing a revoked name is a rotation: the new token inherits what the name owned.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from datamachine.errors import DuplicateTokenName, InvalidTokenName, UsageError
from datamachine.storage._tx import (
    Connected,
    connection_lock,
    db_label,
    immediate,
    query,
    query_one,
)

__all__ = ["TOKEN_PREFIX", "TOKEN_SCOPES", "ApiToken", "TokenScope", "TokenStore",
           "check_tool_names", "hash_token"]

TOKEN_PREFIX = "dm_"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


_TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAX_TOOLS = 1000
_COLUMNS = "name, created_at, revoked_at, tools, site, scope"

TokenScope = Literal["chat", "viewer"]
TOKEN_SCOPES: tuple[str, ...] = get_args(TokenScope)


class ApiToken(BaseModel):
    """A token as listed: its name, dates and claims, never the token or its hash.

    ``tools``: the tools a caller with this token may use (None: the site's setting
    ``chat_tools``); ``site``: the caller site it may claim in ``X-Datamachine-Caller-Site``
    (None: it may claim none; it is a person's or a script's token, not another site's).
    ``scope``: ``chat``, a caller of ``/chat``; or ``viewer``, a person logging in to the run
    viewer (``/ui/``), which ``/chat`` refuses (and the viewer refuses ``chat`` tokens).
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    name: str
    created_at: float
    revoked_at: float | None
    tools: tuple[str, ...] | None = None
    site: str | None = None
    scope: TokenScope = "chat"

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


def check_tool_names(tools: object, where: str = "tools") -> tuple[str, ...]:
    """``tools`` as a tuple of distinct tool names, else :class:`UsageError` naming ``where``."""
    if isinstance(tools, str) or not isinstance(tools, Iterable):
        raise UsageError(f"{where} must be a list of tool names, got {tools!r}.")
    names = list(tools)
    if len(names) > _MAX_TOOLS:
        raise UsageError(f"{where} lists {len(names)} tools; at most {_MAX_TOOLS} are accepted.")
    for name in names:
        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
            raise UsageError(f"{where} must hold tool names (1-64 letters, digits, '_' or '-'), "
                             f"got {name!r}.")
    if len(set(names)) != len(names):
        raise UsageError(f"{where} names a tool twice: {names!r}.")
    return tuple(names)


def _row_token(row: object) -> ApiToken:
    fields = dict(row)  # type: ignore[call-overload]
    tools = fields.pop("tools", None)
    return ApiToken(**fields, tools=None if tools is None else tuple(json.loads(tools)))


class TokenStore:
    """Create, verify, revoke and list API tokens."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def create(self, name: str, *, tools: Iterable[str] | None = None,
               site: str | None = None, scope: TokenScope = "chat") -> str:
        """Make a token named ``name`` and return it (``dm_...``); it is never shown again.

        ``tools``: the only tools its callers may use (None: the setting ``chat_tools``; an
        empty list: none). ``site``: the site id of the other site this token is for, the only
        caller site its requests may claim. An active token with that name raises
        :class:`DuplicateTokenName`; a revoked one's name may be reused (the revoked row is
        replaced: a rotation, see the module docstring). ``scope="viewer"`` makes a login to the
        run viewer instead of a ``/chat`` token; it takes no ``tools`` or ``site``.
        """
        checked = _check_name(name)
        if scope not in TOKEN_SCOPES:
            raise UsageError(f"scope must be one of {', '.join(TOKEN_SCOPES)}, got {scope!r}.")
        if scope == "viewer" and (tools is not None or site is not None):
            raise UsageError("A viewer token logs a person in to /ui/; it takes no tools or "
                             "site (those are claims of a /chat token).")
        allowed = None if tools is None else check_tool_names(tools)
        if site is not None:
            from datamachine.setting_rules import check_site_id

            check_site_id(site, "site")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = clock.now()
        with immediate(self._db, self._lock, self._label, "create an API token") as conn:
            cursor = conn.execute(
                "INSERT INTO api_tokens (name, token_hash, created_at, revoked_at, tools, site, "
                "scope) VALUES (?, ?, ?, NULL, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "token_hash = excluded.token_hash, created_at = excluded.created_at, "
                "revoked_at = NULL, tools = excluded.tools, site = excluded.site, "
                "scope = excluded.scope WHERE api_tokens.revoked_at IS NOT NULL",
                [checked, hash_token(token), now,
                 None if allowed is None else json.dumps(list(allowed)), site, scope],
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
        found = self.lookup(token)
        return None if found is None else found.name

    def lookup(self, token: str) -> ApiToken | None:
        """The active token ``token`` with its claims, else None (never raises for bad input:
        a value that cannot be a token is simply not one)."""
        # Every issued token is ASCII; anything else (a lone surrogate from a bad header
        # decoder, which UTF-8 cannot even encode) is simply not one of ours.
        if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) \
                or not token.isascii():
            return None
        digest = hash_token(token)
        with self._lock:
            row = query_one(self._db.conn,
                            f"SELECT {_COLUMNS}, token_hash FROM api_tokens "
                            "WHERE token_hash = ? AND revoked_at IS NULL", [digest])
        # The lookup is by hash (an attacker cannot steer it byte by byte); the constant-time
        # comparison makes the final check independent of where two hashes differ.
        if row is None or not hmac.compare_digest(str(row["token_hash"]), digest):
            return None
        fields = dict(row)
        del fields["token_hash"]
        return _row_token(fields)

    def get(self, name: str) -> ApiToken | None:
        """The active token called ``name``, else None (the viewer checks on every request
        that the token its cookie names is still the one that logged in)."""
        if not isinstance(name, str):
            return None
        with self._lock:
            row = query_one(self._db.conn, f"SELECT {_COLUMNS} FROM api_tokens "
                                           "WHERE name = ? AND revoked_at IS NULL", [name])
        return None if row is None else _row_token(row)

    def list(self) -> builtins.list[ApiToken]:
        """Every token, active and revoked, by name."""
        with self._lock:
            rows = query(self._db.conn, f"SELECT {_COLUMNS} FROM api_tokens ORDER BY name")
        return [_row_token(row) for row in rows]
