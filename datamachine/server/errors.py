"""JSON error responses: every non-2xx answer of the server is ``{code, message, data}``.

Errors are converted to HTTP only here, at the edge (DESIGN.md section 9): the rest of the
package raises :class:`datamachine.errors.DataMachineError` subclasses, or a :class:`Problem`
when the answer is HTTP-specific (a missing token, a body too large to read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from datamachine.errors import (
    ChainCycle,
    ChainDepthExceeded,
    ChatSessionNotFound,
    DataMachineError,
    InvalidCallerContext,
    RequestTooLarge,
    SessionAborted,
    SessionAwaitingConfirmation,
    SessionNotPaused,
    TranscriptNotFound,
    UsageError,
)

__all__ = ["Problem", "error_response", "problem_for"]


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
        return Problem(404, "session_not_found", str(exc))
    if isinstance(exc, UsageError):
        return Problem(422, "invalid_request", str(exc))
    return Problem(500, "internal_error", f"{type(exc).__name__}: {exc}")
