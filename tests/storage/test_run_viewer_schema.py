"""What migration m010 adds for the run viewer: transcript titles, viewer tokens, site secrets."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

import bootstrap
from datamachine.errors import UsageError
from datamachine.host import Host
from datamachine.server.auth import authenticate
from datamachine.server.errors import Problem
from datamachine.storage.database import open_handle
from datamachine.storage.sqlite_migrations import MIGRATIONS
from datamachine.storage.transcript_rows import TITLE_LENGTH


def test_a_transcript_is_titled_by_its_first_user_message(backend_host: Host) -> None:
    long = "tell me " + "x" * 400
    result = backend_host.run_conversation(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": long},
         {"role": "user", "content": "second"}],
        payload={"transcript_session_id": "titled"})
    assert result.status == "completed"
    row = backend_host.handle.conn.execute(
        "SELECT title FROM transcripts WHERE id = 'titled'").fetchone()
    assert row[0] == long[:TITLE_LENGTH]


def test_a_title_keeps_no_byte_the_column_cannot_hold(backend_host: Host) -> None:
    backend_host.transcripts.begin("odd", [{"role": "user", "content": "a\x00b"}])
    row = backend_host.handle.conn.execute(
        "SELECT title FROM transcripts WHERE id = 'odd'").fetchone()
    assert row[0] == "a\ufffdb"


def test_m010_titles_the_transcripts_stored_before_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    db = Database(conn)
    MIGRATIONS.apply(db, stop_before="m010_run_viewer")  # the database a version before made

    def envelope(role: str, content: object) -> str:
        return json.dumps({"schema": "agents-api.message", "version": 1, "type": "text",
                           "role": role, "content": content, "payload": {}, "metadata": {}})

    conn.executemany("INSERT INTO transcripts (id, status, created_at, updated_at) "
                     "VALUES (?, 'completed', 0, 0)", [("a",), ("b",), ("c",)])
    conn.executemany(
        "INSERT INTO transcript_messages (session_id, position, turn, envelope, created_at) "
        "VALUES (?, ?, 0, ?, 0)",
        [("a", 0, envelope("system", "rules")), ("a", 1, envelope("user", "\n \t")),
         ("a", 2, envelope("user", "y" * 300)),
         ("a", 3, envelope("user", "later")),
         ("b", 0, "not json"), ("b", 1, envelope("user", "after a damaged one")),
         ("c", 0, envelope("assistant", "no user message"))])
    conn.execute("INSERT INTO api_tokens (name, token_hash, created_at) VALUES ('old', 'h', 0)")
    conn.commit()
    conn.close()

    handle = open_handle(path)
    try:
        titles = dict(handle.conn.execute("SELECT id, title FROM transcripts").fetchall())
        scope = handle.conn.execute("SELECT scope FROM api_tokens").fetchone()[0]
        indexes = {row[0] for row in handle.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'transcripts'")}
    finally:
        handle.conn.close()
    assert titles == {"a": "y" * TITLE_LENGTH, "b": "after a damaged one", "c": None}
    assert scope == "chat"  # every token made before is a /chat token
    assert "transcripts_recent" in indexes
    assert "transcripts_updated_at" not in indexes


def test_a_viewer_token_is_refused_by_chat(backend_host: Host) -> None:
    viewer = backend_host.tokens.create("alice", scope="viewer")
    chat = backend_host.tokens.create("peer")
    found = backend_host.tokens.lookup(viewer)
    assert found is not None
    assert found.scope == "viewer"
    with pytest.raises(Problem) as refused:
        authenticate(backend_host, f"Bearer {viewer}")
    assert refused.value.status == 401
    assert authenticate(backend_host, f"Bearer {chat}").name == "peer"
    assert backend_host.tokens.get("alice") == found
    backend_host.tokens.revoke("alice")
    assert backend_host.tokens.get("alice") is None


@pytest.mark.parametrize("claims", [{"tools": ["x"]}, {"site": "s" * 32}])
def test_a_viewer_token_takes_no_chat_claims(host: Host, claims: dict[str, object]) -> None:
    with pytest.raises(UsageError, match="viewer token"):
        host.tokens.create("alice", scope="viewer", **claims)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="scope must be one of chat, viewer"):
        host.tokens.create("bob", scope="admin")  # type: ignore[arg-type]
    assert host.tokens.list() == []


def test_m010_titles_the_transcripts_stored_before_it_on_postgresql(pg_url: str) -> None:
    import psycopg

    def envelope(role: str, content: object) -> str:
        return json.dumps({"schema": "agents-api.message", "version": 1, "type": "text",
                           "role": role, "content": content, "payload": {}, "metadata": {}})

    with psycopg.connect(pg_url, autocommit=True,
                         options="-c search_path=datamachine") as conn:
        # The database as m009 left it: m010 undone, and rows written before it.
        for statement in (
                "ALTER TABLE transcripts DROP COLUMN title",
                "ALTER TABLE transcripts DROP COLUMN timeline",
                "ALTER TABLE transcript_messages DROP COLUMN run_base",
                "DROP FUNCTION datamachine_json_type(text, text)",
                "DROP INDEX transcripts_recent",
                "CREATE INDEX transcripts_updated_at ON transcripts (updated_at)",
                "ALTER TABLE api_tokens DROP COLUMN scope",
                "DROP TABLE site_secrets",
                "DROP TABLE ui_logins",
                "DELETE FROM datamachine_migrations WHERE name = 'm010_run_viewer'"):
            conn.execute(statement)
        for sid in ("a", "b", "c"):
            conn.execute("INSERT INTO transcripts (id, status, created_at, updated_at) "
                         "VALUES (%s, 'completed', 0, 0)", [sid])
        rows = [("a", 0, envelope("system", "rules")), ("a", 1, envelope("user", " \n\t ")),
                ("a", 2, envelope("user", [{"type": "text", "text": "parts"}])),
                ("a", 3, envelope("user", "y" * 300)),
                ("b", 0, "not json"), ("b", 1, envelope("user", "[not a list]")),
                ("c", 0, envelope("assistant", "no user message"))]
        for sid, position, text in rows:
            conn.execute("INSERT INTO transcript_messages (session_id, position, turn, "
                         "envelope, created_at) VALUES (%s, %s, 0, %s, 0)",
                         [sid, position, text])
    host = bootstrap.boot(db_path=pg_url, load_entrypoints=False)  # migrates
    try:
        titles = {s.id: s.title for s in host.transcripts.list()}
    finally:
        host.close()
    assert titles == {"a": "y" * TITLE_LENGTH, "b": "[not a list]", "c": None}
