"""Record the exact bytes llama-cpp-python's server sends, for tests/providers/recordings/.

The replayed tests (tests/providers/test_llama_cpp_replay.py) are only as good as their bytes.
Re-record them from a running server (see docs/testing.md, "Recorded server bytes") with::

    python -m tests.real_model.recorder http://127.0.0.1:8765

which sends each request of ``recordings.json`` again and rewrites the ``.http`` files. The
requests go over a raw socket with ``Connection: close``, so what is kept is what the server
wrote: status line, headers and the chunked body, byte for byte.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

from tests.providers.replay import RECORDINGS

__all__ = ["record"]

TIMEOUT = 300.0  # a small model on two cores answers in seconds; a stuck one fails


def record(base_url: str, body: dict[str, Any]) -> bytes:
    """The raw HTTP answer of ``POST <base_url>/v1/chat/completions`` with ``body``."""
    where = urlsplit(base_url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    payload = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        conn.sendall(head + payload)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def main(base_url: str) -> None:
    """Record every request of ``recordings.json`` again from the server at ``base_url``."""
    manifest = json.loads((RECORDINGS / "recordings.json").read_text())
    for name, entry in manifest["recordings"].items():
        (RECORDINGS / name).write_bytes(record(base_url, entry["request"]))
        print(f"recorded {name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8765")
