"""Per-turn cost of transcript persistence: a run's writer on a file database.

This is what the loop adds to every turn when the host's ``TranscriptStore`` is the persister
and the lock: the run's ``TranscriptWriter`` appends the turn's three messages (text, tool call,
tool result) and the row's exact counts in one ``BEGIN IMMEDIATE`` transaction on a WAL database
(synchronous=NORMAL) that first proves the run still holds the lock (extending it when due);
the loop's ``renew`` right after costs nothing. Each run uses a fresh database in a temporary
directory; the figure reported is the median over runs of the mean microseconds per turn. The
first and last tenth of each run are also timed, to show the cost does not grow with the
transcript (nothing re-reads the history).

    .venv/bin/python bench/persistence.py [--runs 7] [--turns 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from agents_api import Message
from datamachine.storage import TranscriptStore
from datamachine.storage.database import open_database


def turn_messages(turn: int) -> list[Message]:
    """A typical turn: some text, one tool call, a tool result of about half a kilobyte."""
    return [
        Message.text("assistant", f"Turn {turn}: looking that up. " + "x" * 160),
        Message.tool_call("search", {"query": f"item {turn}", "limit": 10}, turn, f"call_{turn}"),
        Message.tool_result("search", {"success": True, "result": {"hits": ["y" * 40] * 10}},
                            turn, f"call_{turn}", "z" * 500),
    ]


def one_run(turns: int) -> tuple[float, float, float]:
    """Mean µs per turn over the whole run, over its first tenth and over its last tenth."""
    batches = [turn_messages(turn) for turn in range(1, turns + 1)]
    tenth = max(1, turns // 10)
    with tempfile.TemporaryDirectory() as directory:
        db = open_database(Path(directory) / "bench.db")
        store = TranscriptStore(db)
        token = store.acquire("bench", 300)
        assert token is not None
        writer = store.open_writer("bench", token, 300)
        writer.begin([], {})
        stamps = [time.perf_counter()]
        for turn, messages in enumerate(batches, start=1):
            writer.append_turn(turn, messages)
            writer.renew()
            stamps.append(time.perf_counter())
        assert writer.release()
        assert len(store.get("bench")) == 3 * turns
        db.conn.close()
    per_turn = [b - a for a, b in itertools.pairwise(stamps)]
    micro = 1e6
    return (sum(per_turn) / turns * micro, sum(per_turn[:tenth]) / tenth * micro,
            sum(per_turn[-tenth:]) / tenth * micro)


def main() -> None:
    """Run the benchmark and print the median figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    results = [one_run(args.turns) for _ in range(args.runs)]
    overall = [r[0] for r in results]
    print(f"persistence per turn (a writer's append_turn + renew), {args.runs} runs x "
          f"{args.turns} turns:")
    print(f"  median {statistics.median(overall):.0f} us/turn "
          f"(min {min(overall):.0f}, max {max(overall):.0f})")
    print(f"  first tenth {statistics.median(r[1] for r in results):.0f} us/turn, "
          f"last tenth {statistics.median(r[2] for r in results):.0f} us/turn")


if __name__ == "__main__":
    main()
