"""A real ``/chat`` server process on loopback, and a host on the same database for the test
to make tokens, change settings and read what the server stored."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import bootstrap
from datamachine.host import Host

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 20.0
TIMEOUT = 20.0


@dataclass
class Served:
    """The server process, its URL, its log, and a host on its database."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    host: Host
    folder: Path

    def post(self, token: str | None, body: Any = None, *, headers: dict[str, str] | None = None,
             content: bytes | None = None) -> httpx.Response:
        """``POST /chat`` with ``token`` as the bearer (None: no Authorization header)."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if content is not None:
            return httpx.post(f"{self.url}/chat", content=content, headers=sent,
                              timeout=TIMEOUT)
        return httpx.post(f"{self.url}/chat", json=body, headers=sent, timeout=TIMEOUT)

    def token(self, name: str, **claims: Any) -> str:
        """A new token named ``name`` (``tools=``, ``site=`` as ``tokens create`` takes)."""
        return self.host.tokens.create(name, **claims)

    def log_text(self) -> str:
        """What the server process wrote to stderr and stdout so far."""
        return self.log.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """The server process's resident memory, from /proc."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")


def start_server(folder: Path, env: dict[str, str] | None = None, *,
                 main: str = "tests.hostile.server_main",
                 load_plugins: str = "datamachine-fetch") -> Served:
    """Boot the database, then start the server process (``python -m MAIN DB FD``) on a
    socket bound here, so its port is known before it starts."""
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "site.db"
    host = bootstrap.boot(db_path=db, load_entrypoints=bool(load_plugins))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn takes a passed socket for a Unix one, so asyncio does not set TCP_NODELAY on
    # what it accepts; Linux copies it from the listener, sparing each keep-alive answer
    # Nagle's 40 ms wait.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    log = folder / "server.log"
    environment = {**os.environ, "PYTHONPATH": str(ROOT),
                   "DATAMACHINE_LOAD_PLUGINS": load_plugins, **(env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", main, str(db), str(listener.fileno())],
            cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT,
            pass_fds=[listener.fileno()])
    listener.close()
    served = Served(process, f"http://127.0.0.1:{port}", log, host, folder)
    try:
        _wait_healthy(served)
    except BaseException:
        stop_server(served)
        raise
    return served


def _wait_healthy(served: Served) -> None:
    # The socket already accepts connections (bound here); the first answer waits for the
    # child to boot, within the client's timeout.
    try:
        response = httpx.get(f"{served.url}/health", timeout=START_TIMEOUT)
    except httpx.HTTPError as exc:
        raise AssertionError(f"server did not start: {exc}\n{served.log_text()}") from exc
    assert response.status_code == 200, served.log_text()


def stop_server(served: Served) -> None:
    """Stop the process (SIGTERM, uvicorn's graceful exit) and close the test's host."""
    served.process.terminate()
    try:
        served.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait(timeout=10)
    served.host.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server process for a module's tests (starting one costs about a second)."""
    running = start_server(tmp_path_factory.mktemp("hostile"))
    try:
        yield running
    finally:
        stop_server(running)


def assert_no_paths(served: Served, response: httpx.Response) -> None:
    """An error body names no file path of the server (its folder, the repository, Python)."""
    text = response.text
    for path in (str(served.folder), str(ROOT), sys.prefix, str(Path.home())):
        assert path not in text, (path, text)


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """``server`` answering on its own thread for the block, then shut down and closed."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
