"""Reliability with real processes on a real database file (issue 3).

Children are started with the ``spawn`` context (a fresh interpreter each, as separate workers
would be) and open the file themselves; see ``tests/storage/workers.py``. No test sleeps to let
time pass: a child signals readiness through a file that the parent polls briefly and with a
deadline, and lock expiry is read under freezegun.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from datamachine.storage import TranscriptStore
from datamachine.storage.database import open_database
from tests.storage import workers

CTX = multiprocessing.get_context("spawn")
DEADLINE_S = 60.0


def _wait_for_file(path: Path, process: Any) -> None:
    """Poll (briefly, with a deadline) until the child wrote ``path``."""
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert process.is_alive(), f"child exited early with code {process.exitcode}"
        assert time.monotonic() < deadline, f"child never wrote {path}"
        time.sleep(0.005)


def _kill(process: Any) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=DEADLINE_S)
    assert process.exitcode == -signal.SIGKILL


def test_eight_processes_fifty_runs_each_lose_and_interleave_nothing(tmp_path: Path) -> None:
    """8 workers boot the same new file at once (racing the migrations), then 50 runs each."""
    db_path = tmp_path / "shared.db"
    processes, runs, turns = 8, 50, 3
    out = CTX.Queue()
    children = [CTX.Process(target=workers.many_runs, args=(str(db_path), w, runs, turns, out))
                for w in range(processes)]
    for child in children:
        child.start()
    reports = dict(out.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=DEADLINE_S)
        assert child.exitcode == 0

    failures = [f for worker_failures in reports.values() for f in worker_failures]
    assert failures == []  # a "database is locked" anywhere would be listed here

    store = TranscriptStore(open_database(db_path))
    summaries = store.list(limit=1000)
    assert len(summaries) == processes * runs
    assert {s.status for s in summaries} == {"completed"}
    expected_shape = workers.expected_messages("shape", turns)
    for worker in range(processes):
        for index in range(runs):
            session_id = f"w{worker}-r{index}"
            stored = store.get(session_id)
            # Exactly this run's messages, in order: nothing lost, nothing from another run.
            assert stored == workers.expected_messages(session_id, turns)
            assert len(stored) == len(expected_shape)
    assert store.locks.held() == []
    conn = sqlite3.connect(db_path)
    try:  # every lock released, not merely expired
        assert conn.execute("SELECT COUNT(*) FROM transcript_locks").fetchone() == (0,)
    finally:
        conn.close()
    assert workers.integrity_check(db_path) == "ok"


@pytest.mark.parametrize("finished", [0, 3])
def test_kill_between_turns_keeps_exactly_the_finished_turns(tmp_path: Path,
                                                            finished: int) -> None:
    db_path = tmp_path / "crash.db"
    open_database(db_path).conn.close()
    ready = tmp_path / "ready"
    child = CTX.Process(target=workers.run_until_killed,
                        args=(str(db_path), "crashy", finished, str(ready), True, 30))
    child.start()
    _wait_for_file(ready, child)
    _kill(child)

    assert workers.integrity_check(db_path) == "ok"
    store = TranscriptStore(open_database(db_path))  # opens cleanly after the kill
    full = workers.expected_messages("crashy", finished + 2)
    stored = store.get("crashy")
    # The prompt plus three messages (text, tool call, tool result) per finished turn.
    assert stored == full[: 1 + 3 * finished]
    record = store.get_transcript("crashy")
    assert record.turn_count == finished
    assert record.message_count == len(stored)
    assert record.provider == "scripted"
    # The dead run's lock is still unexpired: the transcript reads as running, and nobody else
    # may take it over yet.
    assert record.status == "running"
    assert store.acquire("crashy", 30) is None
    later = datetime.now(UTC) + timedelta(seconds=31)
    with freeze_time(later):
        assert store.get_transcript("crashy").status == "interrupted"
        assert [s.id for s in store.list(status="interrupted")] == ["crashy"]
        assert store.acquire("crashy", 30) is not None


def test_kill_at_an_arbitrary_moment_never_leaves_half_a_turn(tmp_path: Path) -> None:
    """The child writes turns flat out; the kill usually lands inside a transaction."""
    for attempt in range(3):
        db_path = tmp_path / f"racy-{attempt}.db"
        open_database(db_path).conn.close()
        ready = tmp_path / f"ready-{attempt}"
        child = CTX.Process(target=workers.run_until_killed,
                            args=(str(db_path), "racy", 5, str(ready), False, 30))
        child.start()
        _wait_for_file(ready, child)
        _kill(child)

        assert workers.integrity_check(db_path) == "ok"
        store = TranscriptStore(open_database(db_path))
        stored = store.get("racy")
        record = store.get_transcript("racy")
        finished = (len(stored) - 1) // 3
        assert finished >= 5
        assert len(stored) == 1 + 3 * finished  # whole turns only
        assert stored == workers.expected_messages("racy", finished + 2)[: len(stored)]
        # The row and the messages were written in one transaction: they agree.
        assert record.turn_count == finished
        assert record.message_count == len(stored)


def test_two_processes_contending_for_one_session_exactly_one_runs(tmp_path: Path) -> None:
    db_path = tmp_path / "contention.db"
    open_database(db_path).conn.close()
    rounds = 5
    barrier = CTX.Barrier(2)
    lost = [CTX.Event() for _ in range(rounds)]
    out = CTX.Queue()
    children = [CTX.Process(target=workers.contend,
                            args=(str(db_path), name, rounds, barrier, lost, out))
                for name in ("a", "b")]
    for child in children:
        child.start()
    reports = [out.get(timeout=120) for _ in range(2 * rounds)]
    for child in children:
        child.join(timeout=DEADLINE_S)
        assert child.exitcode == 0

    store = TranscriptStore(open_database(db_path))
    for index in range(rounds):
        this_round = sorted((r for r in reports if r[1] == index), key=lambda r: r[2])
        statuses = [r[2] for r in this_round]
        assert statuses == ["completed", "transcript_lock_contention"]
        winner, loser = this_round
        assert winner[3] is True
        assert winner[4] is True
        assert loser[3] is False  # the loser's runner was never called
        stored = store.get(f"contended-{index}")
        assert [m["content"] for m in stored] == [
            f"prompt for contended-{index}", f"{winner[0]} ran round {index}"]
    assert store.locks.held() == []
