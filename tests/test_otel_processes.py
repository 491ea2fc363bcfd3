"""Two real server processes calling each other export one trace over OTLP/HTTP.

Site A's model calls ``call_remote_agent`` on site B; both processes export their spans with the
SDK's OTLP/HTTP exporter to a loopback receiver started here, which decodes the protobuf
requests with ``opentelemetry-proto``.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

import bootstrap
from tests.hostile.conftest import Served, serving, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 30.0


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback: ``spans`` by the ``service.name`` sending them."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[tuple[str, Span]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, name: str) -> list[tuple[str, Span]]:
        with self.lock:
            return [(service, span) for service, span in self.spans if span.name == name]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert self.path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource in request.resource_spans:
                service = next(a.value.string_value for a in resource.resource.attributes
                               if a.key == "service.name")
                self.server.spans.extend((service, span) for scope in resource.scope_spans
                                         for span in scope.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def start(name: str, folder: Path, endpoint: str) -> Served:
    """Site ``name``'s server process, exporting to ``endpoint`` as ``name``."""
    return start_server(folder / name, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                        "OTEL_SERVICE_NAME": name},
                        main="tests.otel_server_main", load_plugins="")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serving(Receiver()) as server:
        yield cast(Receiver, server)


def test_two_server_processes_calling_each_other_export_one_trace(
        receiver: Receiver, tmp_path: Path) -> None:
    a = start("site-a", tmp_path, receiver.endpoint)
    try:
        b = start("site-b", tmp_path, receiver.endpoint)
        try:
            a_site = a.host.settings.get("site_id")
            a.host.settings.set("remote_sites", {"b": {
                "url": b.url, "token": b.host.tokens.create("site-a", site=a_site)}})
            token = a.host.tokens.create("caller")
            call = {"site": "b", "message": "hello from a"}
            response = httpx.post(f"{a.url}/chat", timeout=TIMEOUT,
                                  headers={"Authorization": f"Bearer {token}"},
                                  json={"message": f"call call_remote_agent {json.dumps(call)}"})
        finally:
            stop_server(b)
    finally:
        stop_server(a)
    assert response.status_code == 200, (response.text, a.log_text())
    body = response.json()
    assert body["status"] == "completed", body
    assert "hello from a" in body["final_content"]  # b's echo, relayed

    runs = dict(receiver.named("invoke_agent"))
    assert set(runs) == {"site-a", "site-b"}, receiver.spans
    ((service, tool),) = receiver.named("execute_tool call_remote_agent")
    assert service == "site-a"
    assert runs["site-a"].trace_id == runs["site-b"].trace_id == tool.trace_id
    assert runs["site-a"].parent_span_id == b""  # a's run is the root
    assert runs["site-b"].parent_span_id == tool.span_id  # b continues a's tool call
    assert tool.parent_span_id == runs["site-a"].span_id
    chats = [(s, span) for s, span in receiver.spans if span.name.startswith("chat ")]
    assert {service for service, _ in chats} == {"site-a", "site-b"}
    assert len({span.trace_id for _, span in receiver.spans}) == 1


def test_datamachine_serve_exports_where_the_otel_environment_says(
        receiver: Receiver, tmp_path: Path) -> None:
    # The command itself, not a launcher: it reads OTEL_EXPORTER_OTLP_ENDPOINT and
    # OTEL_SERVICE_NAME as every OpenTelemetry SDK does, and flushes its spans when stopped.
    db = tmp_path / "cli.db"
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        token = host.tokens.create("caller")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {**os.environ, "DATAMACHINE_LOAD_PLUGINS": "", "OTEL_SERVICE_NAME": "cli-site",
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "datamachine", "--db", str(db), "serve", "--port", str(port),
             "--log-level", "warning"], cwd=tmp_path, env=env, stdout=out,
            stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200:
                    break
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                threading.Event().wait(0.05)
        response = httpx.post(f"{url}/chat", json={"message": "hello"}, timeout=TIMEOUT,
                              headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200, log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert "OpenTelemetry: exporting over OTLP/HTTP" in log.read_text()
    ((service, run),) = receiver.named("invoke_agent")
    assert service == "cli-site"
    chats = [span for name, span in receiver.spans if span.name.startswith("chat")]
    assert chats
    assert all(span.trace_id == run.trace_id for span in chats)


def test_no_export_without_an_endpoint_and_a_set_up_provider_is_left_alone() -> None:
    from datamachine.server.telemetry import export_from_environment

    assert export_from_environment({}) == (None, None)
