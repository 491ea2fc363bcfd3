"""The one scenario every framework runs, and the timing helpers every bench module shares.

A scripted model calls the tool ``double`` once per turn for T turns (turn i doubles i) and then
answers in plain text: T + 1 model requests per run. A run's cost per turn is the wall time of
the whole run (building the request objects, every turn, the final answer) divided by T + 1.
The tool and the model do no work of their own, so what is left is the framework's overhead.

Only the standard library is imported here: the smoke test and the peers' runner both use it.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROMPT", "TURN_COUNTS", "Figures", "answer_text", "double", "measure", "measure_interleaved",
    "script_for",
]

PROMPT = "Double the numbers one by one, then tell me the last result."
TURN_COUNTS = (10, 50, 200)


def double(x: int) -> int:
    """Double an integer."""
    return 2 * x


def answer_text(turns: int) -> str:
    """The model's final answer after ``turns`` tool turns."""
    return f"The last result is {double(turns)}."


def script_for(turns: int) -> list[dict[str, Any]]:
    """The scripted model's responses in datamachine's script shape (one tool call per turn)."""
    responses: list[dict[str, Any]] = [
        {"content": "", "tool_calls": [{"id": f"call_{i}", "name": "double",
                                        "parameters": {"x": i}}]}
        for i in range(1, turns + 1)
    ]
    responses.append({"content": answer_text(turns)})
    return responses


@dataclass(frozen=True)
class Figures:
    """Microseconds per turn over many runs: median, min and max."""

    median: float
    low: float
    high: float
    runs: int

    def cell(self) -> str:
        """``median (min-max)`` for a table cell."""
        return f"{self.median:,.1f} ({self.low:,.1f}-{self.high:,.1f})"


def measure(run: Callable[[int], object], turns: int, runs: int, warmup: int = 2) -> Figures:
    """Time ``run(turns)`` ``runs`` times (after ``warmup`` untimed runs); µs per model request.

    One full collection runs before the warm-up, and the collector stays on during the runs,
    as it is in production. (Collecting before every timed run would charge each run for
    refilling the memory the collection returned to the system, about 0.2 ms per run on the
    development machine, which no long-lived process pays.)
    """
    gc.collect()
    for _ in range(warmup):
        run(turns)
    samples = []
    requests = turns + 1
    for _ in range(runs):
        start = time.perf_counter()
        run(turns)
        samples.append((time.perf_counter() - start) * 1e6 / requests)
    return Figures(statistics.median(samples), min(samples), max(samples), runs)


def measure_interleaved(runners: dict[str, Callable[[int], object]], turns: int, runs: int,
                        warmup: int = 2, rounds: int = 10) -> dict[str, Figures]:
    """Like :func:`measure` for several runners, taking turns in ``rounds`` rounds.

    On a shared machine the load drifts; taking turns gives every framework the same drift, so
    the ratios between them hold even when the absolute figures move. Within a round each
    runner does its share of runs back to back, after a full collection and one untimed run, so
    no run pays for another framework's garbage or starts with caches it just filled.
    ``warmup`` untimed runs come first.
    """
    for run in runners.values():
        for _ in range(warmup):
            run(turns)
    samples: dict[str, list[float]] = {name: [] for name in runners}
    requests = turns + 1
    rounds = max(1, min(rounds, runs))
    for index in range(rounds):
        share = runs // rounds + (1 if index < runs % rounds else 0)
        for name, run in runners.items():
            gc.collect()
            if warmup:
                run(turns)  # untimed: warms the caches the previous runner used
            for _ in range(share):
                start = time.perf_counter()
                run(turns)
                samples[name].append((time.perf_counter() - start) * 1e6 / requests)
    return {name: Figures(statistics.median(s), min(s), max(s), runs)
            for name, s in samples.items()}
