"""Concurrent use loses nothing (DESIGN.md section 11): real processes on a real database file.

- several processes chatting on (or continuing) one session: every completed run's messages
  are stored, in order, each answer right after the history the model saw; the other calls get
  ``transcript_lock_contention`` and store nothing;
- a turn that outlives its lock while another run takes the session over writes nothing after
  the takeover and returns ``transcript_lock_lost``;
- kill -9 at 50 random points: integrity holds, whole turns only, the chat session's count
  equals its stored turns, the lock recovers after its TTL, ``continue_conversation`` resumes;
- processes booting one new file at the same instant all succeed.

Children come from a forkserver that imported the project once (``session_workers``). No test
sleeps to let time pass: processes agree on frozen times, and the parent polls (briefly, with a
deadline) only for a child's progress.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

import bootstrap
from tests.storage import session_workers as workers
from tests.storage.workers import integrity_check as _integrity

CTX = multiprocessing.get_context("forkserver")
CTX.set_forkserver_preload(["bootstrap", "datamachine.conversation.chat",
                            "tests.storage.session_workers"])
DEADLINE_S = 120.0


def _run_children(target: Any, args_for: list[tuple[Any, ...]], reports: int) -> list[Any]:
    out = CTX.Queue()
    children = [CTX.Process(target=target, args=(*args, out)) for args in args_for]
    for child in children:
        child.start()
    found = [out.get(timeout=DEADLINE_S) for _ in range(reports)]
    for child in children:
        child.join(timeout=DEADLINE_S)
        assert child.exitcode == 0
    return found


def _check_chat_history(stored: list[dict[str, Any]], completed: list[str]) -> None:
    """Every completed chat's message is stored once, its answer right after it, and the
    answer was made from exactly the history stored before it."""
    texts = [m["content"] for m in stored]
    users = [m["content"] for m in stored if m["role"] == "user"]
    assert sorted(users) == sorted(completed)  # nothing lost, nothing from a refused call
    for text in completed:
        position = texts.index(text)
        assert texts[position + 1] == workers.answer_for(text, position + 1)
    assert len(stored) == 2 * len(completed)


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_chatting_on_one_session_lose_no_message(db_target: str,
                                                          processes: int) -> None:
    db_path = db_target
    with workers.boot_host(str(db_path)) as host:
        session = host.chat_sessions.create(max_turns="unlimited")
    barrier = CTX.Barrier(processes)
    reports = _run_children(workers.chat_many,
                            [(str(db_path), f"p{n}", session.id, 200, barrier)
                             for n in range(processes)], processes)
    assert [error for _, _, error in reports if error] == []
    outcomes = [outcome for _, found, _ in reports for outcome in found]
    assert len(outcomes) == 200 * processes
    assert {status for _, status in outcomes} <= {"completed", "transcript_lock_contention"}
    completed = [text for text, status in outcomes if status == "completed"]
    assert completed  # at least one chat ran (the rest waited on no lock: they were refused)
    with workers.boot_host(str(db_path)) as host:
        stored = host.transcripts.get(session.id)
        _check_chat_history(stored, completed)
        # The session's count moved with every stored turn, and only with them.
        assert host.chat_sessions.get(session.id).turn_count == len(completed)
        record = host.transcripts.get_transcript(session.id)
        assert record.cumulative_turn_count == len(completed)
        assert record.message_count == len(stored)
        assert host.transcripts.locks.held() == []
    assert _integrity(db_path) == "ok"


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_continuing_one_transcript_lose_no_turn(db_target: str,
                                                         processes: int) -> None:
    db_path = db_target
    with workers.boot_host(str(db_path)) as host:
        first = host.run_conversation([{"role": "user", "content": "start"}], mode="chat",
                                      payload={"transcript_session_id": "shared"})
        assert first.status == "completed"
    barrier = CTX.Barrier(processes)
    reports = _run_children(workers.continue_many,
                            [(str(db_path), f"p{n}", "shared", 200, barrier)
                             for n in range(processes)], processes)
    assert [error for _, _, error in reports if error] == []
    outcomes = [status for _, found, _ in reports for _, status in found]
    assert set(outcomes) <= {"completed", "transcript_lock_contention"}
    continued = outcomes.count("completed")
    assert continued
    with workers.boot_host(str(db_path)) as host:
        stored = host.transcripts.get("shared")
        # One answer per completed continuation, each made from exactly the messages stored
        # before it: no two runs ever started from the same history.
        assert [m["content"] for m in stored] == ["start", *(
            workers.answer_for("start", seen) for seen in range(1, continued + 2))]
        record = host.transcripts.get_transcript("shared")
        assert record.cumulative_turn_count == 1 + continued
        assert record.status == "completed"
    assert _integrity(db_path) == "ok"


def test_a_turn_that_outlives_its_lock_writes_nothing_after_the_takeover(
    db_target: str,
) -> None:
    db_path = db_target
    with freeze_time(workers.T0), workers.boot_host(str(db_path)) as host:
        session = host.chat_sessions.create(max_turns="unlimited")
        assert host.chat(session.id, "hello").status == "completed"
    started, release, out = CTX.Event(), CTX.Event(), CTX.Queue()
    stale = CTX.Process(target=workers.stale_chat,
                        args=(str(db_path), session.id, started, release, out))
    stale.start()
    assert started.wait(timeout=DEADLINE_S)  # the stale run holds the lock, mid-turn
    # 61 s later (past the stale run's 60 s TTL), another run takes the session over.
    later = workers.T0 + dt.timedelta(seconds=61)
    with freeze_time(later), workers.boot_host(str(db_path)) as host:
        taken = host.chat(session.id, "from the new run")
        assert taken.status == "completed"
    release.set()
    status, error_code, error, failure = out.get(timeout=DEADLINE_S)
    stale.join(timeout=DEADLINE_S)
    assert failure is None
    assert (status, error_code) == ("error", "transcript_lock_lost")
    assert "transcript_lock_ttl" in error
    with workers.boot_host(str(db_path)) as host:
        stored = [m["content"] for m in host.transcripts.get(session.id)]
        # One coherent conversation: the stale run's message was stored while it held the
        # lock (the new run saw it); its answer, made after the takeover, is not there.
        assert stored == ["hello", workers.answer_for("hello", 1), "from the stale run",
                          "from the new run", workers.answer_for("from the new run", 4)]
        assert host.chat_sessions.get(session.id).turn_count == 2
        assert host.transcripts.get_transcript(session.id).status == "completed"
    assert _integrity(db_path) == "ok"


def _wait_for_lines(path: Path, count: int, process: Any) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists() or path.read_text().count("\n") < count:
        assert process.is_alive(), f"child exited early with code {process.exitcode}"
        assert time.monotonic() < deadline, "child made no progress"
        time.sleep(0.002)


def _check_after_kill(db_path: str, session_id: str, iteration: int) -> int:
    """Whole turns only, the session's count equals its stored turns; the stored turns."""
    assert _integrity(db_path) == "ok"
    with freeze_time(workers.T0 + dt.timedelta(hours=iteration, minutes=30)):
        host = bootstrap.boot(db_path=db_path, load_entrypoints=False)
        try:
            if not host.transcripts.exists(session_id):  # killed before its first write
                assert host.chat_sessions.get(session_id).turn_count == 0
                return 0
            stored = host.transcripts.get(session_id)
            for index, message in enumerate(stored):
                if message["type"] == "tool_call":  # every call has its result right after
                    following = stored[index + 1]
                    assert following["type"] == "tool_result"
                    assert (following["metadata"]["tool_call_id"]
                            == message["metadata"]["tool_call_id"])
            turns = sum(1 for m in stored if m["role"] == "assistant" and m["type"] == "text")
            record = host.transcripts.get_transcript(session_id)
            assert record.message_count == len(stored)
            assert record.cumulative_turn_count == turns
            assert host.chat_sessions.get(session_id).turn_count == turns
            # The dead run's lock has run out (TTL 300 s): the session can be taken again.
            assert record.status in ("completed", "interrupted")
            token = host.transcripts.acquire(session_id, 300)
            assert token is not None
            assert host.transcripts.release(session_id, token)
        finally:
            host.close()
    return turns


def test_kill_9_at_fifty_random_points_leaves_whole_turns_and_exact_counts(
    db_target: str, tmp_path: Path,
) -> None:
    db_path = db_target
    with freeze_time(workers.T0), workers.boot_host(str(db_path)) as host:
        session = host.chat_sessions.create(max_turns="unlimited")
    chooser = random.Random(20261124)
    turns = 0
    for iteration in range(1, 51):
        progress = tmp_path / f"progress-{iteration}"
        child = CTX.Process(target=workers.chat_until_killed,
                            args=(str(db_path), session.id, iteration, str(progress)))
        child.start()
        _wait_for_lines(progress, chooser.randint(0, 2), child)
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)  # wherever it is: between or inside transactions
        child.join(timeout=DEADLINE_S)
        assert child.exitcode == -signal.SIGKILL
        now = _check_after_kill(db_path, session.id, iteration)
        assert now >= turns  # nothing stored is ever lost
        turns = now
    assert turns > 50
    later = workers.T0 + dt.timedelta(hours=60)
    with freeze_time(later), bootstrap.boot(db_path=db_path, load_entrypoints=False,
                                            plugins=[workers.SeeingModel(steps=1)]) as host:
        resumed = host.continue_conversation(session.id, extend_by=3, tools=[workers.step])
        assert resumed.status == "completed"
        assert resumed.cumulative_turn_count == turns + resumed.turn_count
    assert _check_after_kill(db_path, session.id, 61) == turns + resumed.turn_count


def test_processes_booting_one_new_database_at_the_same_instant_all_succeed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    processes = 8
    if backend == "postgresql":  # new, empty databases: the first boot migrates them
        rounds = 10
        paths = request.getfixturevalue("postgres_server").new_databases(rounds)
    else:
        rounds = 50
        paths = [str(tmp_path / f"fresh-{index}.db") for index in range(rounds)]
    barrier = CTX.Barrier(processes)
    reports = _run_children(workers.boot_rounds,
                            [(f"p{n}", rounds, paths, barrier) for n in range(processes)],
                            processes)
    assert [failure for _, failures in reports for failure in failures] == []
    for path in paths:
        with bootstrap.boot(db_path=path, load_entrypoints=False) as host:
            assert host.settings.get("site_id")  # one site id, written once
        assert _integrity(path) == "ok"
