"""Code that runs in child processes for the reliability tests (started with ``spawn``).

Every child opens the database file itself, exactly like a second worker or a second host
would, and drives the real ``agents_api.run_loop`` with a ``TranscriptStore`` as persister and
lock. The scripted turn runner is deterministic, so the parent can compute the exact transcript
each run must leave behind (:func:`expected_messages`) without trusting the child's report.
"""

from __future__ import annotations

import sqlite3
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents_api import IterationBudget, LoopResult, Message, TurnResult, run_loop
from datamachine.storage import TranscriptStore
from datamachine.storage.database import open_database

Runner = Callable[[list[Message], dict[str, Any]], TurnResult]


def prompt(session_id: str) -> list[dict[str, Any]]:
    """The messages a run on ``session_id`` starts from."""
    return [{"role": "user", "content": f"prompt for {session_id}"}]


def scripted_turn(session_id: str, turn: int, turns: int) -> TurnResult:
    """Turn ``turn`` of a ``turns``-turn run: text plus one tool call, then a final answer."""
    if turn >= turns:
        return TurnResult(content=f"{session_id} done after {turn} turns")
    return TurnResult(
        content=f"{session_id} turn {turn}",
        tool_calls=[{"id": f"{session_id}-call-{turn}", "name": "echo",
                     "parameters": {"session": session_id, "turn": turn}}],
    )


def echo_tool(call: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The only tool: echoes its parameters, so a misplaced result names its run."""
    return {"success": True, "result": dict(call["parameters"])}


def run_scripted(session_id: str, turns: int, *, store: TranscriptStore | None,
                 runner: Runner | None = None, ttl: int = 60) -> LoopResult:
    """One run through the real loop, persisted and locked by ``store`` (if given)."""
    def default_runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return scripted_turn(session_id, context["turn"], turns)

    return run_loop(
        prompt(session_id), runner or default_runner,
        turn_budget=IterationBudget("conversation_turns", max(turns, 1)),
        tool_executor=echo_tool,
        transcript_persister=store, transcript_lock=store,
        transcript_session_id=session_id, transcript_lock_ttl=ttl,
        request={"provider": "scripted", "model": "script-1", "mode": "pipeline"},
    )


def expected_messages(session_id: str, turns: int) -> list[dict[str, Any]]:
    """The transcript a complete run must store, computed without any storage."""
    result = run_scripted(session_id, turns, store=None)
    return [m.to_dict() for m in result.messages]


def many_runs(db_path: str, worker: int, runs: int, turns: int, out: Any) -> None:
    """``runs`` runs, each on its own session; report failures (never raise) on ``out``."""
    failures: list[str] = []
    try:
        store = TranscriptStore(open_database(db_path))
        for index in range(runs):
            session_id = f"w{worker}-r{index}"
            try:
                result = run_scripted(session_id, turns, store=store)
            except Exception:
                failures.append(f"{session_id}: {traceback.format_exc()}")
                continue
            if result.status != "completed" or result.warnings:
                failures.append(f"{session_id}: {result.status} {result.error} {result.warnings}")
    except Exception:
        failures.append(f"worker {worker}: {traceback.format_exc()}")
    out.put((worker, failures))


def run_until_killed(db_path: str, session_id: str, finished_turns: int, ready: str,
                     block: bool, ttl: int) -> None:
    """Run until killed: after ``finished_turns`` turns are stored, touch ``ready``.

    ``block=True``: then block inside the next turn (a provider call that never returns), so
    the kill lands between the stored turns and the unfinished one. ``block=False``: keep going
    as fast as possible, so the kill lands at an arbitrary point, usually inside a write.
    The runner stores the starting messages at turn 1 with ``begin`` (under the lock), as an
    adapter does, so the prompt survives the kill too.
    """
    store = TranscriptStore(open_database(db_path))
    ready_path = Path(ready)
    total = 10_000

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        turn = context["turn"]
        if turn == 1:
            store.begin(session_id, messages, {"provider": "scripted", "model": "script-1"})
        if turn == finished_turns + 1:
            ready_path.write_text(str(turn))
            if block:
                threading.Event().wait()  # bounded: the parent kills this process
        return scripted_turn(session_id, turn, total)

    run_scripted(session_id, total, store=store, runner=runner, ttl=ttl)


def contend(db_path: str, name: str, rounds: int, barrier: Any, lost: list[Any],
            out: Any) -> None:
    """Race another process for one session per round; report (name, round, status, ran, held).

    The winner's runner holds the lock until the loser reports its contention (``lost``), so
    "exactly one runs" is checked while both really overlap, not one after the other.
    """
    store = TranscriptStore(open_database(db_path))
    for index in range(rounds):
        session_id = f"contended-{index}"
        calls: list[int] = []
        held: list[bool] = []

        def runner(messages: list[Message], context: dict[str, Any],
                   i: int = index, calls: list[int] = calls,
                   held: list[bool] = held) -> TurnResult:
            calls.append(context["turn"])
            held.append(lost[i].wait(timeout=30))
            return TurnResult(content=f"{name} ran round {i}")

        barrier.wait(timeout=60)
        status: str
        try:
            status = run_scripted(session_id, 1, store=store, runner=runner).status
        except Exception:
            status = traceback.format_exc()
        if status == "transcript_lock_contention":
            lost[index].set()
        out.put((name, index, status, bool(calls), all(held) and bool(held)))


# Every transcript's messages sit at positions 0 .. message_count - 1, none missing or extra,
# and no message belongs to a transcript that does not exist.
_SHAPE_CHECK = (
    "SELECT t.id FROM transcripts t LEFT JOIN transcript_messages m ON m.session_id = t.id "
    "GROUP BY t.id, t.message_count HAVING COUNT(m.position) != t.message_count "
    "OR COALESCE(MIN(m.position), 0) != 0 "
    "OR COALESCE(MAX(m.position), -1) != t.message_count - 1 "
    "UNION ALL SELECT m.session_id FROM transcript_messages m "
    "WHERE NOT EXISTS (SELECT 1 FROM transcripts t WHERE t.id = m.session_id)")


def integrity_check(target: Path | str) -> str:
    """``"ok"``, or what is wrong: SQLite's ``PRAGMA integrity_check`` of a file (through a
    connection of its own), then on either backend the shape of every stored transcript."""
    if str(target).startswith("postgresql://"):
        from datamachine.storage.database import open_handle

        handle = open_handle(str(target))
        try:
            broken = handle.conn.execute(_SHAPE_CHECK).fetchall()
        finally:
            handle.conn.close()
        return "ok" if not broken else f"transcripts out of shape: {broken}"
    conn = sqlite3.connect(target)
    try:
        verdict = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        broken = conn.execute(_SHAPE_CHECK).fetchall()
    finally:
        conn.close()
    return verdict if verdict != "ok" or not broken else f"transcripts out of shape: {broken}"
