"""Bearer-token authentication for ``/chat``.

Tokens are made with ``datamachine tokens create NAME`` and stored hashed
(:class:`datamachine.storage.tokens.TokenStore`); the store looks a token up by its hash and
compares in constant time. Verification reads the database on every request, so a revoked token
stops working on the very next call, with no cache to expire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from datamachine.server.errors import Problem

if TYPE_CHECKING:
    from datamachine.host import Host
    from datamachine.storage.tokens import ApiToken

__all__ = ["UNAUTHORIZED_CODE", "authenticate", "bearer_token"]

UNAUTHORIZED_CODE = "datamachine_unauthorized"
# Far longer than any token the store issues; a header beyond it is not worth hashing.
_MAX_TOKEN_LENGTH = 512


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_LENGTH:
        return None
    return token


def authenticate(host: Host, authorization: str | None) -> ApiToken:
    """The active token in ``authorization``, with its claims; else a 401 :class:`Problem`.

    Missing, malformed, unknown and revoked tokens get the same answer, so a caller learns
    nothing about which tokens exist.
    """
    token = bearer_token(authorization)
    found = host.tokens.lookup(token) if token is not None else None
    if found is None or found.scope != "chat":  # a viewer token logs in to /ui/ only
        raise Problem(
            401, UNAUTHORIZED_CODE,
            "Missing, invalid or revoked bearer token. Send 'Authorization: Bearer <token>' with "
            "a token from `datamachine tokens create NAME` on this site.",
            headers={"WWW-Authenticate": 'Bearer realm="datamachine"'},
        )
    return found
