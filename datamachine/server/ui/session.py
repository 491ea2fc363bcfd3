"""Who is looking at the run viewer: the signed cookie, the login, and CSRF.

Every visitor gets one cookie, ``dm_ui``: HttpOnly, SameSite=Strict, ``Secure`` when served
over https, signed with a key this site makes once and keeps in ``site_secrets`` (never in the
settings, which are listed and exported). It holds a random nonce and, after a login, the
viewer token's name and creation time; nothing secret. A request is logged in while that token
is still active and was made at that moment: revoking it (or rotating the name) ends every
session it opened on the next request, with no cache to expire. A session lasts at most
:data:`MAX_AGE` seconds after the login.

Signing out ends the login on the server too (``ui_logins`` keeps each open login by a hash
of its nonce): a cookie copied before is refused afterwards.

CSRF: every form carries a token derived from the nonce with the site key (HMAC), which a page
from another site can neither read nor compute; a POST whose token does not match, or whose
``Origin`` is not this server, is refused with 403 before anything happens. SameSite=Strict
already keeps the cookie off cross-site requests; the token is the check that does not depend
on the browser. Logging in starts a new nonce (no session fixation).

``--ui-open`` skips the login on loopback only: ``serve`` refuses it on any other interface,
and each request must come from a loopback address with a ``Host`` header naming one (a DNS
name pointed at 127.0.0.1 by another site, DNS rebinding, is refused).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from itsdangerous import BadSignature, URLSafeTimedSerializer

from agents_api import clock
from datamachine.errors import UsageError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from datamachine.storage.site_secrets import SiteSecretStore
    from datamachine.storage.viewer_logins import ViewerLoginStore

__all__ = ["COOKIE", "MAX_AGE", "Session", "SessionKeys", "end_login", "is_loopback_host",
           "login_open", "record_login", "site_secret"]

COOKIE = "dm_ui"
MAX_AGE = 12 * 3600
_SECRET_NAME = "ui_cookie_key"


def site_secret(store: SiteSecretStore, name: str) -> str:
    """The site's secret called ``name``, made (32 random bytes, hex) and stored on first use;
    one transaction, so hosts starting together on one database agree on one."""
    return store.get_or_create(name, lambda: secrets.token_hex(32))


@dataclass(frozen=True, slots=True)
class Session:
    """One visitor: ``nonce`` (what its CSRF token is made from), and the viewer token it
    logged in with (``token_name`` and that token's ``token_created_at``), if any."""

    nonce: str
    token_name: str | None = None
    token_created_at: float | None = None
    fresh: bool = False  # made for this request: the response must set the cookie


class SessionKeys:
    """Signs and reads the cookie and makes CSRF tokens, with the site's key (kept in
    ``site_secrets``)."""

    def __init__(self, site_secrets: SiteSecretStore) -> None:
        key = site_secret(site_secrets, _SECRET_NAME)
        self._key = bytes.fromhex(key)
        self._serializer = URLSafeTimedSerializer(key, salt="datamachine-ui-session")

    def read(self, request: Request) -> Session:
        """The request's session, or a fresh one (no or a bad, expired or forged cookie)."""
        raw = request.cookies.get(COOKIE)
        if raw:
            try:
                data: Any = self._serializer.loads(raw, max_age=MAX_AGE)
            except BadSignature:  # also SignatureExpired
                data = None
            if isinstance(data, dict) and isinstance(data.get("n"), str):
                name, made = data.get("t"), data.get("c")
                if isinstance(name, str) and isinstance(made, int | float):
                    return Session(data["n"], name, float(made))
                return Session(data["n"])
        return Session(secrets.token_urlsafe(16), fresh=True)

    def login(self, token_name: str, token_created_at: float) -> Session:
        """A new session for a viewer token (a new nonce: the old one is never reused)."""
        return Session(secrets.token_urlsafe(16), token_name, token_created_at, fresh=True)

    def store(self, response: Response, session: Session | None, *, secure: bool) -> None:
        """Set the cookie of ``session`` on ``response`` (None: delete it)."""
        if session is None:
            response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict",
                                   secure=secure)
            return
        data: dict[str, Any] = {"n": session.nonce}
        if session.token_name is not None:
            data.update(t=session.token_name, c=session.token_created_at)
        response.set_cookie(COOKIE, self._serializer.dumps(data), max_age=MAX_AGE, path="/ui",
                            httponly=True, samesite="strict", secure=secure)

    def csrf(self, session: Session) -> str:
        """The CSRF token of ``session``'s forms."""
        return hmac.new(self._key, b"csrf:" + session.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: Session, given: object) -> bool:
        """Whether ``given`` (a form's field) is ``session``'s CSRF token."""
        return isinstance(given, str) and hmac.compare_digest(given, self.csrf(session))


def _login_id(session: Session) -> str:
    return hashlib.sha256(b"login:" + session.nonce.encode()).hexdigest()


def record_login(logins: ViewerLoginStore, session: Session) -> None:
    """Store ``session``'s login as open (and forget logins past their age)."""
    if session.token_name is None:
        raise UsageError("Only a session logged in with a viewer token has a login to record "
                         "(SessionKeys.login makes one).")
    logins.record(_login_id(session), session.token_name, max_age=MAX_AGE)


def login_open(logins: ViewerLoginStore, session: Session) -> bool:
    """Whether ``session``'s login is stored, not signed out, and younger than MAX_AGE."""
    login = logins.get(_login_id(session))
    return (login is not None and login.ended_at is None
            and login.token_name == session.token_name
            and login.created_at >= clock.now() - MAX_AGE)


def end_login(logins: ViewerLoginStore, session: Session) -> None:
    """Sign ``session`` out on the server: its cookie, even copied, opens nothing more."""
    logins.end(_login_id(session), session.token_name)


def is_loopback_host(name: str) -> bool:
    """Whether ``name`` (a bind address or a ``Host`` header's name, no port) is loopback."""
    name = name.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
