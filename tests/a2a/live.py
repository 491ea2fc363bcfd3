"""Real uvicorn servers on loopback for the agent-to-agent tests, and a model that relays.

A :class:`LiveServer` runs ``uvicorn.Server`` in a background thread on an ephemeral port of
127.0.0.1 (the socket is bound here, so the port is known before the thread starts). uvicorn only
installs signal handlers on the main thread, so a server thread never touches the test runner's
signals. ``stop()`` sets ``should_exit`` and joins the thread; tests never leave one running.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn

import bootstrap
from datamachine.default_plugins import remote_agent
from datamachine.hookspecs import hookimpl
from datamachine.host import Host
from datamachine.plugins import DEFAULT_PLUGINS
from datamachine.providers.base import ProviderRequest
from datamachine.server.app import create_app

START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
GATE_TIMEOUT = 10.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Hit:
    """One request a server answered: method, path, status and the caller headers it got."""

    method: str
    path: str
    status: int
    headers: dict[str, str]


class RecordingApp:
    """ASGI wrapper that records every HTTP request and the status it was answered with."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hits: list[Hit] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}

        async def recording_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                # Recorded before the response goes out, so a client that has its answer can
                # rely on the hit being there.
                with self._lock:
                    self.hits.append(Hit(scope["method"], scope["path"],
                                         int(message["status"]), headers))
            await send(message)

        await self.app(scope, receive, recording_send)

    def chat_hits(self) -> list[Hit]:
        """The ``POST /chat`` requests, in order."""
        with self._lock:
            return [h for h in self.hits if h.method == "POST" and h.path == "/chat"]


class LiveServer:
    """A uvicorn server for one host, on 127.0.0.1 and a free port."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.app = RecordingApp(create_app(host))
        self.site_id: str = self.app.app.state.site_id
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name=f"uvicorn-{self.port}", daemon=True)

    def start(self) -> LiveServer:
        """Start serving; returns once uvicorn reports it is accepting connections."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"uvicorn on port {self.port} exited during startup")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn on port {self.port} did not start in "
                                   f"{START_TIMEOUT} s")
            time.sleep(0.005)  # bounded wait for startup only
        return self

    def request_stop(self) -> None:
        """Ask uvicorn to exit (it notices within one 0.1 s tick); :meth:`stop` waits."""
        self.server.should_exit = True

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for its thread."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT)
        self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"uvicorn on port {self.port} did not stop in {STOP_TIMEOUT} s")


class RelayModel:
    """A scripted model for one site: relays the user's message to ``next_site``, if any.

    First turn: with a next site, call ``call_remote_agent(next_site, ...)``; without one,
    answer directly. After the tool result: answer with what the remote said (or its refusal).
    ``fail_on`` makes a turn fail with a provider error when the user message equals it.
    Every request is recorded, so a test can prove a site's model was never asked.
    """

    def __init__(self, name: str, next_site: str | None = None, fail_on: str | None = None
                 ) -> None:
        self.__name__ = f"relay_model_{name}"
        self.name = name
        self.next_site = next_site
        self.fail_on = fail_on
        self.requests: list[ProviderRequest] = []
        self._lock = threading.Lock()
        # Set ``hold`` to make the next answers wait for it; ``entered`` says one is waiting.
        self.hold: threading.Event | None = None
        self.entered = threading.Event()

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any] | Exception:
        with self._lock:
            self.requests.append(request)
        if self.hold is not None:
            self.entered.set()
            if not self.hold.wait(GATE_TIMEOUT):
                return RuntimeError("the test never released the model")
        last = request.messages[-1]
        if last.get("role") == "tool":
            return {"content": f"{self.name} relays: {last.get('content')}"}
        text = str(last.get("content", ""))
        if self.fail_on is not None and text == self.fail_on:
            from datamachine.errors import ProviderError

            return ProviderError("the model is down", code="provider_http_error", status=503)
        if self.next_site is not None:
            return {"content": "", "tool_calls": [{
                "id": f"hop-{self.name}-{request.turn}", "name": "call_remote_agent",
                "parameters": {"site": self.next_site, "message": f"{text} > {self.name}"}}]}
        return {"content": f"{self.name} answers: {text}"}


def extra_plugins() -> list[Any]:
    """The remote agent plugin, unless it is already a default plugin."""
    return [] if remote_agent.__name__ in DEFAULT_PLUGINS else [remote_agent]


@dataclass
class Site:
    """One host, its relay model, its token and its live server."""

    name: str
    host: Host
    model: RelayModel
    token: str
    server: LiveServer
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def site_id(self) -> str:
        return self.server.site_id

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def transcript_count(self) -> int:
        return len(self.host.transcripts.list(limit=10_000))


def boot_site(name: str, db_path: Any, model: RelayModel) -> tuple[Host, str]:
    """A host on its own database file with the relay model and a token named ``peer``."""
    host = bootstrap.boot(db_path=db_path, plugins=[*extra_plugins(), model],
                          load_entrypoints=False)
    return host, host.tokens.create("peer")
