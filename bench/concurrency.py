"""Many async conversations in one process: per-turn cost and peak memory.

N conversations run at once with ``asyncio.gather`` on one host, each with an async provider
that awaits once per turn (``asyncio.sleep(0)``), registered through ``register_providers()``
like any plugin's provider. Per-turn cost is the batch's wall time divided by every model
request of every conversation; peak memory is tracemalloc's peak during a separate, identical
batch (tracing slows Python down, so the timed batch runs without it).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import tracemalloc
from dataclasses import dataclass

from bench.dm_loop import AsyncProviderPlugin, async_runner, make_host
from datamachine.host import Host

__all__ = ["ConcurrencyFigures", "measure_concurrency"]


@dataclass(frozen=True)
class ConcurrencyFigures:
    """One concurrency level: µs per turn (median, min, max over batches) and peak memory."""

    conversations: int
    turns: int
    median: float
    low: float
    high: float
    peak_mib: float


async def _batch(host: Host, conversations: int, turns: int) -> None:
    await asyncio.gather(*(async_runner(host, turns) for _ in range(conversations)))


def measure_concurrency(conversations: int, turns: int, batches: int,
                        host: Host | None = None) -> ConcurrencyFigures:
    """Run ``batches`` timed batches of ``conversations`` concurrent runs of T = ``turns``."""
    host = host if host is not None else make_host(plugins=(AsyncProviderPlugin(),))
    loop = asyncio.new_event_loop()
    gc.collect()
    gc.freeze()  # objects from before (other benchmarks) are not this batch's to scan
    try:
        loop.run_until_complete(_batch(host, min(conversations, 10), turns))  # warm up
        samples = []
        requests = conversations * (turns + 1)
        for _ in range(batches):
            gc.collect()
            start = time.perf_counter()
            loop.run_until_complete(_batch(host, conversations, turns))
            samples.append((time.perf_counter() - start) * 1e6 / requests)
        gc.collect()
        tracemalloc.start()
        try:
            loop.run_until_complete(_batch(host, conversations, turns))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        loop.close()
        gc.unfreeze()
    return ConcurrencyFigures(conversations, turns, statistics.median(samples), min(samples),
                              max(samples), peak / 2**20)
