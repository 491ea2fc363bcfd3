"""A loopback server that answers with bytes a real server sent: :class:`ReplayServer`.

A fake server that behaves the way we expect proves little (STYLE.md, "Replay what real
servers send"). The files in ``recordings/`` are the exact bytes (status line, headers,
chunked body) that llama-cpp-python's server sent for the requests that
``recordings/recordings.json`` lists; this server sends them back, byte for byte, one recording
per request, and closes the connection (the recordings say ``Connection: close``).

``cut_after_headers(name)`` is a recording's own status line and headers with no body: a
stream that breaks before its first byte. An answer past the last recording is a 599 naming
the request, so a test that sent one request too many fails saying so.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path
from typing import Any

RECORDINGS = Path(__file__).resolve().parent / "recordings"
# Every socket operation of the server is bounded: a stuck client never hangs a test.
IO_TIMEOUT = 10.0


def recording(name: str) -> bytes:
    """The bytes of ``recordings/<name>`` (``.http`` added when missing)."""
    return (RECORDINGS / (name if name.endswith(".http") else f"{name}.http")).read_bytes()


def recorded_request(name: str) -> dict[str, Any]:
    """The request body that produced ``recordings/<name>``."""
    manifest = json.loads((RECORDINGS / "recordings.json").read_text())
    key = name if name.endswith(".http") else f"{name}.http"
    request: dict[str, Any] = manifest["recordings"][key]["request"]
    return request


def cut_after_headers(name: str) -> bytes:
    """``name``'s status line and headers only: the connection closes before the body's first
    byte."""
    data = recording(name)
    return data[:data.index(b"\r\n\r\n") + 4]


CLOSE = b""
"""An answer of nothing at all: the connection closes before the status line."""


class ReplayServer:
    """Answers the n-th request with the n-th of ``answers`` (bytes, from :func:`recording`),
    exactly, then closes the connection. ``requests`` holds each request's JSON body."""

    def __init__(self, *answers: bytes) -> None:
        self._answers = list(answers)
        self.requests: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        self._thread = threading.Thread(target=self._serve, name="replay-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(IO_TIMEOUT)
                with contextlib.suppress(OSError):  # the client left: nothing to answer
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        head, body = _read_request(conn)
        with self._lock:
            try:
                self.requests.append(json.loads(body) if body else None)
            except ValueError:
                self.requests.append(body)
            number = len(self.requests)
            answer = self._answers[number - 1] if number <= len(self._answers) else None
        if answer is None:
            message = (f"replay server: request {number} ({head.splitlines()[0]!r}) came "
                       f"after the last of {len(self._answers)} recordings").encode()
            answer = (b"HTTP/1.1 599 Replay Exhausted\r\nContent-Type: text/plain\r\n"
                      b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(message)
                      + message)
        conn.sendall(answer)
        conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop serving (bounded: the accept loop wakes every 0.2 s)."""
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=IO_TIMEOUT)

    def __enter__(self) -> ReplayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_request(conn: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data.decode("latin-1"), b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head.decode("latin-1"), body
