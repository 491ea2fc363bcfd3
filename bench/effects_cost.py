"""What exactly-once costs (DESIGN.md 24): a ``read`` tool against an effectful one.

``python3 bench/effects_cost.py`` (``--turns N``, ``--rounds N``, ``--no-postgres``): the
scenario of ``bench/compare.py`` (the tool ``double`` once per turn, then an answer) as a
stored run on a SQLite file and on PostgreSQL (a server of its own, tests/postgres_server.py),
with ``double`` declared ``read``, ``idempotent`` and ``write``, alternated run by run so each
meets the same caches. A ``read`` call stores nothing before it runs; an effectful call stores
its intent first, in one transaction that proves the run's lock, and the transaction that
stores its turn settles it. The figure is the median over rounds of each run's µs per turn,
and the difference to ``read``: what one effectful call adds.

The bound (issue 38): a ``read`` tool adds nothing; an effectful call adds one small write.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bootstrap  # noqa: E402
import datamachine  # noqa: E402
from bench.scenario import PROMPT, answer_text, double, script_for  # noqa: E402
from datamachine.providers.scripted import load_script  # noqa: E402

EFFECTS = ("read", "idempotent", "write")


def runner(db: str) -> tuple[Callable[[str, int], float], Callable[[], None]]:
    """A function timing one stored run of ``turns`` turns with ``double`` declared
    ``effects``; and one closing the host."""
    host = bootstrap.boot(db_path=db, load_entrypoints=False)
    spec = host.budgets.get_spec("conversation_turns")
    assert spec is not None
    host.budgets.register(spec.model_copy(update={"max": 1000}), owner="bootstrap")
    host.settings.set("max_tool_calls", 1000)
    tools = {effects: datamachine.tool(effects=effects)(double) for effects in EFFECTS}
    scripts: dict[int, Any] = {}
    runs = iter(range(10**9))

    def timed(effects: str, turns: int) -> float:
        if turns not in scripts:
            scripts[turns] = load_script(script_for(turns))
        session = f"bench-{effects}-{next(runs)}"
        start = time.perf_counter()
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [tools[effects]], "scripted", "bench",
            payload={"script": scripts[turns], "transcript_session_id": session},
            max_turns=turns + 1)
        elapsed = time.perf_counter() - start
        if result.status != "completed" or result.final_content != answer_text(turns):
            raise RuntimeError(f"run went wrong: {result.status} {result.error!r}")
        if host.transcripts.unsettled_intents(session):
            raise RuntimeError("a finished run left an intent unsettled")
        return elapsed / (turns + 1) * 1e6

    return timed, host.close


def measure(db: str, turns: int, rounds: int) -> dict[str, float]:
    """Median µs per turn for each declaration, on ``db``."""
    timed, close = runner(db)
    try:
        for effects in EFFECTS:
            timed(effects, 5)
        gc.collect()
        samples: dict[str, list[float]] = {effects: [] for effects in EFFECTS}
        for _ in range(rounds):
            for effects in EFFECTS:
                samples[effects].append(timed(effects, turns))
    finally:
        close()
    return {effects: statistics.median(found) for effects, found in samples.items()}


def report(label: str, figures: dict[str, float]) -> None:
    read = figures["read"]
    print(f"{label}:")
    for effects in EFFECTS:
        extra = figures[effects] - read
        print(f"  {effects:<10} {figures[effects]:8.1f} us/turn"
              + ("" if effects == "read" else f"   (+{extra:.1f} us per effectful call)"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-postgres", action="store_true",
                        help="Only SQLite (no PostgreSQL server is started).")
    args = parser.parse_args(argv)
    print(f"{args.turns} turns a run, one call a turn, median of {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as folder:
        report("SQLite (a WAL file)", measure(str(Path(folder) / "bench.db"), args.turns,
                                              args.rounds))
    if not args.no_postgres:
        from tests.postgres_server import running_postgres

        with running_postgres(durable=True) as server:
            report("PostgreSQL (loopback, fsync on)",
                   measure(server.url, args.turns, args.rounds))


if __name__ == "__main__":
    main()
