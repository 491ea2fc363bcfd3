"""What only the PostgreSQL backend has: choosing it, refusing what is not ours, its schema, and
writers of different sessions running side by side while writers of one session take turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import bootstrap
from datamachine.errors import DatabaseError, UsageError
from datamachine.host import Host
from datamachine.storage._pg import PgHandle, translate
from datamachine.storage._tx import connection_lock, immediate
from datamachine.storage.database import MIGRATION_NAMES
from datamachine.storage.pg_migrations import PG_MIGRATIONS
from tests.postgres_server import PostgresServer

DEADLINE_S = 30.0


@pytest.fixture
def pg_host(pg_url: str) -> Iterator[Host]:
    host = bootstrap.boot(db_path=pg_url, load_entrypoints=False)
    try:
        yield host
    finally:
        host.close()


def test_both_backends_number_the_same_migrations() -> None:
    assert tuple(PG_MIGRATIONS) == MIGRATION_NAMES


def test_datamachine_db_with_a_url_picks_postgresql(pg_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMACHINE_DB", pg_url)
    with bootstrap.boot(load_entrypoints=False) as host:
        assert isinstance(host.handle, PgHandle)
        assert host.db_path is None
        host.settings.set("max_turns", 7)
    with bootstrap.boot(db_path=pg_url, load_entrypoints=False) as again:
        assert again.settings.get("max_turns") == 7


def test_host_db_on_postgresql_says_what_to_use_instead(pg_host: Host) -> None:
    with pytest.raises(DatabaseError, match=r"sqlite-utils.*host\.transcripts"):
        _ = pg_host.db


def test_a_server_nobody_listens_on_fails_at_once_without_the_password(
        postgres_server: PostgresServer) -> None:
    started = time.monotonic()
    url = f"postgresql://dm:s3cret@127.0.0.1:{_closed_port()}/nothing"
    with pytest.raises(DatabaseError, match="Cannot connect to the database") as info:
        bootstrap.boot(db_path=url, load_entrypoints=False)
    assert "s3cret" not in str(info.value)
    assert "127.0.0.1" in str(info.value)
    assert time.monotonic() - started < 10


def test_a_missing_database_is_named(postgres_server: PostgresServer) -> None:
    with pytest.raises(DatabaseError, match='database "no_such_db" does not exist'):
        bootstrap.boot(db_path=postgres_server.url_for("no_such_db"), load_entrypoints=False)


def test_a_datamachine_schema_of_another_application_is_refused_and_left_untouched(
        postgres_server: PostgresServer) -> None:
    [url] = postgres_server.new_databases(1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA datamachine")
        conn.execute("CREATE TABLE datamachine.orders (id int)")
    with pytest.raises(DatabaseError, match=r"another application \(orders\)"):
        bootstrap.boot(db_path=url, load_entrypoints=False)
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = "
                              "'datamachine'").fetchall()
    assert tables == [("orders",)]


def test_the_tables_live_in_their_own_schema(pg_host: Host, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        public = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = "
                              "'public'").fetchall()
    assert public == []


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800"])
def test_text_the_server_cannot_hold_is_a_usage_error(pg_host: Host, bad: str) -> None:
    with pytest.raises(UsageError):
        pg_host.transcripts.append_turn(bad, 1, [{"role": "user", "content": "x"}])
    with pytest.raises(UsageError):
        pg_host.jobs.create(flow_step_id=bad)


def test_placeholders_and_percent_signs_are_translated_outside_quotes_only() -> None:
    assert translate("SELECT ? WHERE a LIKE '%?%' AND b = ?") == \
        "SELECT %s WHERE a LIKE '%%?%%' AND b = %s"


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()").fetchone()
    return bool(row and row[0])


def _write_in_thread(host: Host, keys: tuple[str, ...], done: threading.Event,
                     errors: list[BaseException]) -> threading.Thread:
    def write() -> None:
        try:
            with immediate(host.handle, connection_lock(host.handle), "test", "write",
                           keys) as conn:
                conn.execute("SELECT 1")
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_writers_of_other_sessions_pass_a_held_session_and_its_own_writers_wait(
        pg_host: Host, pg_url: str) -> None:
    errors: list[BaseException] = []
    holder = immediate(pg_host.handle, connection_lock(pg_host.handle), "test", "hold",
                       ("session:a",))
    # The locks go out with the transaction's first statement (BEGIN travels with it).
    holder.__enter__().execute("SELECT 1")
    try:
        other_done = threading.Event()
        other = _write_in_thread(pg_host, ("session:b",), other_done, errors)
        assert other_done.wait(DEADLINE_S)  # another session: not held up
        other.join(timeout=30)
        same_done = threading.Event()
        same = _write_in_thread(pg_host, ("session:a",), same_done, errors)
        deadline = time.monotonic() + DEADLINE_S
        while not _waiting_on_a_lock(pg_url):  # the server says it waits for our lock
            assert time.monotonic() < deadline
            assert not same_done.is_set()
            time.sleep(0.01)
        assert not same_done.is_set()
    finally:
        holder.__exit__(None, None, None)
    assert same_done.wait(DEADLINE_S)
    same.join(timeout=30)
    assert errors == []


def test_an_unkeyed_write_waits_for_every_keyed_one(pg_host: Host, pg_url: str) -> None:
    errors: list[BaseException] = []
    holder: Any = immediate(pg_host.handle, connection_lock(pg_host.handle), "test", "hold",
                            ("session:a",))
    holder.__enter__().execute("SELECT 1")
    try:
        done = threading.Event()
        whole = _write_in_thread(pg_host, (), done, errors)  # no key: the whole database
        deadline = time.monotonic() + DEADLINE_S
        while not _waiting_on_a_lock(pg_url):
            assert time.monotonic() < deadline
            assert not done.is_set()
            time.sleep(0.01)
    finally:
        holder.__exit__(None, None, None)
    assert done.wait(DEADLINE_S)
    whole.join(timeout=30)
    assert errors == []


def test_a_caught_statement_error_inside_a_write_is_not_a_silent_rollback(
        pg_host: Host) -> None:
    import contextlib as ctx

    def write() -> None:
        with immediate(pg_host.handle, connection_lock(pg_host.handle), "test",
                       "store two settings") as conn:
            conn.execute("INSERT INTO settings (key, value, updated_at) VALUES ('x_a', '1', 0)")
            with ctx.suppress(DatabaseError):  # the duplicate fails; the caller carries on
                conn.execute("INSERT INTO settings (key, value, updated_at) "
                             "VALUES ('x_a', '2', 0)")

    with pytest.raises(DatabaseError, match="stored none of it"):
        write()
    assert pg_host.settings.get("x_a") is None


def test_a_batch_longer_than_one_statement_can_carry_is_stored_whole(pg_host: Host) -> None:
    # 5 parameters a message: 14,000 messages are more than one statement's 65,535.
    messages = [{"role": "user", "content": f"m{n}"} for n in range(14_000)]
    pg_host.transcripts.begin("big", messages)
    assert pg_host.transcripts.summary("big").message_count == 14_000


@pytest.mark.parametrize("secret_url", [
    "postgresql://127.0.0.1:{port}/db?user=u&password=s3cretA",
    "postgresql://u:s3%zzcretA@127.0.0.1:{port}/db",
    "postgresql://u:s3cr@tA@127.0.0.1:{port}/db",
])
def test_no_error_shows_the_password_however_the_url_holds_it(secret_url: str) -> None:
    with pytest.raises(DatabaseError) as info:
        bootstrap.boot(db_path=secret_url.format(port=_closed_port()), load_entrypoints=False)
    assert "s3cr" not in str(info.value)
    assert "cretA" not in str(info.value)


def test_a_write_waiting_on_a_stuck_lock_gives_up_like_sqlite_s_busy_timeout(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from datamachine.storage import _pg

    monkeypatch.setattr(_pg, "LOCK_TIMEOUT_MS", 300)
    with bootstrap.boot(db_path=pg_url, load_entrypoints=False) as stuck, \
            bootstrap.boot(db_path=pg_url, load_entrypoints=False) as other:
        holder: Any = immediate(stuck.handle, connection_lock(stuck.handle), "test", "hold",
                                ("session:s",))
        holder.__enter__().execute("SELECT 1")
        try:
            with pytest.raises(DatabaseError, match="lock timeout"):
                other.transcripts.acquire("s", 60)
        finally:
            holder.__exit__(None, None, None)
        assert other.transcripts.acquire("s", 60) is not None


def test_connections_the_server_dropped_are_replaced_without_an_error(
        pg_host: Host, pg_url: str) -> None:
    pg_host.settings.set("x_before", 1)
    assert pg_host.transcripts.list() == []
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
            "application_name = 'datamachine' AND datname = current_database()").fetchone()
    assert killed is not None
    assert killed[0] >= 1
    assert pg_host.transcripts.list() == []          # a read, outside a transaction
    pg_host.settings.set("x_after", 2)                # a write transaction
    assert pg_host.settings.get("x_after") == 2


def test_another_thread_s_batch_does_not_hide_a_new_value(pg_host: Host, pg_url: str) -> None:
    inside, done = threading.Event(), threading.Event()

    def batch() -> None:
        with pg_host.settings.batch():
            pg_host.settings.get("max_turns")
            inside.set()
            done.wait(DEADLINE_S)

    thread = threading.Thread(target=batch)
    thread.start()
    try:
        assert inside.wait(DEADLINE_S)
        with bootstrap.boot(db_path=pg_url, load_entrypoints=False) as other:
            other.settings.set("max_turns", 9)
        assert pg_host.settings.get("max_turns") == 9  # this thread is not in the batch
    finally:
        done.set()
        thread.join(timeout=30)


@pytest.mark.parametrize("target", ["postgresql+psycopg://dm:S3cretPW@127.0.0.1:5/dm",
                                    "pg://dm:S3cretPW@db/dm", "mysql://dm:S3cretPW@db/dm"])
def test_a_url_that_is_not_postgresql_is_refused_by_name_without_its_password(
        target: str, tmp_path: Any) -> None:
    with pytest.raises(DatabaseError, match="only postgresql://") as info:
        bootstrap.boot(db_path=target, load_entrypoints=False)
    assert "S3cretPW" not in str(info.value)
    assert not any(tmp_path.iterdir())


def test_the_scheme_is_read_in_any_case_and_blanks_around_are_ignored(pg_url: str) -> None:
    shouting = " " + pg_url.replace("postgresql://", "POSTGRESQL://") + " "
    with bootstrap.boot(db_path=shouting, load_entrypoints=False) as host:
        assert isinstance(host.handle, PgHandle)
