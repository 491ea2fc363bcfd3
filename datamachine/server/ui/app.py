"""The run viewer: ``/ui/`` of ``datamachine serve`` (DESIGN.md 17, docs/viewer.md).

Server-rendered pages (Jinja2, every value escaped), no JavaScript, nothing loaded from the
network: one stylesheet served here, bars drawn as inline SVG. The Content-Security-Policy
allows no script at all and styles only from this server, so even a value that escaped the
escaping could not run. Reads and ``resume`` run in a worker thread, as ``/chat``'s runs do:
the stores block, and a resumed run may call a model for a long time.

Pages: the runs list (``/ui/``: filters, keyset pages), one run (``/ui/run?id=<id>``), the login
(``/ui/login``). Forms that change anything (login, logout, approve or decline a paused run)
are POSTs checked for CSRF first (:mod:`datamachine.server.ui.session`).
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

import anyio.to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from datamachine.errors import (
    CallNotInDoubt,
    ChatSessionNotFound,
    DataMachineError,
    SessionNotPaused,
    TranscriptNotFound,
    UsageError,
)
from datamachine.server.ui import present
from datamachine.server.ui.request_rows import request_rows
from datamachine.server.ui.session import (
    Session,
    SessionKeys,
    end_login,
    is_loopback_host,
    login_open,
    record_login,
)
from datamachine.storage.site_secrets import SiteSecretStore
from datamachine.storage.transcripts import TRANSCRIPT_STATUSES, TranscriptSummary
from datamachine.storage.viewer_logins import ViewerLoginStore

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["MESSAGES_SHOWN", "PAGE_SIZE", "RunViewer"]

logger = logging.getLogger("datamachine.server.ui")

PAGE_SIZE = 50
# The most messages one run's page shows (a longer transcript says how many were left out).
MESSAGES_SHOWN = 2000
_MAX_FORM_BYTES = 16 * 1024
_HERE = Path(__file__).parent
_CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'")
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
                  "x-real-ip")
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
            "Cache-Control": "no-store"}


class _Refused(Exception):
    """A request the viewer answers with an error page (status, message, and a page to go
    back to)."""

    def __init__(self, status: int, message: str, back: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.back = back


class RunViewer:
    """The ``/ui`` routes of one host. ``open_access``: no login (``--ui-open``; loopback
    only, checked on every request)."""

    def __init__(self, host: Host, *, open_access: bool = False) -> None:
        self.host = host
        self.open_access = open_access
        self.logins = ViewerLoginStore(host.handle)
        self.keys = SessionKeys(SiteSecretStore(host.handle))
        self.templates = Environment(loader=FileSystemLoader(_HERE / "templates"),
                                     autoescape=select_autoescape(default=True),
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.globals["quote"] = lambda value: quote(str(value), safe="")
        self.templates.globals["shell_quote"] = shlex.quote
        self.stylesheet = (_HERE / "viewer.css").read_bytes()
        self._origin: str | None = None  # the setting viewer_origin, as last read

    def routes(self) -> list[Route]:
        """The routes, to mount under ``/ui``."""
        return [
            Route("/", self.runs, methods=["GET"]),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            # The id goes in the query, never the path: an id may hold "/" or be "..".
            Route("/run", self.run_page, methods=["GET"]),
            Route("/resume", self.resume, methods=["POST"]),
            Route("/resolve", self.resolve, methods=["POST"]),
            Route("/viewer.css", self.css, methods=["GET"]),
            Route("/favicon.ico", self.no_icon, methods=["GET"]),
        ]

    # -- plumbing ---------------------------------------------------------------------------
    def _page(self, request: Request, session: Session, template: str, code: int = 200,
              *, signed_in: bool = True, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            csrf=self.keys.csrf(session), viewer=session.token_name if signed_in else None,
            open_access=self.open_access, **context)
        response = HTMLResponse(html, status_code=code, headers=_HEADERS)
        if session.fresh:
            self.keys.store(response, session, secure=self._secure(request))
        return response

    def _read_public_origin(self) -> None:
        """Read the setting ``viewer_origin`` (in a worker thread: it reads the database) for
        the checks of this request, which run on the event loop."""
        value = self.host.settings.get("viewer_origin")
        self._origin = _origin_of(value) if isinstance(value, str) else None

    def _public_origin(self) -> str | None:
        return self._origin

    def _secure(self, request: Request) -> bool:
        """Whether the cookie is ``Secure``: the request came over https, or people open the
        viewer at an https origin (a reverse proxy ends TLS before this server)."""
        origin = self._public_origin()
        return request.url.scheme == "https" or (origin or "").startswith("https:")

    def _redirect(self, request: Request, session: Session | None, to: str,
                  *, store: bool = False) -> Response:
        response = RedirectResponse(to, status_code=303, headers=_HEADERS)
        if store or (session is not None and session.fresh):
            self.keys.store(response, session, secure=self._secure(request))
        return response

    def _check_open(self, request: Request) -> None:
        """An open viewer answers loopback only, to a Host header that names loopback, and
        never through a proxy (which would make every visitor look like loopback)."""
        if any(name in request.headers for name in _PROXY_HEADERS):
            raise _Refused(403, "This run viewer is open on loopback only (--ui-open), and this "
                                "request came through a proxy. Behind a proxy, serve it with a "
                                "login: `datamachine tokens create NAME --viewer`.")
        client = request.client.host if request.client else ""
        if not is_loopback_host(client) or not is_loopback_host(
                _host_name(request.headers.get("host", ""))):
            raise _Refused(403, "This run viewer is open on loopback only (--ui-open): open "
                                "it as http://127.0.0.1 or http://localhost on this machine.")

    def _visitor(self, request: Request) -> tuple[Session, bool]:
        """The request's session, and whether it may see the runs (runs in a worker thread:
        a logged-in session's token is checked in the database every time)."""
        self._read_public_origin()
        if self.open_access:
            self._check_open(request)
        session = self.keys.read(request)
        if self.open_access:
            return session, True
        if session.token_name is None:
            return session, False
        token = self.host.tokens.get(session.token_name)
        allowed = (token is not None and token.scope == "viewer"
                   and token.created_at == session.token_created_at
                   and login_open(self.logins, session))
        return session, allowed

    async def _form(self, request: Request, session: Session) -> dict[str, str]:
        """The POSTed form, after the CSRF checks (403 :class:`_Refused` else)."""
        origin = request.headers.get("origin")
        if origin is not None and _origin_of(origin) not in (
                _origin_of(f"{request.url.scheme}://{request.url.netloc}"),
                self._public_origin()):
            raise _Refused(403, "Refused: this form was sent from another site (behind a "
                                "reverse proxy, set the setting viewer_origin to the address "
                                "people open the viewer at).")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > _MAX_FORM_BYTES:
            raise _Refused(413, "Refused: the form is too large.")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                raise _Refused(413, "Refused: the form is too large.")
        try:
            parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
        except (UnicodeDecodeError, ValueError):
            raise _Refused(400, "Refused: the form could not be read.") from None
        form = {key: values[0] for key, values in parsed.items()}
        if session.fresh or not self.keys.csrf_ok(session, form.get("csrf")):
            raise _Refused(403, "Refused: the form's security token is missing or stale "
                                "(CSRF). Reload the page and send it again.")
        return form

    async def _guard(self, request: Request, action: Any) -> Response:
        """Run ``action(session)`` for a visitor who may see the runs; else the login page."""
        try:
            session, allowed = await anyio.to_thread.run_sync(self._visitor, request)
            if not allowed and request.method == "POST":
                raise _Refused(403, "Refused: sign in to the run viewer first.")
            if not allowed:
                target = request.url.path + (f"?{request.url.query}" if request.url.query
                                             else "")
                return self._redirect(request, session, "/ui/login?" + urlencode(
                    {"next": target}))
            response: Response = await action(session)
            return response
        except _Refused as refused:
            return self._error(request, refused.status, refused.message, refused.back)

    def _error(self, request: Request, status: int, message: str,
               back: str | None = None) -> HTMLResponse:
        html = self.templates.get_template("error.html").render(
            status=status, message=message, viewer=None, open_access=self.open_access,
            csrf="", back=back)
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    async def css(self, request: Request) -> Response:
        """The one stylesheet."""
        return Response(self.stylesheet, media_type="text/css",
                        headers={"Cache-Control": "max-age=3600",
                                 "X-Content-Type-Options": "nosniff"})

    async def no_icon(self, request: Request) -> Response:
        """No icon (browsers ask for one; an empty answer keeps their consoles quiet)."""
        return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})

    # -- login ------------------------------------------------------------------------------
    async def login_page(self, request: Request) -> Response:
        """The login form (straight to the runs when no login is needed)."""
        try:
            session, allowed = await anyio.to_thread.run_sync(self._visitor, request)
        except _Refused as refused:
            return self._error(request, refused.status, refused.message)
        if allowed:
            return self._redirect(request, session, _safe_next(request.query_params.get("next")))
        return self._page(request, session, "login.html", signed_in=False,
                          next=_safe_next(request.query_params.get("next")), error=None)

    async def login(self, request: Request) -> Response:
        """Check a viewer token once; a good one gets a new signed session cookie."""
        try:
            session, _ = await anyio.to_thread.run_sync(self._visitor, request)
            form = await self._form(request, session)
        except _Refused as refused:
            return self._error(request, refused.status, refused.message)
        target = _safe_next(form.get("next"))
        token = await anyio.to_thread.run_sync(self.host.tokens.lookup,
                                               form.get("token", "").strip())
        if token is None or token.scope != "viewer":
            error = ("That is a /chat token; the viewer takes a viewer token, made with: "
                     "datamachine tokens create NAME --viewer" if token is not None else
                     "That is not an active viewer token. Make one on this site with: "
                     "datamachine tokens create NAME --viewer")
            return self._page(request, session, "login.html", code=401, signed_in=False,
                              next=target, error=error)
        logger.info("datamachine: run viewer login by token %r", token.name)
        signed_in = self.keys.login(token.name, token.created_at)
        await anyio.to_thread.run_sync(record_login, self.logins, signed_in)
        return self._redirect(request, signed_in, target, store=True)

    async def logout(self, request: Request) -> Response:
        """Forget the session (the cookie is deleted): its CSRF token is all it needs, so a
        session whose token was revoked meanwhile can still sign out."""
        try:
            session, _ = await anyio.to_thread.run_sync(self._visitor, request)
            await self._form(request, session)
        except _Refused as refused:
            return self._error(request, refused.status, refused.message)
        if session.token_name is not None:
            await anyio.to_thread.run_sync(end_login, self.logins, session)
        return self._redirect(request, None, "/ui/login", store=True)

    # -- pages ------------------------------------------------------------------------------
    async def runs(self, request: Request) -> Response:
        """The runs list: newest first, filtered, one page at a time."""
        async def action(session: Session) -> Response:
            params = request.query_params
            status: Any = params.get("status") or None
            mode = params.get("mode") or None
            text = (params.get("q") or "").strip() or None
            after = params.get("after") or None
            if status is not None and status not in TRANSCRIPT_STATUSES:
                raise _Refused(400, f"Unknown status {status!r}.")
            try:
                page = await anyio.to_thread.run_sync(lambda: self.host.transcripts.page(
                    limit=PAGE_SIZE, status=status, mode=mode, text=text, after=after))
            except UsageError as exc:
                raise _Refused(400, str(exc)) from None
            filters = {key: value for key, value in
                       (("status", status), ("mode", mode), ("q", text)) if value}
            older = ("?" + urlencode({**filters, "after": page.next})
                     if page.next is not None else None)
            return self._page(request, session, "runs.html",
                              rows=[_row_or_damaged(item) for item in page.items],
                              statuses=TRANSCRIPT_STATUSES, modes=sorted(self.host.modes),
                              status=status or "", mode=mode or "", q=text or "",
                              older=older, paged=after is not None,
                              newest="?" + urlencode(filters) if filters else "./")
        return await self._guard(request, action)

    def _run_context(self, session_id: str) -> dict[str, Any]:
        store = self.host.transcripts
        try:
            summary = store.summary(session_id)
            numbered = store.numbered(session_id, limit=MESSAGES_SHOWN)
        except TranscriptNotFound:
            raise _Refused(404, f"No run is stored under {session_id!r}.") from None
        except UsageError as exc:
            raise _Refused(400, str(exc)) from None
        except DataMachineError as exc:  # a damaged row: logged whole, never a bare 500
            logger.warning("datamachine: run viewer cannot show %r: %s", session_id, exc)
            raise _Refused(500, "This run's stored row is damaged and cannot be shown; the "
                                "server's log says why.") from None
        try:
            chat = self.host.chat_sessions.get(session_id)
        except (ChatSessionNotFound, UsageError):
            chat = None
        marks = store.timeline(session_id)
        requests = request_rows(store.requests(session_id))
        result = summary.result
        pending = result.get("pending") if summary.status == "awaiting_confirmation" else None
        verdict = {key: result[key] for key in (
            "status", "completed", "budget", "flags", "warning", "error", "error_code",
            "completion_nudge_count", "completion_assertions_missing", "blocker",
            "warnings") if result.get(key) not in (None, [], {}, "")}
        if pending is not None:
            verdict.pop("warning", None)  # it tells a program how to resume: the card does
        return {
            "run": _row_or_damaged(summary), "summary": summary, "chat": chat,
            "turns": present.timeline(numbered, marks,
                                      complete=len(numbered) >= summary.message_count),
            "left_out": max(0, summary.message_count - len(numbered)),
            "requests": requests,
            "pending": present.pending_view(pending),
            "missing_tools": self._missing_tools(session_id, pending),
            "verdict": verdict,
            "final": result.get("final_content") or "",
        }

    def _missing_tools(self, session_id: str, pending: object) -> list[str]:
        """The paused run's tools this process cannot offer again (resuming would fail)."""
        if not isinstance(pending, dict) or not isinstance(pending.get("tools"), list):
            return []
        from datamachine.conversation.pausing import paused_runs

        kept = paused_runs(self.host).get(session_id, pending.get("pause_id"))
        if kept is not None:
            return []
        known = set(self.host.tools.names())
        return sorted(str(name) for name in pending["tools"] if name not in known)

    async def run_page(self, request: Request) -> Response:
        """One run: its verdict, budgets, its provider requests and the timeline of its
        turns."""
        session_id = request.query_params.get("id", "")

        async def action(session: Session) -> Response:
            context = await anyio.to_thread.run_sync(self._run_context, session_id)
            notice = {"approved": "Approved: the run went on.",
                      "declined": "Declined: the run was told no.",
                      "resolved": "Recorded: the call is settled and the run went on."}.get(
                request.query_params.get("answered", ""))
            return self._page(request, session, "run.html", notice=notice, **context)
        return await self._guard(request, action)

    async def resume(self, request: Request) -> Response:
        """Approve or decline a paused run (``host.resume``), then show it again."""
        async def action(session: Session) -> Response:
            form = await self._form(request, session)
            session_id = form.get("id", "")
            if not session_id:
                raise _Refused(400, "The form names no run (id).")
            try:
                return await self._answer(request, session, session_id, form.get("answer"),
                                          form.get("pause") or None)
            except _Refused as refused:
                raise _Refused(refused.status, refused.message,
                               "/ui/run?" + urlencode({"id": session_id})) from None
        return await self._guard(request, action)

    async def resolve(self, request: Request) -> Response:
        """Say what a call in doubt did (``host.resolve``), then show the run again."""
        async def action(session: Session) -> Response:
            form = await self._form(request, session)
            session_id, call_id = form.get("id", ""), form.get("call", "")
            result = (form.get("result") or "").strip()
            back = "/ui/run?" + urlencode({"id": session_id})
            if not session_id or not call_id:
                raise _Refused(400, "The form names no run (id) or no call (call).")
            if not result:
                raise _Refused(400, "Say what the call did (result).", back)
            who = session.token_name or "the open viewer"
            try:
                answered = await anyio.to_thread.run_sync(
                    lambda: self.host.resolve(session_id, call_id, result))
            except CallNotInDoubt:
                raise _Refused(409, "That call is not in doubt any more (its result was "
                                    "recorded already). Nothing was done: look at the run "
                                    "again.", back) from None
            except TranscriptNotFound:
                raise _Refused(404, f"No run is stored under {session_id!r}.") from None
            except DataMachineError as exc:
                raise _Refused(409, f"The call could not be recorded: {exc}", back) from None
            if answered.status == "transcript_lock_contention":
                raise _Refused(409, "Someone else is answering or running this session "
                                    "right now; nothing was done. Reload the run in a "
                                    "moment.", back)
            logger.info("datamachine: run viewer: %s recorded what call %r of %r did; the "
                        "run ended %s", who, call_id, session_id, answered.status)
            return self._redirect(request, session, "/ui/run?" + urlencode(
                {"id": session_id, "answered": "resolved"}))
        return await self._guard(request, action)

    async def _answer(self, request: Request, session: Session, session_id: str,
                      answer: str | None, pause_id: str | None) -> Response:
        """``host.resume`` with a person's answer to the pause they saw (``pause_id``); a
        redirect to the run after it."""
        if answer not in ("approve", "decline"):
            raise _Refused(400, "answer must be approve or decline.")
        who = session.token_name or "the open viewer"
        try:
            result = await anyio.to_thread.run_sync(
                lambda: self.host.resume(session_id, answer == "approve", pause_id=pause_id))
        except SessionNotPaused:
            logger.info("datamachine: run viewer: %s's %s of %r came too late (not paused "
                        "there any more)", who, answer, session_id)
            raise _Refused(409, "This run is not waiting for that answer any more (it was "
                                "answered already, or paused again with a new question, or "
                                "never paused). Nothing was done: look at it again.") from None
        except TranscriptNotFound:
            raise _Refused(404, f"No run is stored under {session_id!r}.") from None
        except UsageError as exc:
            missing = "tools this process does not have" in str(exc)
            raise _Refused(409, (
                "This site cannot answer the run: it paused with tools this site does "
                "not register. Answer it from the program that ran it, or install the "
                f"plugin that registers them. ({exc})") if missing else
                f"The run could not be resumed: {exc}") from None
        except DataMachineError as exc:
            raise _Refused(409, f"The run could not be resumed: {exc}") from None
        if result.status == "transcript_lock_contention":
            raise _Refused(409, "Someone else is answering or running this session right "
                                "now; nothing was done. Reload the run in a moment.")
        answered = "approved" if answer == "approve" else "declined"
        logger.info("datamachine: run viewer: %s %s the paused run %r; it ended %s", who,
                    answered, session_id, result.status)
        return self._redirect(request, session, "/ui/run?" + urlencode(
            {"id": session_id, "answered": answered}))


def _row_or_damaged(summary: TranscriptSummary) -> present.RunRow:
    """The list's line of a run; a row whose values the viewer cannot show (written by hand,
    by an older bug) is a line saying so, never a failed page."""
    try:
        return present.run_row(summary)
    except (TypeError, ValueError, OverflowError, AttributeError) as exc:
        logger.warning("datamachine: run viewer cannot show the transcript %r: %s",
                       summary.id, exc)
        return present.damaged_row(summary.id, summary.status)


def _origin_of(url: str) -> str | None:
    """``url``'s origin as a browser sends it: lower-case scheme and host, the port only when
    it is not the scheme's default (None for a value that is not an http(s) origin)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def _host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8000`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _safe_next(target: str | None) -> str:
    """Where to go after the login: a path of this viewer only (never another site)."""
    if not target or not target.startswith("/ui/") or target.startswith("//") \
            or "\\" in target:
        return "/ui/"
    return target
