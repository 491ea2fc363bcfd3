"""TranscriptStore as persister: per-turn writes, finalization, reading back, crash semantics."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

from agents_api import IterationBudget, LockLost, LoopResult, Message, TurnResult, run_loop
from datamachine.errors import DatabaseError, TranscriptNotFound, UsageError
from datamachine.host import Host
from datamachine.storage import TranscriptStore
from datamachine.storage._tx import connection_lock, immediate
from tests.storage import backends, workers

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def frozen() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time("2026-01-01 12:00:00") as clock:
        assert isinstance(clock, FrozenDateTimeFactory)
        yield clock


@pytest.fixture
def store(host: Host) -> TranscriptStore:
    return host.transcripts


def _turn(turn: int) -> list[Message]:
    return [Message.text("assistant", f"turn {turn}"),
            Message.tool_call("echo", {"n": turn}, turn, f"c{turn}"),
            Message.tool_result("echo", {"success": True, "result": turn}, turn, f"c{turn}",
                                str(turn))]


def _result(session_id: str, messages: list[Message], **fields: Any) -> LoopResult:
    base: dict[str, Any] = {"messages": messages, "transcript_session_id": session_id,
                            "status": "completed", "completed": True, "turn_count": 2}
    return LoopResult(**{**base, **fields})


def _dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


def test_append_turn_writes_each_turn_in_order_and_marks_running(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 60)
    assert token is not None
    store.append_turn("s", 1, _turn(1), token=token)
    frozen.tick(5)
    store.append_turn("s", 2, _turn(2), token=token)
    assert store.get("s") == _dicts(_turn(1) + _turn(2))
    record = store.get_transcript("s")
    assert record.status == "running"  # a live lock: the run is in progress
    assert (record.turn_count, record.cumulative_turn_count, record.message_count) == (2, 2, 6)
    assert record.created_at == T0  # the project clock, which freezegun controls
    assert record.updated_at == T0 + 5
    # Each turn's write also renews the run's lock, in the same transaction.
    assert record.locked_until == T0 + 5 + 60


def test_a_write_with_a_token_that_lost_its_lock_stores_nothing(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 60)
    assert token is not None
    store.append_turn("s", 1, _turn(1), token=token)
    frozen.tick(61)  # expired, and another run takes the session over
    assert store.locks.acquire("s", 60) is not None
    with pytest.raises(LockLost, match="'s'"):
        store.append_turn("s", 2, _turn(2), token=token)
    record = store.get_transcript("s")
    assert record.messages == _dicts(_turn(1))
    assert (record.turn_count, record.message_count) == (1, 3)


def test_a_running_transcript_without_a_live_lock_reads_as_interrupted(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("killed", 30)
    assert token is not None
    store.append_turn("killed", 1, _turn(1), token=token)
    assert store.get_transcript("killed").status == "running"
    frozen.tick(31)  # the process died: nobody renewed the lock
    record = store.get_transcript("killed")
    assert record.status == "interrupted"
    assert record.messages == _dicts(_turn(1))
    assert [s.id for s in store.list(status="interrupted")] == ["killed"]
    assert store.list(status="running") == []


def test_begin_turns_and_persist_store_the_whole_run_in_order(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    prompt = [Message.text("system", "be brief"), Message.text("user", "hi")]
    turns = _turn(1) + _turn(2)
    store.begin("s", prompt)
    store.append_turn("s", 1, turns[:3])
    store.append_turn("s", 2, turns[3:])
    frozen.tick(2)
    summary = Message.text("assistant", "summary after the last turn")
    messages = [*prompt, *turns, summary]
    result = _result("s", messages, usage={"prompt_tokens": 7, "completion_tokens": 3,
                                           "total_tokens": 10},
                     budgets={"conversation_turns": {"current": 2, "ceiling": 5}})
    assert store.persist(messages, {"provider": "scripted", "model": "m1", "mode": "chat"},
                         result) == "s"
    record = store.get_transcript("s")
    assert record.messages == _dicts(messages)
    assert record.status == "completed"
    assert (record.provider, record.model, record.mode) == ("scripted", "m1", "chat")
    assert record.usage["total_tokens"] == 10
    assert record.budgets == {"conversation_turns": {"current": 2, "ceiling": 5}}
    assert record.result["status"] == "completed"
    assert record.result["cumulative_turn_count"] == 2
    assert (record.turn_count, record.cumulative_turn_count, record.message_count) == (2, 2, 9)
    assert record.updated_at == T0 + 2


def test_begin_stores_the_prompt_before_the_first_turn(store: TranscriptStore) -> None:
    prompt = [Message.text("user", "hi")]
    store.begin("s", prompt, {"provider": "scripted", "model": "m1"})
    assert store.get("s") == _dicts(prompt)
    store.append_turn("s", 1, _turn(1))
    messages = prompt + _turn(1)
    store.persist(messages, {}, _result("s", messages, turn_count=1))
    record = store.get_transcript("s")
    assert record.messages == _dicts(messages)
    assert (record.provider, record.model) == ("scripted", "m1")  # kept from begin()


def test_persist_writes_everything_when_no_turn_was_appended(store: TranscriptStore) -> None:
    """A run whose first turn failed: nothing was appended, persist stores what there is."""
    messages = [Message.text("user", "hi")]
    result = _result("s", messages, status="error", completed=False, turn_count=1,
                     error="provider down", error_code="turn_failed")
    store.persist(messages, {}, result)
    record = store.get_transcript("s")
    assert record.messages == _dicts(messages)
    assert record.status == "error"
    assert record.result["error"] == "provider down"


def test_a_continued_run_appends_after_the_stored_messages_and_counts_cumulatively(
    store: TranscriptStore,
) -> None:
    first = [Message.text("user", "hi"), *_turn(1), *_turn(2)]
    store.persist(first, {"provider": "scripted"}, _result("s", first, status="budget_exceeded"))
    # A continuation starts from the stored messages, plus a new user message.
    stored = [Message(**m) for m in store.get("s")]
    follow_up = Message.text("user", "go on")
    store.begin("s", [*stored, follow_up])
    store.append_turn("s", 1, _turn(3))
    messages = [*stored, follow_up, *_turn(3)]
    store.persist(messages, {}, _result("s", messages, turn_count=1))
    record = store.get_transcript("s")
    assert record.messages == _dicts(messages)
    assert (record.turn_count, record.cumulative_turn_count) == (1, 3)
    assert record.provider == "scripted"  # a continuation does not forget the provider


def test_persist_of_a_lock_contention_result_writes_nothing(store: TranscriptStore) -> None:
    messages = [Message.text("user", "hi")]
    result = _result("s", messages, status="transcript_lock_contention", completed=False)
    assert store.persist(messages, {}, result) == "s"
    assert not store.exists("s")


def test_a_failed_turn_write_leaves_nothing_of_that_turn(host: Host,
                                                         store: TranscriptStore) -> None:
    store.append_turn("s", 1, _turn(1))
    # Refuse the turn's second message, so its INSERT fails midway.
    with backends.refuse_message_at(host, 4), pytest.raises(DatabaseError, match="append a turn"):
        store.append_turn("s", 2, _turn(2))
    assert not host.handle.conn.in_transaction
    rows = host.handle.conn.execute(
        "SELECT position FROM transcript_messages WHERE session_id = 's' ORDER BY position"
    ).fetchall()
    assert rows == [(0,), (1,), (2,)]  # the turn's first message was rolled back too
    record = store.get_transcript("s")
    assert (record.turn_count, record.message_count) == (1, 3)


def test_a_write_inside_the_callers_transaction_rolls_back_with_it(
    host: Host, store: TranscriptStore
) -> None:
    class ChangedItsMind(Exception):
        pass

    def write_then_fail() -> None:
        with immediate(host.handle, connection_lock(host.handle), "test", "the caller's"):
            store.append_turn("s", 1, _turn(1))
            assert store.exists("s")  # written, inside the caller's transaction
            raise ChangedItsMind

    with pytest.raises(ChangedItsMind):
        write_then_fail()
    assert not store.exists("s")
    assert not host.handle.conn.in_transaction


def test_values_json_cannot_hold_are_stored_as_text(store: TranscriptStore) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    message = Message.tool_result("clock", {"success": True, "result": when}, 1, "c1", "now")
    store.append_turn("s", 1, [message])
    assert store.get("s")[0]["payload"]["result"] == when.isoformat()


def test_unknown_transcripts_are_reported_by_id(store: TranscriptStore) -> None:
    with pytest.raises(TranscriptNotFound, match="'nope'"):
        store.get("nope")
    with pytest.raises(TranscriptNotFound, match="'nope'"):
        store.get_transcript("nope")
    assert store.exists("nope") is False


@pytest.mark.parametrize(("turn", "messages", "match"), [
    ("one", [Message.text("user", "a")], "turn must be"),
    (1.5, [Message.text("user", "a")], "turn must be"),
    (True, [Message.text("user", "a")], "turn must be"),
    (0, [Message.text("user", "a")], "turn must be"),
    (float("nan"), [Message.text("user", "a")], "turn must be"),
    (10**30, [Message.text("user", "a")], "turn must be"),
    (1, "hello", "messages must be a list"),
    (1, None, "messages must be a list"),
    (1, [{"role": "user"}, {"content": "no role"}], r"messages\[1\]"),
])
def test_a_bad_append_turn_is_refused_before_anything_is_stored(
        store: TranscriptStore, turn: Any, messages: Any, match: str) -> None:
    store.append_turn("good", 1, _turn(1))
    with pytest.raises(UsageError, match=match):
        store.append_turn("x", turn, messages)
    assert store.exists("x") is False
    assert [s.id for s in store.list()] == ["good"]


def test_a_damaged_row_is_left_out_of_the_listing_and_logged(
        host: Host, store: TranscriptStore, caplog: pytest.LogCaptureFixture) -> None:
    # A row an older version stored (a fractional turn count, broken JSON) must not cost the
    # listing of every other transcript. (PostgreSQL's bigint column cannot even hold 1.5.)
    fraction = not backends.is_postgres(host)
    for sid in ("good", "fraction", "json"):
        store.append_turn(sid, 1, _turn(1))
    if fraction:
        store._db.conn.execute("UPDATE transcripts SET turn_count = 1.5 WHERE id = 'fraction'")
    store._db.conn.execute("UPDATE transcripts SET usage = '{oops' WHERE id = 'json'")
    with caplog.at_level("WARNING", logger="datamachine.storage"):
        listed = sorted(s.id for s in store.list())
    assert listed == (["good"] if fraction else ["fraction", "good"])
    assert "'json'" in caplog.text
    if fraction:
        assert "'fraction'" in caplog.text
        assert "turn_count" in caplog.text
        with pytest.raises(DatabaseError,
                           match=r"transcript row 'fraction' .* damaged \(turn_count\)"):
            store.summary("fraction")
    with pytest.raises(DatabaseError, match="transcript row 'json'"):
        store.get_transcript("json")


@pytest.mark.parametrize("status", ["done", None, 5])
def test_set_status_and_list_refuse_a_status_a_transcript_cannot_have(
        store: TranscriptStore, status: Any) -> None:
    store.append_turn("s", 1, _turn(1))
    with pytest.raises(UsageError, match="status must be one of"):
        store.set_status("s", status)
    if status is not None:  # None is "any status" to list()
        with pytest.raises(UsageError, match="status must be one of"):
            store.list(status=status)
    assert store.summary("s").status == "interrupted"  # unchanged: running, and no lock held


@pytest.mark.parametrize("session_id", [None, 5, ["a"], 2**63, "", "\ud800"])
def test_every_read_names_a_session_id_that_cannot_be_one(store: TranscriptStore,
                                                           session_id: Any) -> None:
    for read in (store.get, store.exists, store.summary, store.get_transcript):
        with pytest.raises(UsageError, match="A session id must be"):
            read(session_id)


def test_list_is_newest_first_and_bounded(store: TranscriptStore,
                                          frozen: FrozenDateTimeFactory) -> None:
    for name in ("a", "b", "c"):
        messages = [Message.text("user", name)]
        store.persist(messages, {}, _result(name, messages))
        frozen.tick(1)
    assert [s.id for s in store.list()] == ["c", "b", "a"]
    assert [s.id for s in store.list(limit=2)] == ["c", "b"]
    assert [s.id for s in store.list(status="completed", limit=1)] == ["c"]
    with pytest.raises(UsageError):
        store.list(limit=0)
    assert len(store.list(limit=2**70)) == 3  # SQLite's LIMIT cannot hold it: all of them


def test_run_loop_persists_renews_and_releases_through_the_store(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    expiries: list[float | None] = []

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        info = store.locks.info("run")
        expiries.append(info.expires_at if info else None)
        frozen.tick(100)  # each turn takes longer than the TTL; renewals keep the lock
        return workers.scripted_turn("run", context["turn"], 3)

    result = run_loop(
        [{"role": "user", "content": "prompt for run"}], runner,
        turn_budget=IterationBudget("conversation_turns", 5), tool_executor=workers.echo_tool,
        transcript_persister=store, transcript_lock=store, transcript_session_id="run",
        transcript_lock_ttl=150, request={"provider": "scripted", "model": "m"},
    )
    assert result.status == "completed"
    assert result.transcript_session_id == "run"
    assert expiries == [T0 + 150, T0 + 100 + 150, T0 + 200 + 150]
    assert store.locks.info("run") is None  # released
    record = store.get_transcript("run")
    assert record.messages == [m.to_dict() for m in result.messages]
    assert record.status == "completed"
    assert record.turn_count == 3


def test_run_loop_on_a_locked_session_never_calls_the_runner(store: TranscriptStore) -> None:
    assert store.acquire("busy", 60) is not None
    calls: list[int] = []

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        calls.append(context["turn"])
        return TurnResult(content="should not run")

    result = run_loop(
        [{"role": "user", "content": "hi"}], runner,
        turn_budget=IterationBudget("conversation_turns", 3),
        transcript_persister=store, transcript_lock=store, transcript_session_id="busy",
    )
    assert result.status == "transcript_lock_contention"
    assert calls == []
    assert not store.exists("busy")


def test_a_begin_whose_commit_fails_leaves_nothing_claiming_the_messages_are_stored(
    host: Host, store: TranscriptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [Message.text("system", "sys"), Message.text("user", "hello")]
    assert store.acquire("s", 60) is not None
    with backends.failing_commits(host, monkeypatch, once=True), \
            pytest.raises(DatabaseError, match="disk I/O error"):
        store.begin("s", messages, {"provider": "p"})
    store.persist(messages, {"provider": "p"},
                  LoopResult(messages=messages, transcript_session_id="s", status="error"))
    assert store.get("s") == [m.to_dict() for m in messages]  # the final write stored them


def test_writes_inside_a_callers_transaction_are_not_trusted_after_it(
    store: TranscriptStore
) -> None:
    messages = [Message.text("user", "hello")]
    assert store.acquire("s", 60) is not None
    conn = store._db.conn
    conn.execute("BEGIN")
    store.begin("s", messages)
    store.append_turn("s", 1, _turn(1))
    conn.execute("ROLLBACK")  # the caller's transaction takes both writes back
    store.persist([*messages, *_turn(1)], {},
                  LoopResult(messages=[], transcript_session_id="s", turn_count=1))
    assert store.get_transcript("s").message_count == 4


def test_every_turn_writes_the_exact_counts_with_its_messages(
    host: Host, store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    # A finished run first, so the session has a cumulative count to continue from.
    first = [Message.text("user", "hi"), *_turn(1), *_turn(2)]
    store.persist(first, {}, _result("s", first))
    token = store.acquire("s", 60)
    assert token is not None
    store.begin("s", [*first, Message.text("user", "again")], token=token)
    for turn in (1, 2, 3):
        frozen.tick(0.1)
        store.append_turn("s", turn, _turn(turn), token=token)
        row = host.handle.conn.execute(
            "SELECT message_count, turn_count, cumulative_turn_count FROM transcripts "
            "WHERE id = 's'").fetchone()
        assert row == (8 + 3 * turn, turn, 2 + turn)
    other = TranscriptStore(host.handle)
    record = other.get_transcript("s")
    assert record.status == "running"
    assert record.message_count == len(record.messages) == 17


def test_a_run_killed_between_row_writes_loses_no_count_and_the_next_run_continues(
    host: Host, store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 60)
    assert token is not None
    store.begin("s", [Message.text("user", "hi")])
    for turn in (1, 2, 3, 4):
        frozen.tick(0.1)
        store.append_turn("s", turn, _turn(turn))
    # The process dies here: no persist, no release. Its lock runs out.
    frozen.tick(61)
    record = TranscriptStore(host.handle).get_transcript("s")
    assert record.status == "interrupted"
    assert (record.message_count, record.turn_count, record.cumulative_turn_count) == (13, 4, 4)

    # The next process continues the session without begin(): its turns go after the stored
    # messages, and the cumulative count goes on from the killed run's last turn.
    successor = TranscriptStore(host.handle)
    token = successor.acquire("s", 60)
    assert token is not None
    successor.append_turn("s", 1, _turn(5))
    record = successor.get_transcript("s")
    assert (record.message_count, record.turn_count, record.cumulative_turn_count) == (16, 1, 5)
    positions = [row[0] for row in host.handle.conn.execute(
        "SELECT position FROM transcript_messages WHERE session_id = 's' ORDER BY position")]
    assert positions == list(range(16))


def test_a_run_through_the_store_frees_its_lock_with_its_final_write(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    result = workers.run_scripted("free", 2, store=store)
    assert result.status == "completed"
    assert store.locks.info("free") is None
    record = store.get_transcript("free")
    assert record.status == "completed"
    assert record.messages == [m.to_dict() for m in result.messages]
    assert store.acquire("free", 60) is not None  # free for the next run at once


def test_a_writer_counts_a_chat_turn_in_the_turns_own_transaction(
    host: Host, store: TranscriptStore
) -> None:
    token = store.acquire("s", 60)
    assert token is not None
    seen: list[tuple[int, bool]] = []

    def on_turn(conn: Any, turn: int, now: float) -> None:
        seen.append((turn, conn.in_transaction))
        if turn == 2:
            raise RuntimeError("the count could not be written")

    writer = store.open_writer("s", token, 60, on_turn=on_turn)
    writer.begin([Message.text("user", "hi")], {})
    writer.append_turn(1, _turn(1))
    with pytest.raises(RuntimeError):
        writer.append_turn(2, _turn(2))
    assert seen == [(1, True), (2, True)]
    # The failed count took its turn with it: nothing of turn 2 is stored.
    record = store.get_transcript("s")
    assert (record.turn_count, record.message_count) == (1, 4)


def test_a_writer_whose_lock_was_taken_over_writes_nothing_more(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    writer = store.open_writer("s", token, 10)
    writer.begin([Message.text("user", "hi")], {})
    writer.append_turn(1, _turn(1))
    frozen.tick(11)
    assert store.locks.acquire("s", 60) is not None  # the next run takes the session
    for write in (lambda: writer.append_turn(2, _turn(2)), writer.renew,
                  lambda: writer.persist([], {}, _result("s", []))):
        with pytest.raises(LockLost):
            write()
    assert store.get_transcript("s").message_count == 4
    assert writer.release() is False  # it was not this run's to free


def test_a_lock_taken_over_before_persist_is_left_to_its_new_holder(
    host: Host, store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    frozen.tick(11)  # expired: another process takes the session over
    other = TranscriptStore(host.handle)
    theirs = other.acquire("s", 60)
    assert theirs is not None
    messages = [Message.text("user", "hi")]
    store.persist(messages, {}, _result("s", messages))
    assert store.release("s", token) is False  # it no longer held the lock
    info = other.locks.info("s")
    assert info is not None
    assert other.release("s", theirs) is True


def test_a_persist_that_fails_keeps_the_lock_for_release(
    host: Host, store: TranscriptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = store.acquire("s", 60)
    assert token is not None
    messages = [Message.text("user", "hi")]
    with backends.failing_commits(host, monkeypatch), \
            pytest.raises(DatabaseError, match="disk I/O error"):
        store.persist(messages, {}, _result("s", messages))
    assert store.locks.info("s") is not None  # the rollback kept it
    assert store.release("s", token) is True
    assert store.locks.info("s") is None


def test_begin_after_a_killed_run_writes_the_counts_it_reconciled(
    host: Host, store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    def killed_run(store: TranscriptStore, first: list[Message], turns: int) -> None:
        token = store.acquire("s", 10)
        assert token is not None
        store.begin("s", first)
        for turn in range(1, turns + 1):
            frozen.tick(0.1)
            store.append_turn("s", turn, _turn(turn))
        frozen.tick(11)  # the process dies; its lock runs out

    prompt = [Message.text("user", "hi")]
    killed_run(store, prompt, 4)
    stored = store.get("s")
    again = [Message(**m) for m in stored] + [Message.text("user", "again")]
    second = TranscriptStore(host.handle)
    killed_run(second, again, 1)  # dies too, before any row write of its own
    record = TranscriptStore(host.handle).get_transcript("s")
    assert (record.turn_count, record.cumulative_turn_count) == (1, 5)
    assert record.message_count == len(record.messages) == 13 + 1 + 3


def test_a_turn_without_messages_still_counts(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    store.begin("s", [Message.text("user", "hi")])
    store.append_turn("s", 1, _turn(1))
    store.append_turn("s", 2, [])
    store.append_turn("s", 3, [])
    frozen.tick(11)  # killed
    record = store.get_transcript("s")
    assert (record.status, record.turn_count, record.cumulative_turn_count) == (
        "interrupted", 3, 3)
