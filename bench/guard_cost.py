"""What the loop guard costs a run that never repeats itself (DESIGN.md 23).

``python3 bench/guard_cost.py`` (``--rounds N``, ``--json``): the scenario of
``bench/compare.py`` (one new tool call per turn, then an answer) on one host, with the loop
guard on (its default ladder) and ``"off"`` (the setting, read from the environment each run),
alternated run by run so both meet the same caches and the same collector. The per-turn cost is
the slope between a 10-turn and a 50-turn run (the median of each), so a run's fixed set-up
falls out of it; the set-up is the 10-turn difference less ten turns. Then the guard alone: its
two calls of a healthy turn in a tight loop, which is what it adds without the run around it.

The bound (issue 37): at most 3 µs a turn. A model that does repeat itself pays more on the
turns it repeats on (the canonical spelling of the calls involved): those turns are the ones
worth paying for.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agents_api import IterationBudget  # noqa: E402
from bench.compare import _datamachine_runner  # noqa: E402
from datamachine.loop_guard.guard import LoopGuard  # noqa: E402
from datamachine.loop_guard.ladder import DEFAULT_LADDER  # noqa: E402

SETTING = "DATAMACHINE_LOOP_GUARD"


def run_costs(rounds: int) -> dict[str, float]:
    """µs per turn and per run of set-up, guard on and off."""
    run = _datamachine_runner()

    def timed(on: bool, turns: int) -> float:
        if on:
            os.environ.pop(SETTING, None)
        else:
            os.environ[SETTING] = "off"
        start = time.perf_counter()
        run(turns)
        return time.perf_counter() - start

    for on in (True, False):
        timed(on, 5)
    gc.collect()
    gc.freeze()
    samples: dict[tuple[bool, int], list[float]] = {
        (on, turns): [] for on in (True, False) for turns in (10, 50)}
    try:
        for index in range(rounds):
            for on in ((True, False) if index % 2 else (False, True)):
                for turns in (10, 50):
                    samples[on, turns].append(timed(on, turns))
    finally:
        os.environ.pop(SETTING, None)
    median = {key: statistics.median(values) * 1e6 for key, values in samples.items()}
    per_turn = {on: (median[on, 50] - median[on, 10]) / 40 for on in (True, False)}
    added = per_turn[True] - per_turn[False]
    return {"turn_on_us": per_turn[True], "turn_off_us": per_turn[False],
            "guard_per_turn_us": added,
            "guard_set_up_us": median[True, 10] - median[False, 10] - 10 * added}


def guard_alone(number: int = 200_000) -> float:
    """µs the guard's two calls of a healthy turn take, in a tight loop."""
    guard = LoopGuard(IterationBudget("stuck_turns", 3), DEFAULT_LADDER,
                      emit=lambda event, payload: None, hidden=set())
    budgets: dict[str, IterationBudget] = {}
    count = [0]

    def turn() -> None:
        count[0] += 1
        guard.answered(count[0], "", 1, budgets)
        guard.ran("double", {"n": count[0]}, {"success": True, "data": count[0] * 2}, budgets)

    def nothing() -> None:
        count[0] += 1

    spent = timeit.timeit(turn, number=number) - timeit.timeit(nothing, number=number)
    return spent / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=150,
                        help="runs of each kind (10 and 50 turns, guard on and off)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = run_costs(args.rounds)
    figures["guard_alone_us"] = guard_alone()
    if args.json:
        print(json.dumps({key: round(value, 2) for key, value in figures.items()}))
        return 0
    print(f"per turn, guard on:  {figures['turn_on_us']:.1f} µs")
    print(f"per turn, guard off: {figures['turn_off_us']:.1f} µs")
    print(f"the guard, per turn: {figures['guard_per_turn_us']:.2f} µs (bound: 3 µs)")
    print(f"the guard's set-up:  {figures['guard_set_up_us']:.1f} µs a run")
    print(f"the guard alone:     {figures['guard_alone_us']:.2f} µs a turn (its two calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
