"""Scale-out figures (docs/performance.md): ``.venv/bin/python bench/scale_out.py``.

1. **Per-turn persistence**: what one turn's write costs a run (``append_turn`` with the lock
   proven and extended, three messages: the assistant's text, a tool call, its result) on a
   SQLite file (WAL) and on PostgreSQL over loopback, side by side. PostgreSQL runs with its
   defaults (``fsync`` and ``synchronous_commit`` on), so each commit waits for its WAL flush,
   as a production server would.
2. **Jobs per second** with 1, 2 and 4 worker processes on an I/O-bound provider (20 ms per
   turn, three turns per job). The jobs are enqueued first; the rate is measured from the first
   job's start to the last one's finish (the database's own timestamps), so worker start-up is
   not counted.

Both start their own PostgreSQL server (tests/postgres_server.py): Debian's ``postgresql``
package must be installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

import bootstrap  # noqa: E402
from agents_api import Message  # noqa: E402
from datamachine.host import Host  # noqa: E402
from tests.postgres_server import PostgresServer, running_postgres  # noqa: E402
from tests.queue.slow_model import SlowModel  # noqa: E402


def _turn(n: int) -> list[Message]:
    return [Message.text("assistant", f"turn {n}: calling the tool"),
            Message.tool_call("lookup", {"query": f"item {n}"}, n, f"c{n}"),
            Message.tool_result("lookup", {"success": True, "result": {"rows": [n, n + 1]}}, n,
                                f"c{n}", "lookup")]


def per_turn_ms(host: Host, turns: int, runs: int) -> list[float]:
    """Milliseconds per append_turn, one figure per run of ``turns`` turns."""
    figures = []
    for run in range(runs):
        session = f"bench-{run}-{time.time_ns()}"
        token = host.transcripts.acquire(session, 300)
        assert token is not None
        host.transcripts.begin(session, [Message.text("user", "go")], token=token)
        started = time.perf_counter()
        for n in range(1, turns + 1):
            host.transcripts.append_turn(session, n, _turn(n), token=token)
        figures.append((time.perf_counter() - started) / turns * 1000)
        host.transcripts.release(session, token)
    return figures


def _new_database(server: PostgresServer) -> str:
    [url] = server.new_databases(1)
    return url


def persistence(server: PostgresServer, turns: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        targets = {"SQLite (file, WAL)": str(Path(directory) / "bench.db"),
                   "PostgreSQL (loopback, fsync on)": _new_database(server)}
        print(f"\nPer-turn persistence: ms per turn write ({turns} turns x {runs} runs; "
              "median, min-max)")
        for name, target in targets.items():
            host = bootstrap.boot(db_path=target, load_entrypoints=False)
            try:
                per_turn_ms(host, 5, 2)  # warm up
                figures = per_turn_ms(host, turns, runs)
            finally:
                host.close()
            print(f"  {name:34} {statistics.median(figures):6.3f}  "
                  f"({min(figures):.3f}-{max(figures):.3f})")


def _worker(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.queue.worker_main", url, "",
                             str(concurrency), "30"], cwd=ROOT, env=env)


def jobs_per_second(server: PostgresServer, workers: int, concurrency: int,
                    jobs: int) -> float:
    url = _new_database(server)
    host = bootstrap.boot(db_path=url, load_entrypoints=False, plugins=[SlowModel()])
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(jobs):
            host.jobs.enqueue([{"role": "user", "content": f"bench {n} steps 2"}], ["step"],
                              max_turns=10)
        processes = [_worker(url, concurrency) for _ in range(workers)]
        deadline = time.monotonic() + 600
        while True:
            done = host.handle.conn.execute(
                "SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0]
            if int(done) >= jobs:
                break
            assert time.monotonic() < deadline, "the workers did not finish"
            time.sleep(0.2)
        first, last = host.handle.conn.execute(
            "SELECT min(started_at), max(finished_at) FROM jobs").fetchone()
        return jobs / (float(last) - float(first))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
        host.close()


def scaling(server: PostgresServer, jobs: int, concurrency: int) -> None:
    print(f"\nJobs per second: {jobs} jobs of 3 turns, 20 ms per turn, "
          f"{concurrency} job(s) at a time per worker")
    rates: dict[int, float] = {}
    for workers in (1, 2, 4):
        rates[workers] = jobs_per_second(server, workers, concurrency, jobs)
        print(f"  {workers} worker(s): {rates[workers]:7.1f} jobs/s  "
              f"({rates[workers] / rates[1]:.2f}x one)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    with running_postgres(durable=True) as server:
        persistence(server, args.turns, args.runs)
        scaling(server, args.jobs, args.concurrency)


if __name__ == "__main__":
    main()
