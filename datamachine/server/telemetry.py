"""``datamachine serve`` exports its traces and metrics where the standard ``OTEL_*``
environment variables say, when the OpenTelemetry SDK is installed.

An application that embeds datamachine configures OpenTelemetry itself (docs/observability.md);
the ``serve`` command has no application around it, so it reads the variables every
OpenTelemetry SDK reads: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the ``_TRACES_``/``_METRICS_``
ones) turns export on, ``OTEL_SERVICE_NAME`` names the service (default ``datamachine``), and
the OTLP/HTTP exporters and the batch processor read the rest (headers, timeouts,
``OTEL_BSP_SCHEDULE_DELAY``). A provider set up before (``opentelemetry-instrument``, a
launcher) is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

__all__ = ["ENDPOINT_VARIABLES", "export_from_environment"]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def export_from_environment(environ: Mapping[str, str] | None = None
                            ) -> tuple[Callable[[], None] | None, str | None]:
    """Set up OTLP/HTTP export of traces (and metrics) when the environment asks for it.

    Returns ``(shutdown, notice)``: ``shutdown`` flushes and stops what was set up (None when
    nothing was), ``notice`` is one line to show the operator (export on, or why not)."""
    env = os.environ if environ is None else environ
    asked = next((name for name in ENDPOINT_VARIABLES if env.get(name, "").strip()), None)
    if asked is None:
        return None, None
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return None, (f"{asked} is set, but traces are not exported: install "
                      "opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http beside "
                      "datamachine-agents[otel].")
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None, None  # configured already (opentelemetry-instrument, a launcher)
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "datamachine"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    stops: list[Callable[[], object]] = [tracer_provider.shutdown]
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:
        pass  # traces only
    else:
        meter_provider = MeterProvider(
            resource=resource,
            metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
        metrics.set_meter_provider(meter_provider)
        stops.append(meter_provider.shutdown)

    def shutdown() -> None:
        for stop in stops:
            stop()

    return shutdown, f"OpenTelemetry: exporting over OTLP/HTTP ({asked}={env[asked].strip()})."
