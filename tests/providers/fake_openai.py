"""A real HTTP server on loopback that speaks just enough of the Chat Completions protocol.

Tests enqueue the replies it gives (status, headers, body, an optional delay) and read back the
requests it received, so the provider is exercised over a real socket with real httpx timeouts
instead of a mocked client. A delayed reply waits on an event that :meth:`stop` sets, so stopping
never hangs on a handler that is still "thinking".
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted HTTP answer."""

    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes -> sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # A streamed answer: each item is sent as one SSE "data:" event, chunk_delay apart, then
    # "data: [DONE]" unless cut (the connection just closes).
    stream: list[Any] | None = None
    chunk_delay: float = 0.0
    cut: bool = False


@dataclass
class Received:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    # The client's port: requests on one kept-alive connection share it.
    client_port: int = 0

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


def completion(content: str | None = "", *, tool_calls: list[dict[str, Any]] | None = None,
               usage: dict[str, Any] | None = None, finish_reason: str = "stop"
               ) -> dict[str, Any]:
    """A Chat Completions response body."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


class RecordingSleep:
    """An injectable sleep: remembers each wait and returns at once (a sync callable, which
    sync and async runs both accept)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def chunk(content: str | None = None, *, tool_calls: list[dict[str, Any]] | None = None,
          finish_reason: str | None = None, usage: dict[str, Any] | None = None,
          ) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (usage alone: ``choices`` empty, as OpenAI sends it)."""
    if usage is not None and content is None and tool_calls is None and finish_reason is None:
        return {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": "c", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def strict_problem(body: Any) -> str | None:
    """What llama.cpp's server (llama-cpp-python 0.3) refuses in a request body, or None.

    Its request model types every message's ``content`` as a string (or a list of parts), so a
    ``null`` content, even on an assistant message that only calls tools, is answered with a
    500 "Input should be a valid string". And every earlier tool call's ``arguments`` must parse
    as a JSON object, as llama.cpp's native server requires when it renders its chat templates.
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return "messages: Field required"
    for index, message in enumerate(body["messages"]):
        if not isinstance(message, dict):
            return f"messages.{index}: Input should be a valid dictionary"
        if "content" in message and not isinstance(message["content"], str | list):
            return f"messages.{index}.content: Input should be a valid string"
        for number, call in enumerate(message.get("tool_calls") or []):
            if not _object_text(call.get("function", {}).get("arguments")):
                return (f"messages.{index}.tool_calls.{number}.function.arguments: "
                        "not a JSON object")
    return None


def _object_text(text: Any) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (TypeError, ValueError):
        return False


class _Handler(BaseHTTPRequestHandler):
    """Answers each POST with the next enqueued reply (see FakeOpenAIServer)."""

    server: _Server
    # HTTP/1.1: connections are kept alive, so a client's pool reuse is visible.
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.server.fake._lock:
            self.server.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.fake._lock:
            self.server.fake._connections.discard(self.connection)
        super().finish()

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        with fake._lock:
            fake.requests.append(Received(
                "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, raw,
                self.client_address[1]))
            problem = strict_problem(json.loads(raw or b"null")) if fake.strict else None
            if problem is not None:
                reply = Reply(500, {"error": {"message": problem, "type": "server_error"}})
            else:
                reply = fake.replies.popleft() if fake.replies else Reply(418, {
                    "error": {"message": "the test enqueued no reply for this request"}})
        if reply.delay:
            fake._release.wait(reply.delay)
        if reply.stream is not None:
            self._stream(reply)
        else:
            self._answer(reply)

    def _answer(self, reply: Reply) -> None:
        body = reply.body
        if isinstance(body, dict | list):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body or b""
        try:
            self.send_response(reply.status)
            headers = {"Content-Type": "application/json", **reply.headers}
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer

    def _stream(self, reply: Reply) -> None:
        self.close_connection = True
        try:
            self.send_response(reply.status)
            for name, value in {"Content-Type": "text/event-stream", "Connection": "close",
                                **reply.headers}.items():
                self.send_header(name, value)
            self.end_headers()
            events = [json.dumps(item) for item in reply.stream or []]
            if not reply.cut:
                events.append("[DONE]")
            for index, data in enumerate(events):
                if index and reply.chunk_delay:
                    self.server.fake._release.wait(reply.chunk_delay)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _Server(ThreadingHTTPServer):
    """The HTTP server of one FakeOpenAIServer (``fake``), on a free loopback port."""

    def __init__(self, fake: FakeOpenAIServer) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", 0), _Handler)


class FakeOpenAIServer:
    """Start with :meth:`start` (or use as a context manager); always :meth:`stop` it.

    ``strict=True`` answers what :func:`strict_problem` finds with llama.cpp's 500, before any
    enqueued reply is used.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._httpd = _Server(self)
        # Non-daemon handler threads are joined by server_close(), so stop() leaves none behind.
        self._httpd.daemon_threads = False
        self._httpd.block_on_close = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def connections_used(self) -> int:
        """How many client connections the requests so far came over."""
        return len({request.client_port for request in self.requests})

    def stop(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        with self._lock:
            # Kept-alive connections a pooled client still holds: end them, so the handler
            # threads waiting for their next request return.
            for connection in list(self._connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            raise RuntimeError("fake OpenAI server thread did not stop")
