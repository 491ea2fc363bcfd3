"""Per-turn cost of metering: token and cost budgets, and spend windows on SQLite.

Whole runs through ``host.run_conversation`` on a file database (WAL, synchronous=NORMAL; the
transcript persisted as usual), each turn one scripted answer with one tool call and reported
usage, in four set-ups:

- ``plain``: no metering at all (the loop's own path);
- ``tokens``: a ``total_tokens`` ceiling and ``prices`` (the estimate before each request and
  the count after it; no database work);
- ``spend``: one site-wide daily ``spend_limits`` window: each request is reserved (one
  ``BEGIN IMMEDIATE`` transaction) and settled (another);
- ``spend x3``: three windows (site, agent, session), still one transaction each way.

Reported: the median over rounds of the microseconds per turn, and each set-up's cost over
``plain`` (issue 19's bound: reservation and settlement at most 300 us per turn).

    .venv/bin/python bench/spend.py [--rounds 7] [--runs 20] [--turns 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bootstrap
from datamachine.tools import Tool

USAGE = {"prompt_tokens": 400, "completion_tokens": 40, "total_tokens": 440}
LIMITS = {
    "site": [{"name": "daily", "budget": "total_tokens", "window": "day", "limit": 10**12}],
    "three": [{"name": "daily", "budget": "total_tokens", "window": "day", "limit": 10**12},
              {"name": "monthly_agent", "budget": "total_tokens", "window": "month",
               "limit": 10**12, "scope": "agent"},
              {"name": "session_cap", "budget": "total_tokens", "window": "month",
               "limit": 10**12, "scope": "session"}],
}


def _lookup(q: str) -> str:
    return f"found {q}"


LOOKUP = Tool(name="lookup", description="Look something up.", function=_lookup)


def script(turns: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"content": "", "tool_calls": [{"id": f"c{i}", "name": "lookup",
                                        "parameters": {"q": f"item {i}"}}], "usage": USAGE}
        for i in range(turns - 1)]
    return [*steps, {"content": "done", "usage": USAGE}]


def per_turn(setup: str, runs: int, turns: int) -> float:
    """Mean microseconds per turn over ``runs`` runs of ``turns`` turns."""
    with tempfile.TemporaryDirectory() as directory:
        host = bootstrap.boot(db_path=Path(directory) / "bench.db", load_entrypoints=False)
        try:
            payload: dict[str, Any] = {"agent_slug": "bench", "final_summary": False}
            if setup != "plain":
                host.settings.set("prices", {"m": {"input": 2.5, "output": 10}})
                payload["budget_ceilings"] = {"total_tokens": 10**12}
            if setup in ("spend", "spend x3"):
                host.settings.set("spend_limits",
                                  LIMITS["site" if setup == "spend" else "three"])
            scripts = [script(turns) for _ in range(runs + 1)]
            host.run_conversation([{"role": "user", "content": "go"}], [LOOKUP], "scripted",
                                  "m", payload={**payload, "script": scripts.pop()})  # warm-up
            start = time.perf_counter()
            for steps in scripts:
                result = host.run_conversation([{"role": "user", "content": "go"}], [LOOKUP],
                                               "scripted", "m",
                                               payload={**payload, "script": steps},
                                               max_turns=turns)
                assert result.status == "completed", result.error
            elapsed = time.perf_counter() - start
        finally:
            host.close()
    return elapsed / (runs * turns) * 1e6


def main() -> None:
    """Run every set-up ``--rounds`` times, interleaved, and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    setups = ["plain", "tokens", "spend", "spend x3"]
    found: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.rounds):
        for name in setups:
            found[name].append(per_turn(name, args.runs, args.turns))
    base = statistics.median(found["plain"])
    print(f"metering per turn, {args.rounds} rounds x {args.runs} runs x {args.turns} turns "
          "(file database, transcript persisted):")
    for name in setups:
        median = statistics.median(found[name])
        extra = "" if name == "plain" else f"  (+{median - base:.0f} us over plain)"
        print(f"  {name:9s} {median:6.0f} us/turn{extra}")


if __name__ == "__main__":
    main()
