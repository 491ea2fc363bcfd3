"""The Starlette app: ``POST /chat`` and ``GET /health``, and :func:`serve` to run it.

Order of checks on ``/chat``, cheapest refusal first and all before any work: the bearer token
(401), the site's own settings (503 ``site_misconfigured``), the caller-context headers (400
naming the header, 403 for a claim the token may not make), the token's rate and concurrency
limits (429 with ``Retry-After``), a cycle (409), the chain depth (429), the body size (413), the
body itself (400 malformed JSON, 422 naming the field), a spent spend window (429 with
``Retry-After``), the session (404 unknown or another token's, 409 aborted or busy). Only then
does a conversation run, with the tools the token may reach, in a worker thread: the
host's SQLite connection is shared and its stores serialize on a lock, and a run's tools may
block on HTTP (a call to another site that may call back here), which must never stall the
event loop that would answer the call back.

The HTTP status of a run follows DESIGN.md 5.5a: ``completed``, ``incomplete`` and
``budget_exceeded`` are 200 with the result; ``aborted`` and ``transcript_lock_contention`` are
409; ``error`` is 422 for the preflight ``completion_required_tool_unavailable``, 409
``session_lock_lost`` for a run whose session was taken over (``transcript_lock_lost``), 503 for
a transcript that could not be written, else 502. A
non-2xx run answer is the usual ``{code, message, data}`` with the whole result as ``data``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

from agents_api.jsontext import compact_json
from datamachine.errors import DataMachineError, RequestTooLarge, UsageError
from datamachine.server.access import check_claims, reachable_tools
from datamachine.server.auth import authenticate
from datamachine.server.chain import (
    HEADER_CHAIN_DEPTH,
    HEADER_CHAIN_ID,
    CallerContext,
    admit,
    parse_caller_headers,
)
from datamachine.server.errors import Problem, Redactor, error_response, problem_for
from datamachine.server.schemas import ChatRequest, describe_validation_error
from datamachine.server.sessions import ChatTurn, require_owner, run_chat_turn
from datamachine.server.site import bound_host, check_site, ensure_site_id, max_request_bytes
from datamachine.server.spend import refuse_if_spent
from datamachine.server.throttle import Slot, TokenThrottle

if TYPE_CHECKING:
    from datamachine.conversation.result import ConversationResult
    from datamachine.host import Host
    from datamachine.tools import Tool

__all__ = ["create_app", "result_response", "serve"]

logger = logging.getLogger("datamachine.server")

_OK_STATUSES = frozenset({"completed", "incomplete", "budget_exceeded", "awaiting_confirmation"})
PREFLIGHT_ERROR_CODE = "completion_required_tool_unavailable"


def result_response(result: ConversationResult, headers: dict[str, str] | None = None
                    ) -> JSONResponse:
    """The HTTP answer for a finished run (DESIGN.md 5.5a)."""
    body = result.model_dump(mode="json")
    status = result.status
    if status in _OK_STATUSES:
        return JSONResponse(body, headers=headers)
    message = result.error or result.warning or f"The run ended with status {status!r}."
    if status == "aborted":
        return error_response(409, "session_aborted", message, body, headers)
    if status == "transcript_lock_contention":
        return error_response(409, "session_lock_contention", message, body, headers)
    if result.error_code == PREFLIGHT_ERROR_CODE:
        return error_response(422, PREFLIGHT_ERROR_CODE, message, body, headers)
    if result.error_code == "transcript_lock_lost":
        # Another request took the session over mid-run: a conflict, not the provider's fault.
        return error_response(409, "session_lock_lost", message, body, headers)
    if result.error_code == "transcript_write_failed":
        return error_response(503, "transcript_write_failed", message, body, headers)
    return error_response(502, "provider_error", message, body, headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing one over ``limit`` bytes without reading past the limit.

    A declared ``Content-Length`` over the limit is refused before reading anything; a body
    without one (chunked) or that lies about it is cut off as soon as it passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise Problem(400, "invalid_header",
                          f"Content-Length must be a whole number, got {declared[:40]!r}.",
                          {"header": "Content-Length"})
        if int(declared) > limit:
            raise _too_large(limit)
    received = bytearray()
    async for chunk in request.stream():
        received += chunk
        if len(received) > limit:
            raise _too_large(limit)
    return bytes(received)


def _too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than this site accepts ({limit:,} bytes, setting "
        "'max_request_bytes'); send a shorter conversation.", limit=limit)


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a ``/chat`` body: 400 for malformed JSON, 422 naming the field otherwise."""
    try:
        return ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        malformed, problems = describe_validation_error(exc)
        data = {"errors": [p.model_dump() for p in problems]}
        if malformed:
            raise Problem(400, "invalid_json",
                          f"The body is not valid JSON: {problems[0].message.rstrip('.')}.",
                          data) from None
        summary = "; ".join(f"{p.field}: {p.message.rstrip('.')}" for p in problems)
        raise Problem(422, "invalid_request", f"Invalid request body: {summary}.", data) from None


class _Admitted:
    """What the checks before the body established about one request."""

    __slots__ = ("caller", "limit", "slot", "token_name", "tools")

    def __init__(self, caller: CallerContext, limit: int, token_name: str,
                 tools: dict[str, Tool], slot: Slot) -> None:
        self.caller = caller
        self.limit = limit
        self.token_name = token_name
        self.tools = tools
        self.slot = slot


class _ChatEndpoint:
    """The ``/chat`` handler bound to one host and its site id."""

    def __init__(self, host: Host, site_id: str) -> None:
        self.host = host
        self.site_id = site_id
        self.throttle = TokenThrottle()
        self.redact = Redactor.for_host(host)

    def _preflight(self, authorization: str | None, header_items: list[tuple[str, str]]
                   ) -> _Admitted:
        # One worker-thread hop for everything that reads the database before the body.
        token = authenticate(self.host, authorization)
        check_site(self.host)
        inbound = check_claims(token, parse_caller_headers(header_items))
        slot = self.throttle.admit(self.host, token.name)
        try:
            caller = admit(self.host, inbound, self.site_id)
            return _Admitted(caller, max_request_bytes(self.host), token.name,
                             reachable_tools(self.host, token), slot)
        except BaseException:
            slot.release()
            raise

    def _run(self, turn: ChatTurn, event_sink: Any = None, on_text: Any = None
             ) -> ConversationResult:
        with bound_host(self.host):
            return run_chat_turn(self.host, turn, event_sink=event_sink, on_text=on_text)

    def _admit_turn(self, turn: ChatTurn) -> None:
        """The checks that need the body: the session is the token's (404 first, so nothing
        about another token's session leaks, not even that its spend is used up), and no spend
        window of the run is spent (429)."""
        if turn.session_id is not None:
            require_owner(self.host, turn.session_id, turn.token_name)
        refuse_if_spent(self.host, turn.token_name, turn.session_id)

    def _run_checked(self, turn: ChatTurn) -> ConversationResult:
        """Refuse what :meth:`_admit_turn` refuses, else run it."""
        self._admit_turn(turn)
        return self._run(turn)

    async def handle(self, request: Request) -> Response:
        """Answer one ``POST /chat`` (see the module docstring for the order of checks)."""
        headers: dict[str, str] = {}
        slot: Slot | None = None
        body = b""
        trace_token = continue_trace(request.headers)
        try:
            admitted = await anyio.to_thread.run_sync(
                self._preflight, request.headers.get("authorization"),
                list(request.headers.items()))
            slot = admitted.slot
            caller = admitted.caller
            headers = {HEADER_CHAIN_ID: caller.chain_id,
                       HEADER_CHAIN_DEPTH: str(caller.chain_depth)}
            body = await read_body(request, admitted.limit)
            parsed = parse_chat_request(body)
            turn = ChatTurn(
                messages=parsed.conversation_messages(), caller=caller,
                session_id=parsed.session_id, mode=parsed.mode, provider=parsed.provider,
                model=parsed.model, max_turns=parsed.max_turns, tools=admitted.tools,
                resume=((parsed.resume.approve, parsed.resume.extend_by)
                        if parsed.resume is not None else None),
                confirmation=parsed.confirmation, token_name=admitted.token_name,
            )
            if parsed.stream or _accepts_only_events(request):
                await anyio.to_thread.run_sync(self._admit_turn, turn)
                # Every check above has passed: only now does the answer become a stream,
                # which gives the slot back when its run ends.
                response = sse_response(self._run, turn, headers, self.redact, slot,
                                        _caller_text(request, body))
                slot = None
                return response
            result = await anyio.to_thread.run_sync(self._run_checked, turn)
        except Problem as problem:
            return self.redact.response(problem, headers, _caller_text(request, body))
        except ClientDisconnect:
            # The caller went away mid-body: nobody reads an answer, and it is not our failure.
            logger.info("datamachine: /chat client disconnected before sending its whole body")
            return Response(status_code=400)
        except DataMachineError as exc:
            mapped = problem_for(exc)
            if mapped.status >= 500:
                logger.error("datamachine: /chat failed: %s", exc, exc_info=mapped.status != 503)
            return self.redact.response(mapped, headers, _caller_text(request, body))
        except Exception as exc:
            logger.exception("datamachine: /chat failed unexpectedly")
            return error_response(500, "internal_error",
                                  f"The server failed: {type(exc).__name__}. See its log.",
                                  headers=headers)
        finally:
            if slot is not None:
                slot.release()
            if trace_token is not None:
                end_trace(trace_token)
        return self.redact.result_response(result, headers, _caller_text(request, body))


def continue_trace(headers: Mapping[str, str]) -> object | None:
    """Make the caller's W3C trace context (``traceparent``) current for this request, so its
    run's spans continue the caller's trace; the token to give :func:`end_trace`, or None
    (no header, or OpenTelemetry not installed: then this costs one lookup).

    Attached here, on the request's task: the worker thread that runs the turn (and a stream's
    run) starts with a copy of this context."""
    if "traceparent" not in headers:
        return None
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # no tracing on this site: nothing read, nothing passed on
    # The W3C trace context only (no baggage: a caller's baggage is not this site's to keep).
    return context.attach(TraceContextTextMapPropagator().extract(headers))


def end_trace(token: object) -> None:
    """Undo :func:`continue_trace`, on the same task."""
    from opentelemetry import context

    context.detach(token)  # type: ignore[arg-type]


def _caller_text(request: Request, body: bytes) -> str:
    """Everything the caller sent that an answer may echo: its header values and its body.
    A path the caller sent is left as it is in the answer, so redaction cannot be used to
    test guesses of the server's paths."""
    return "\n".join([*request.headers.values(), body.decode("utf-8", errors="replace")])


def _accepts_only_events(request: Request) -> bool:
    accept = [part.split(";")[0].strip() for part in request.headers.get("accept", "").split(",")]
    return accept == ["text/event-stream"]


def sse_response(run: Any, turn: ChatTurn, headers: dict[str, str],
                 redact: Redactor | None = None, slot: Slot | None = None,
                 caller_text: str = "") -> Response:
    """The run as Server-Sent Events: ``event: <type>`` / ``data: <json>`` per stream event
    (``text_delta``, ``tool_call``, ``tool_result``, ``event``), the last one ``result``
    (the body a JSON answer would have had).

    Called on the event loop. The run starts here, not when the stream is first read, so it
    (and the ``slot`` it gives back when it ends) does not depend on the client staying: a
    client gone before the first byte leaves a run that still finishes and is stored.
    """
    from starlette.responses import StreamingResponse

    from datamachine.conversation.stream import StreamEvent, event_data, from_loop_event

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StreamEvent] = asyncio.Queue()

    def put(item: StreamEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    task = asyncio.ensure_future(anyio.to_thread.run_sync(
        run, turn, lambda event, payload: put(from_loop_event(event, payload)),
        lambda text: put(StreamEvent(type="text_delta", text=text))))
    task.add_done_callback(_retrieve)
    if slot is not None:
        task.add_done_callback(lambda _: slot.release())

    def frame(kind: str, data: Any, *, private: bool) -> bytes:
        # Loop events (a failure's text) and a failed result may carry server paths; the
        # conversation itself (text, tool calls and results, a good result) is the caller's.
        text = _sse(kind, data)
        return redact.redact_bytes(text, caller_text) if redact is not None and private else text

    async def events() -> AsyncIterator[bytes]:
        while True:
            waiting = asyncio.ensure_future(queue.get())
            await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                break
            item = waiting.result()
            yield frame(item.type, event_data(item), private=item.type == "event")
        while not queue.empty():
            item = queue.get_nowait()
            yield frame(item.type, event_data(item), private=item.type == "event")
        try:
            result = task.result()
        except Exception as exc:  # a failure after the stream began: its last event says so
            problem = problem_for(exc) if isinstance(exc, DataMachineError) else None
            message = problem.message if problem else f"The server failed: {type(exc).__name__}."
            yield frame("error", {"error": {"code": problem.code if problem else "internal_error",
                                            "message": message}}, private=True)
            return
        yield frame("result", result.model_dump(mode="json"),
                    private=result.status not in _OK_STATUSES)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**headers, "Cache-Control": "no-store"})


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Log a streamed run's failure once, whether or not a client is still reading: a
    server fault as an error with its traceback, a caller's as one info line."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    if isinstance(exc, DataMachineError) and problem_for(exc).status < 500:
        logger.info("datamachine: streamed /chat refused: %s", exc)
    else:
        logger.error("datamachine: streamed /chat failed", exc_info=exc)


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {compact_json(data)}\n\n".encode()


async def _http_exception(request: Request, exc: Exception) -> Response:
    # Unknown paths and wrong methods answer in the same JSON shape as every other error.
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    detail = exc.detail if isinstance(exc, HTTPException) else "Internal Server Error"
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    return error_response(status, code, f"{detail} ({request.method} {request.url.path}).",
                          headers=headers)


def create_app(host: Host, *, ui_open: bool = False) -> Starlette:
    """The ``/chat`` app for ``host`` with the run viewer at ``/ui/``; makes sure the host has
    a ``site_id`` first. ``ui_open``: the viewer needs no login (serve it on loopback only:
    each request must come from and name a loopback address).

    Settings (``max_chain_depth``, ``max_request_bytes``) are read per request, so changing
    them takes effect without a restart; the site id is fixed for the app's lifetime. A setting
    a run would fail on raises :class:`datamachine.errors.SiteMisconfigured` here, naming it,
    not on the first request (``datamachine serve`` refuses to start).
    """
    site_id = ensure_site_id(host)
    check_site(host)
    endpoint = _ChatEndpoint(host, site_id)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "site_id": site_id})

    async def to_viewer(request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    from datamachine.server.ui.app import RunViewer

    viewer = RunViewer(host, open_access=ui_open)
    app = Starlette(
        routes=[Route("/chat", endpoint.handle, methods=["POST"]),
                Route("/health", health, methods=["GET"]),
                Route("/", to_viewer, methods=["GET"]),
                Route("/ui", to_viewer, methods=["GET"]),
                Mount("/ui", routes=viewer.routes())],
        exception_handlers={HTTPException: _http_exception},
    )
    app.state.host = host
    app.state.site_id = site_id
    return app


def serve(host: Host, *, bind: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          on_stop: Callable[[], None] | None = None, ui_open: bool = False,
          **uvicorn_options: Any) -> None:
    """Run the app under uvicorn until interrupted (``datamachine serve``).

    One process, one host: runs share the host's database connection, so the app is not meant
    for uvicorn's multi-worker mode; run several hosts (each with its own database) instead.
    ``on_stop`` runs at the server's shutdown (sending the spans still batched): uvicorn
    raises a stopping signal again once it has shut down, so code after this call may never
    run. ``ui_open``: the run viewer without a login, allowed only when ``bind`` is a loopback
    address (UsageError otherwise).
    """
    import uvicorn

    from datamachine.server.ui.session import is_loopback_host

    if ui_open and not is_loopback_host(bind):
        raise UsageError(f"--ui-open serves the run viewer without a login, so only on a "
                         f"loopback address (127.0.0.1, ::1, localhost), not {bind!r}; make a "
                         "viewer token instead: `datamachine tokens create NAME --viewer`.")
    app = create_app(host, ui_open=ui_open)
    if on_stop is not None:
        stop = on_stop

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            try:
                yield
            finally:
                stop()

        app.router.lifespan_context = lifespan
    uvicorn.run(app, host=bind, port=port, log_level=log_level, **uvicorn_options)
