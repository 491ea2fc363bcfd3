"""OpenTelemetry traces and metrics of every run (DESIGN.md section 17; docs/observability.md).

Registered as a default plugin only when ``opentelemetry-api`` is installed (the ``otel``
extra). It imports OpenTelemetry on a run's set-up, never at boot, and observes a run only when
the application configured a tracer provider: otherwise :func:`run_observer` returns ``None``
and the run builds no event payloads at all (measured in docs/performance.md).
"""

from __future__ import annotations

from typing import Any

from datamachine.hookspecs import hookimpl
from datamachine.observe import RunInfo, RunObserver
from datamachine.setting_spec import SettingSpec

CAPTURE_CONTENT_SETTING = "otel_capture_content"


@hookimpl
def register_settings() -> list[SettingSpec]:
    """``otel_capture_content``: whether spans carry message content (off: privacy)."""
    return [SettingSpec(
        name=CAPTURE_CONTENT_SETTING, type="boolean", default=False,
        description="Put message content (tool call arguments and results) in "
                    "OpenTelemetry spans; off by default, for privacy.")]


_modules: list[Any] = []  # opentelemetry.trace, once imported (a run's set-up asks every time)


def _trace() -> Any:
    if not _modules:
        from opentelemetry import trace

        _modules.append(trace)
    return _modules[0]


@hookimpl
def run_observer(run: RunInfo, host: Any) -> RunObserver | None:
    """A tracing observer for the run, or None when no tracer provider is configured."""
    trace = _trace()
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None  # nobody configured tracing: the run is not observed and costs nothing
    from datamachine.default_plugins._otel_observer import SpanObserver

    return SpanObserver.start(provider, run,
                              capture=host.settings.get(CAPTURE_CONTENT_SETTING) is True)
