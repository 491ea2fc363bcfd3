"""This tree against an earlier commit, in one run: ``python3 bench/compare.py --baseline REF``.

A redesign of the loop must say what it costs per turn next to the code it replaced, measured
on the same machine at the same time (this machine's speed drifts by ~2x within minutes). The
script extracts ``REF`` with ``git archive`` into a temporary directory, starts one worker
process per tree (and, with ``--peer``, one running pydantic-ai from ``bench/.venv``), and has
them take turns: each round every worker times its share of runs, so drift hits all sides alike.

The scenario is the bench's target row, *in memory, all checks on*: the scripted provider, one
``@datamachine.tool`` call per turn for T turns then an answer, an event sink, a completion
policy object, duplicate checks and budgets, ``persist_transcript=False``. Only public API
present in both trees is used, so the same worker code measures either.

    .venv/bin/python bench/compare.py --baseline ca5024d            # T = 10 and 50
    .venv/bin/python bench/compare.py --baseline ca5024d --peer      # and pydantic-ai
    .venv/bin/python bench/compare.py --baseline 3aa7246 --persisted # the SQLite row
    .venv/bin/python bench/compare.py --baseline HEAD~1 --context    # a window, never filled

``--persisted`` measures the *SQLite* row instead: the same runs stored by the host's
transcript store in a SQLite file (WAL), one transaction per turn.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEER_PYTHON = BENCH / ".venv" / "bin" / "python"


# -- the worker (runs inside the tree it measures) ---------------------------------------------
def _datamachine_runner(persisted: bool = False, context: bool = False
                        ) -> Callable[[int], object]:
    import bootstrap
    import datamachine
    from bench.scenario import PROMPT, answer_text, double, script_for

    folder = tempfile.mkdtemp(prefix="dm-compare-")  # removed with the worker's /tmp
    host = bootstrap.boot(db_path=Path(folder) / "bench.db" if persisted else ":memory:",
                          load_entrypoints=False)
    spec = host.budgets.get_spec("conversation_turns")
    assert spec is not None
    host.budgets.register(spec.model_copy(update={"max": 1000}), owner="bootstrap")
    host.settings.set("max_tool_calls", 1000)
    if context:
        # A window the runs never fill: each turn is sized against it, none is compacted. A
        # tree without context windows refuses the setting and runs as it always did.
        with contextlib.suppress(Exception):
            host.settings.set("context_windows", {"bench": 10**8})
    tool = datamachine.tool(double)
    try:
        from datamachine.providers.scripted import load_script

        def script(turns: int) -> Any:
            return load_script(script_for(turns))
    except ImportError:  # pragma: no cover - a tree without it takes the list as is
        def script(turns: int) -> Any:
            return script_for(turns)

    class Sink:
        def __init__(self) -> None:
            self.count = 0

        def emit(self, event: str, payload: dict[str, Any]) -> None:
            self.count += 1

    class Policy:
        def record_tool_result(self, name: str, tool: Any, result: Any, context: Any) -> Any:
            return datamachine.Decision(complete=False)

        def record_natural_completion(self, messages: Any, content: str, context: Any) -> Any:
            return datamachine.Decision(complete=True)

    scripts: dict[int, Any] = {}

    def run(turns: int) -> object:
        if turns not in scripts:
            scripts[turns] = script(turns)
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [tool], "scripted", "bench",
            payload={"script": scripts[turns], "event_sink": Sink(),
                     "completion_policy": Policy(), "persist_transcript": persisted},
            max_turns=turns + 1)
        if result.status != "completed" or result.final_content != answer_text(turns):
            raise RuntimeError(f"run went wrong: {result.status} {result.error!r}")
        return result

    return run


def _peer_runner() -> Callable[[int], object]:
    import asyncio

    from bench.peers import pydantic_ai_runner, sync_adapter

    return sync_adapter(asyncio.new_event_loop(), pydantic_ai_runner())


def worker(root: str, kind: str) -> None:
    """Answer ``TURNS RUNS`` lines on stdin with a JSON list of µs-per-turn samples."""
    sys.path.insert(0, root)
    import gc

    run = (_peer_runner() if kind == "pydantic-ai"
           else _datamachine_runner(persisted=kind == "persisted", context=kind == "context"))
    for _ in range(3):
        run(2)
    # As bench/run.py does: what start-up built (modules, the host, pydantic's schemas) is
    # frozen out of the collector, so a collection scans the runs' objects, not the heap.
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    for line in sys.stdin:
        turns, runs = (int(part) for part in line.split())
        gc.collect()
        run(turns)  # untimed: refills the caches the other workers' turn may have evicted
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            run(turns)
            samples.append((time.perf_counter() - start) * 1e6 / (turns + 1))
        print(json.dumps(samples), flush=True)


# -- the parent ---------------------------------------------------------------------------------
class Worker:
    """One measuring process and its samples."""

    def __init__(self, label: str, python: str, root: Path, kind: str) -> None:
        self.label = label
        self.process = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--worker", str(root), "--kind", kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(root))
        assert self.process.stdout is not None
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"{label}: worker did not start ({ready!r})")
        self.samples: dict[int, list[float]] = {}

    def measure(self, turns: int, runs: int) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{turns} {runs}\n")
        self.process.stdin.flush()
        self.samples.setdefault(turns, []).extend(json.loads(self.process.stdout.readline()))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _extract(ref: str, into: Path) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # The worker code is this file's: the baseline tree gets the same bench helpers.
    for name in ("scenario.py", "peers.py", "__init__.py"):
        (into / "bench" / name).write_bytes((BENCH / name).read_bytes())
    return commit


def main(argv: Sequence[str] | None = None) -> None:
    """Measure, then print a Markdown table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="HEAD~1", help="git ref to compare against")
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runs", type=int, default=10, help="runs per worker per round")
    parser.add_argument("--peer", action="store_true", help="also pydantic-ai (bench/.venv)")
    parser.add_argument("--persisted", action="store_true",
                        help="the SQLite row: runs stored in a SQLite file")
    parser.add_argument("--context", action="store_true",
                        help="with a context window the runs never fill (DESIGN 21)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="datamachine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.kind)
        return
    with tempfile.TemporaryDirectory(prefix="dm-baseline-") as tmp:
        commit = _extract(args.baseline, Path(tmp))
        kind = ("persisted" if args.persisted else "context" if args.context
                else "datamachine")
        workers = [Worker(f"this tree ({_head()})", sys.executable, ROOT, kind),
                   Worker(f"baseline {commit}", sys.executable, Path(tmp), kind)]
        if args.peer:
            if not PEER_PYTHON.exists():
                raise SystemExit("--peer needs bench/.venv: run bench/run.py once to make it")
            workers.append(Worker("pydantic-ai", str(PEER_PYTHON), ROOT, "pydantic-ai"))
        try:
            for _ in range(args.rounds):
                for turns in args.turns:
                    for each in workers:
                        each.measure(turns, args.runs if each.label != "pydantic-ai"
                                     else max(1, args.runs // 5))
        finally:
            for each in workers:
                each.close()
    print(_table(workers, args.turns, args.rounds, args.runs,
                 "SQLite file, all checks on" if args.persisted
                 else "in memory, all checks on, a context window" if args.context
                 else "in memory, all checks on"))


def _head() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def _table(workers: list[Worker], turn_counts: list[int], rounds: int, runs: int,
           scenario: str = "in memory, all checks on") -> str:
    base = workers[0]
    lines = [f"| {scenario}: µs per turn, median (min-max) | "
             + " | ".join(f"T = {t}" for t in turn_counts) + " |",
             "|---|" + "---|" * len(turn_counts)]
    for each in workers:
        cells = []
        for turns in turn_counts:
            samples = each.samples[turns]
            median = statistics.median(samples)
            cell = f"{median:,.1f} ({min(samples):,.1f}-{max(samples):,.1f})"
            if each is not base:
                ratio = median / statistics.median(base.samples[turns])
                cell += f" **{ratio:.2f}x**"
            cells.append(cell)
        lines.append(f"| {each.label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{rounds} rounds, taking turns; {runs} runs per round per datamachine tree "
                 f"(pydantic-ai: {max(1, runs // 5)}); **Nx** = that row over the first row.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
