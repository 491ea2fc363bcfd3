"""Spend limits across processes (DESIGN.md section 15): one daily limit shared by 8
processes x 50 runs on one database file, and a killed process's reservation.

Children come from a forkserver that imported the project once (``spend_workers``).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
from typing import Any

from freezegun import freeze_time

import bootstrap
from agents_api import clock
from datamachine.conversation.spending import window_bounds
from datamachine.storage import WindowKey
from tests.storage import spend_workers as workers

CTX = multiprocessing.get_context("forkserver")
CTX.set_forkserver_preload(["bootstrap", "datamachine.conversation.conversation_run",
                            "tests.storage.spend_workers"])
DEADLINE_S = 180.0
PROCESSES = 8
RUNS = 50
LIMIT = 30_000  # well under the 80,000 tokens 400 runs of two requests would spend


def _limit(db: str) -> WindowKey:
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        host.settings.set("spend_limits", [{"name": "daily_tokens", "budget": "total_tokens",
                                            "window": "day", "limit": LIMIT}])
    return WindowKey("daily_tokens", "site", window_bounds("day", clock.now())[0])


def test_eight_processes_never_pass_the_limit_by_more_than_one_request_each(
        db_target: str) -> None:
    db = db_target
    key = _limit(db)
    out = CTX.Queue()
    children = [CTX.Process(target=workers.spend_runs, args=(str(db), RUNS, out))
                for _ in range(PROCESSES)]
    for child in children:
        child.start()
    reports = [out.get(timeout=DEADLINE_S) for _ in children]
    for child in children:
        child.join(timeout=DEADLINE_S)
        assert child.exitcode == 0
    assert all(kind == "ok" for kind, _ in reports), [r for k, r in reports if k != "ok"]
    runs = [run for _, report in reports for run in report]
    assert len(runs) == PROCESSES * RUNS
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        use = host.spend.use([key])[0]
    spent = sum(tokens for _, _, tokens in runs)
    # Nothing double-counted or lost: the window holds exactly what the runs report.
    assert use.settled == spent
    assert use.reserved == 0
    # Reservations keep the estimates within the limit; only the difference between an
    # estimate and the reported usage of a request in flight can pass it: at most one
    # request per process.
    assert LIMIT <= spent <= LIMIT + PROCESSES * workers.TOKENS_PER_REQUEST
    statuses = {(status, budget) for status, budget, _ in runs}
    assert statuses <= {("completed", None), ("budget_exceeded", "daily_tokens")}
    refused = [run for run in runs if run == ("budget_exceeded", "daily_tokens", 0)]
    assert refused, "once the window is spent, new runs are refused before any request"


def test_a_killed_process_s_reservation_is_released_after_its_ttl(db_target: str) -> None:
    db = db_target
    key = _limit(db)
    out = CTX.Queue()
    child = CTX.Process(target=workers.reserve_and_hang, args=(str(db), 60, out))
    child.start()
    try:
        kind, detail = out.get(timeout=DEADLINE_S)
        assert kind == "asked", detail  # the request is in flight: its estimate is reserved
    finally:
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=DEADLINE_S)
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        held = host.spend.use([key])[0]
        assert held.reserved > 0
        assert held.settled == 0
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=61)
        with freeze_time(later):
            assert host.spend.use([key])[0].reserved == 0  # the lock's TTL has passed
            result: Any = host.run_conversation(
                [{"role": "user", "content": "again"}], [], "scripted", "m")
            assert result.status == "completed"
