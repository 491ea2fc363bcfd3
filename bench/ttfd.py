"""Time to first delta: how long until the first words of a streamed answer reach the caller.

``.venv/bin/python bench/ttfd.py``. One loopback server process (:mod:`bench.http_bench`'s,
which streams its answer word by word as Server-Sent Events) and, on one event loop kept open,
two readers taking turns:

* **floor**: a plain ``httpx.AsyncClient`` stream read with ``httpx_sse`` until the first
  ``data:`` event that carries text;
* **datamachine**: ``host.astream_conversation`` on the ``openai`` provider until the first
  ``text_delta`` (set-up of the run, the request, the provider's parsing, the stream's queue).

Each sample is one request's time to its first text; the rest of the answer is read (and, for
datamachine, the run finishes) outside the timing. Medians of interleaved rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.http_bench import MODEL, prompt, start_server  # noqa: E402

Reader = Callable[[], Awaitable[float]]


def floor_reader(base_url: str) -> Reader:
    import httpx
    from httpx_sse import aconnect_sse

    client = httpx.AsyncClient(base_url=base_url, headers={"Authorization": "Bearer x"})
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt(0)}],
            "stream": True}

    async def read() -> float:
        started = time.perf_counter()
        first = 0.0
        async with aconnect_sse(client, "POST", "/chat/completions", json=body) as source:
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                choices = json.loads(event.data).get("choices") or []
                if not first and choices and choices[0]["delta"].get("content"):
                    first = time.perf_counter() - started
        return first

    return read


def datamachine_reader(base_url: str) -> Reader:
    import bootstrap

    host = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    host.settings.set("openai_base_url", base_url)
    messages = [{"role": "user", "content": prompt(0)}]

    async def read() -> float:
        started = time.perf_counter()
        first = 0.0
        async for event in host.astream_conversation(messages, [], "openai", MODEL,
                                                     payload={"persist_transcript": False}):
            if not first and event.type == "text_delta":
                first = time.perf_counter() - started
            if event.type == "result" and (event.result is None
                                           or event.result.status != "completed"):
                raise RuntimeError(f"datamachine stream went wrong: {event.result}")
        return first

    return read


def measure(runs: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    process, base_url = start_server()
    loop = asyncio.new_event_loop()
    try:
        readers = {"floor (httpx + httpx-sse)": floor_reader(base_url),
                   "datamachine (astream_conversation, openai)": datamachine_reader(base_url)}
        samples: dict[str, list[float]] = {name: [] for name in readers}
        for read in readers.values():
            for _ in range(3):
                loop.run_until_complete(read())
        for _ in range(rounds):
            for name, read in readers.items():
                gc.collect()
                for _ in range(max(1, runs // rounds)):
                    samples[name].append(loop.run_until_complete(read()) * 1e3)
    finally:
        loop.close()
        process.kill()
        process.wait()
    return {name: (statistics.median(s), min(s), max(s)) for name, s in samples.items()}


def table(figures: dict[str, tuple[float, float, float]]) -> str:
    floor = next(iter(figures.values()))[0]
    lines = ["| time to first delta, ms: median (min-max) | |", "|---|---|"]
    for name, (median, low, high) in figures.items():
        extra = "" if median == floor else f" **+{median - floor:.3f} ms over the floor**"
        lines.append(f"| {name} | {median:.3f} ({low:.3f}-{high:.3f}){extra} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    print(table(measure(args.runs, args.rounds)))


if __name__ == "__main__":
    main()
