"""The run viewer on 100,000 runs (docs/viewer.md, docs/performance.md):
``.venv/bin/python bench/viewer.py [--runs N] [--postgres]``.

Fills a new database with ``--runs`` finished runs (default 100,000) whose rows look like real
ones (a title, usage, budgets, a result summary, a mix of statuses and modes, four messages
each), serves it with ``datamachine serve``'s app under uvicorn on loopback, logs in with a
viewer token, and times whole HTTP requests of the pages a person opens: the first page of the
list, a page 1,000 pages deep (by its ``next`` cursor), each filter, a text search that matches
nothing (the worst case: every row is read), and one run's page. Median and worst of 20 requests
each, after one warm-up request. ``--postgres`` runs the same against a PostgreSQL server it
starts itself (tests/postgres_server.py; Debian's ``postgresql`` package).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import bootstrap  # noqa: E402
from datamachine.host import Host  # noqa: E402
from datamachine.server.app import create_app  # noqa: E402
from datamachine.storage._tx import connection_lock, immediate  # noqa: E402
from tests.a2a.live import LiveServer  # noqa: E402

REQUESTS = 20
START = 1_780_000_000.0
STATUSES = ["completed"] * 80 + ["budget_exceeded"] * 12 + ["incomplete"] * 4 + [
    "error"] * 3 + ["awaiting_confirmation"]
MODES = ["chat"] * 6 + ["pipeline"] * 3 + ["system"]


def _message(role: str, content: str, kind: str = "text") -> str:
    return json.dumps({"schema": "agents-api.message", "version": 1, "type": kind,
                       "role": role, "content": content, "payload": {}, "metadata": {}},
                      separators=(",", ":"))


def fill(host: Host, runs: int) -> None:
    """``runs`` finished runs, one transaction per 10,000."""
    rng = random.Random(7)
    for first in range(0, runs, 10_000):
        rows, messages = [], []
        for i in range(first, min(runs, first + 10_000)):
            status = rng.choice(STATUSES)
            turns = rng.randint(1, 12)
            budget = "conversation_turns" if status == "budget_exceeded" else None
            title = f"Task {i}: summarise the quarterly report for team {i % 97}"
            result = {"status": status, "completed": status == "completed",
                      "final_content": f"Done with task {i}: three findings, one risk.",
                      "budget": budget, "flags": [], "warning": None, "error": None,
                      "error_code": "provider_error" if status == "error" else None,
                      "warnings": [], "turn_count": turns, "cumulative_turn_count": turns}
            budgets = {"conversation_turns": {"current": turns, "ceiling": 12 if budget else 25,
                                              "remaining": 0, "exceeded": budget is not None,
                                              "hard_ceiling": 200, "rail": None},
                       "tool_calls": {"current": turns * 2, "ceiling": 100, "remaining": 50,
                                      "exceeded": False, "hard_ceiling": 1000, "rail": None}}
            usage = {"prompt_tokens": 900 * turns, "completion_tokens": 80 * turns,
                     "total_tokens": 980 * turns, "cost_usd": 0.0004 * turns}
            created = START + i * 3.0
            sid = f"{i:08x}{rng.getrandbits(64):016x}"
            rows.append((sid, status, "openai", "gpt-4.1-mini", rng.choice(MODES), created,
                         created + rng.uniform(0.5, 40), turns, turns, 4, json.dumps(usage),
                         json.dumps(budgets), json.dumps(result), title))
            messages += [(sid, 0, 0, _message("user", title), created),
                         (sid, 1, 1, _message("assistant", "Reading it."), created),
                         (sid, 2, 1, _message("tool", '{"pages": 12}', "tool_result"),
                          created),
                         (sid, 3, 2, _message("assistant", result["final_content"]), created)]
        with immediate(host.handle, connection_lock(host.handle), "bench", "fill") as conn:
            conn.executemany(
                "INSERT INTO transcripts (id, status, provider, model, mode, created_at, "
                "updated_at, turn_count, cumulative_turn_count, message_count, usage, budgets, "
                "result, title) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            conn.executemany(
                "INSERT INTO transcript_messages (session_id, position, turn, envelope, "
                "created_at) VALUES (?, ?, ?, ?, ?)", messages)
    if host.db_path is not None:
        host.handle.conn.execute("ANALYZE")
    else:
        with immediate(host.handle, connection_lock(host.handle), "bench", "analyze") as conn:
            conn.execute("ANALYZE")


def timed(client: httpx.Client, path: str) -> tuple[float, float, str]:
    """Median and worst milliseconds of whole requests of ``path``, and the last page."""
    answer = client.get(path)  # warm-up
    assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200
    return statistics.median(times), max(times), answer.text


@contextmanager
def target(postgres: bool, folder: Path) -> Iterator[str]:
    if not postgres:
        yield str(folder / "viewer.db")
        return
    from tests.postgres_server import running_postgres

    with running_postgres(durable=True) as server:
        yield server.new_databases(1)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, target(args.postgres, Path(tmp)) as db:
        host = bootstrap.boot(db_path=db, load_entrypoints=False)
        started = time.perf_counter()
        fill(host, args.runs)
        print(f"filled {args.runs:,} runs in {time.perf_counter() - started:.1f} s "
              f"({'PostgreSQL' if args.postgres else 'SQLite'})")
        token = host.tokens.create("bench", scope="viewer")
        server = LiveServer(host)
        server.app.app = create_app(host)
        server.start()
        try:
            client = httpx.Client(base_url=server.url, timeout=60, follow_redirects=True)
            page = client.get("/ui/login").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
            assert client.post("/ui/login", data={"token": token, "csrf": csrf}).status_code == 200
            deep = host.transcripts.page(limit=50)
            for _ in range(999):
                assert deep.next is not None
                deep = host.transcripts.page(limit=50, after=deep.next)
            some_id = deep.items[0].id
            cases = [
                ("first page", "/ui/"),
                ("page 1,000 (by cursor)", f"/ui/?after={deep.next}"),
                ("status=completed (80 %)", "/ui/?status=completed"),
                ("status=awaiting_confirmation (1 %)", "/ui/?status=awaiting_confirmation"),
                ("mode=system (10 %)", "/ui/?mode=system"),
                ("text matching 1 in 97 runs", "/ui/?q=team+42"),
                ("text matching nothing (reads every row)", "/ui/?q=no-such-words"),
                ("one run's page", f"/ui/run?id={some_id}"),
            ]
            print(f"{'request':44} {'median ms':>10} {'worst ms':>9}")
            for label, path in cases:
                median, worst, _ = timed(client, path)
                print(f"{label:44} {median:10.1f} {worst:9.1f}")
        finally:
            server.stop()
            host.close()


if __name__ == "__main__":
    main()
