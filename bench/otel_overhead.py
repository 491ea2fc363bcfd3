"""What the tracing plugin costs a run: ``.venv/bin/python bench/otel_overhead.py``.

Three hosts run the bench scenario (the scripted model calls ``double`` once per turn for T
turns, then answers; no event sink, nothing persisted), taking turns in rounds so the machine's
drift hits all alike: one without the otel plugin, one with it and no tracer provider
configured (the default: tracing off), and, measured after them, one with the SDK's tracer
provider configured (spans built and handed to a processor that drops them). Figures are µs per
model request (median, min-max), as in docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bootstrap
import datamachine
from bench.scenario import PROMPT, double, measure_interleaved, script_for
from datamachine.providers.scripted import load_script

OTEL_PLUGIN = "datamachine.default_plugins.otel"


def runner(with_plugin: bool) -> Any:
    host = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    if not with_plugin:
        host.pm.unregister(name=OTEL_PLUGIN)
    host.settings.set("max_tool_calls", 1000)
    tool = datamachine.tool(double)
    scripts: dict[int, Any] = {}

    def run(turns: int) -> object:
        if turns not in scripts:
            scripts[turns] = load_script(script_for(turns))
        return host.run_conversation(
            [{"role": "user", "content": PROMPT}], [tool], "scripted", "bench",
            payload={"script": scripts[turns], "persist_transcript": False},
            max_turns=turns + 1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, nargs="+", default=[0, 10])
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    off = {"no otel plugin": runner(False), "otel plugin, tracing off": runner(True)}
    for turns in args.turns:
        for name, figures in measure_interleaved(off, turns, args.runs, rounds=20).items():
            print(f"T={turns:<3} {name:<28} {figures.cell()} µs/request")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    on = {"tracing on (SDK)": runner(True)}
    for turns in args.turns:
        for name, figures in measure_interleaved(on, turns, args.runs, rounds=20).items():
            print(f"T={turns:<3} {name:<28} {figures.cell()} µs/request")


if __name__ == "__main__":
    main()
