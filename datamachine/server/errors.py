"""JSON error responses: every non-2xx answer of the server is ``{code, message, data}``.

Errors are converted to HTTP only here, at the edge (DESIGN.md section 9): the rest of the
package raises :class:`datamachine.errors.DataMachineError` subclasses, or a :class:`Problem`
when the answer is HTTP-specific (a missing token, a body too large to read).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from agents_api.jsontext import compact_json
from datamachine.errors import (
    ChainCycle,
    ChainDepthExceeded,
    ChatSessionNotFound,
    DataMachineError,
    InvalidCallerContext,
    ModelRequestsDisabled,
    RequestTooLarge,
    SessionAborted,
    SessionAwaitingConfirmation,
    SessionNotPaused,
    SiteMisconfigured,
    TranscriptNotFound,
    UsageError,
)

if TYPE_CHECKING:
    from datamachine.conversation.result import ConversationResult
    from datamachine.host import Host

__all__ = ["SESSION_NOT_FOUND_MESSAGE", "Problem", "Redactor", "error_response", "problem_for"]

# The same words for an unknown session and another token's: a caller learns nothing of it.
SESSION_NOT_FOUND_MESSAGE = ("No chat session with that id is open to this token; send no "
                             "session_id to start a new one.")


class Problem(Exception):
    """An HTTP error answer: status, machine-readable ``code``, a message that says what to do,
    optional ``data`` and extra response headers."""

    def __init__(self, status: int, code: str, message: str, data: Mapping[str, Any] | None = None,
                 *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.data: dict[str, Any] = dict(data or {})
        self.headers: dict[str, str] = dict(headers or {})

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        """The JSON response for this problem (``headers`` added to its own)."""
        return error_response(self.status, self.code, self.message, self.data,
                              headers={**self.headers, **(headers or {})})


def error_response(status: int, code: str, message: str, data: Mapping[str, Any] | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """A ``{code, message, data}`` JSON response."""
    return JSONResponse({"code": code, "message": message, "data": dict(data or {})},
                        status_code=status, headers=dict(headers or {}))


def problem_for(exc: DataMachineError) -> Problem:
    """The HTTP answer for a product error raised while serving a request."""
    if isinstance(exc, ChainDepthExceeded):
        return Problem(
            429, "datamachine_chain_depth_exceeded", str(exc),
            {"chain_id": exc.chain_id, "chain_depth": exc.chain_depth, "ceiling": exc.ceiling,
             "retry_after": exc.retry_after},
            headers={"Retry-After": str(exc.retry_after)},
        )
    if isinstance(exc, ChainCycle):
        return Problem(409, "datamachine_chain_cycle", str(exc),
                       {"chain_id": exc.chain_id, "site_id": exc.site_id,
                        "chain_sites": list(exc.chain_sites)})
    if isinstance(exc, InvalidCallerContext):
        return Problem(400, "invalid_header", str(exc), {"header": exc.header})
    if isinstance(exc, RequestTooLarge):
        return Problem(413, "request_too_large", str(exc), {"max_request_bytes": exc.limit})
    if isinstance(exc, SessionAborted):
        return Problem(409, "session_aborted", str(exc))
    if isinstance(exc, SessionAwaitingConfirmation):
        return Problem(409, "session_awaiting_confirmation", str(exc),
                       {"session_id": exc.session_id, "pending": exc.pending})
    if isinstance(exc, SessionNotPaused):
        return Problem(409, "session_not_paused", str(exc),
                       {"session_id": exc.session_id, "status": exc.status})
    if isinstance(exc, ChatSessionNotFound | TranscriptNotFound):
        return Problem(404, "session_not_found", SESSION_NOT_FOUND_MESSAGE)
    if isinstance(exc, SiteMisconfigured):
        # The details (and the fix) are the operator's: the server log has them.
        return Problem(503, "site_misconfigured",
                       f"This site is misconfigured (setting {exc.setting!r}) and cannot run "
                       "requests until its operator fixes it; try again later.",
                       {"setting": exc.setting}, headers={"Retry-After": "60"})
    if isinstance(exc, ModelRequestsDisabled):
        # The site's setting, not the caller's fault: a test or staging server on purpose.
        return Problem(503, "model_requests_disabled",
                       "Model requests are off on this site (setting allow_model_requests).",
                       {"provider": exc.provider})
    if isinstance(exc, UsageError):
        # As a body the request model refuses: each field at fault, null when the error names
        # no single one.
        return Problem(422, "invalid_request", str(exc),
                       {"errors": [{"field": exc.field, "message": str(exc)}]})
    return Problem(500, "internal_error",
                   f"The server failed ({type(exc).__name__}); its log has the details.")


class Redactor:
    """Takes this server's file paths out of error answers (DESIGN.md 20).

    A remote caller has no use for where the database lives or where Python is installed, and
    an attacker a great deal. A path is replaced by ``<server path>`` in the JSON text of every
    error body, only where it stands as a whole path (followed by ``/``, a quote, a space, the
    end...), and never where the caller itself sent it: an answer that echoes the caller's
    text is not an oracle for guessing the server's paths. Successful answers (the
    conversation itself) are left as they are.
    """

    PLACEHOLDER = "<server path>"

    def __init__(self, paths: list[str]) -> None:
        unique = {p.rstrip("/") for p in paths if p and len(p.rstrip("/")) >= 4}
        self._paths = sorted(unique, key=len, reverse=True)
        self._patterns = {
            path: re.compile(r"(?<![\w.-])" + re.escape(path) + r"(?=$|[/\\\s\"'`:;,)\]}])")
            for path in self._paths}

    @classmethod
    def for_host(cls, host: Host) -> Redactor:
        """The paths ``host`` could leak: its database and folder, the working directory,
        the home directory and Python's installation."""
        paths = [os.getcwd(), str(Path.home()), sys.prefix, sys.base_prefix,
                 sys.exec_prefix]
        if host.db_path is not None:
            db = Path(host.db_path)
            paths += [str(db), str(db.parent), str(db.resolve()), str(db.resolve().parent)]
        return cls(paths)

    def __call__(self, text: str, caller_text: str = "") -> str:
        """``text`` without any of the paths (except those in ``caller_text``)."""
        for path in self._paths:
            if path in text and path not in caller_text:
                text = self._patterns[path].sub(self.PLACEHOLDER, text)
        return text

    def redact_bytes(self, data: bytes, caller_text: str = "") -> bytes:
        """:meth:`__call__` on UTF-8 bytes (an SSE frame)."""
        return self(data.decode(), caller_text).encode()

    def response(self, problem: Problem, headers: Mapping[str, str] | None = None,
                 caller_text: str = "") -> Response:
        """``problem``'s JSON answer, redacted."""
        return self.error(problem.status, problem.code, problem.message, problem.data,
                          {**problem.headers, **(headers or {})}, caller_text)

    def error(self, status: int, code: str, message: str, data: Mapping[str, Any] | None,
              headers: Mapping[str, str] | None = None, caller_text: str = "") -> Response:
        """A redacted ``{code, message, data}`` JSON response."""
        body = compact_json({"code": code, "message": message, "data": dict(data or {})})
        return Response(self(body, caller_text), status_code=status,
                        headers=dict(headers or {}), media_type="application/json")

    def result_response(self, result: ConversationResult,
                        headers: Mapping[str, str] | None = None,
                        caller_text: str = "") -> Response:
        """The answer for a finished run; a non-2xx one redacted (see ``result_response``)."""
        from datamachine.server.app import result_response

        response = result_response(result, dict(headers or {}))
        if response.status_code < 300:
            return response
        redacted = self(bytes(response.body).decode(), caller_text)
        return Response(redacted, status_code=response.status_code,
                        headers={k: v for k, v in response.headers.items()
                                 if k.lower() not in ("content-length", "content-type")},
                        media_type="application/json")
