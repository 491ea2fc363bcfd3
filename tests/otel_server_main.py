"""A real ``/chat`` server process that exports its traces over OTLP/HTTP.

``python -m tests.otel_server_main DB FD`` configures the OpenTelemetry SDK as an operator's
launcher would (an OTLP/HTTP exporter reading ``OTEL_EXPORTER_OTLP_ENDPOINT``), then serves the
host as ``datamachine serve`` does (:func:`datamachine.server.app.serve`) on the listening
socket FD the test opened. The model is the hostile suite's ``DirectiveModel``.
"""

from __future__ import annotations

import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import bootstrap
from datamachine.server.app import serve
from tests.hostile.server_main import DirectiveModel


def main(argv: list[str]) -> None:
    db, fd, name = argv[1], int(argv[2]), argv[3]
    # Simple (not batched): each span is exported as it ends, so a test reads a run's spans as
    # soon as its answer arrives.
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    host = bootstrap.boot(db_path=db, plugins=[DirectiveModel()])
    try:
        serve(host, fd=fd, log_level="warning", access_log=False)
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main(sys.argv)
