"""The schema, as numbered sqlite-utils migrations.

All pending migrations run inside one ``BEGIN IMMEDIATE`` transaction: two processes booting
against a new file take turns instead of both creating tables (the second finds nothing pending
once it gets the lock), and if any migration fails the whole batch is rolled back, leaving the
database exactly as it was, and the failure surfaces as a :class:`DatabaseError` naming the
migration and the file.

Timestamps are ``REAL`` seconds since the epoch written by the stores from
``agents_api.clock.now()``; no column defaults to ``CURRENT_TIMESTAMP``, because freezegun cannot
move SQLite's own clock. JSON columns are ``TEXT`` holding a JSON document.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database, Migrations

from datamachine.errors import DatabaseError
from datamachine.storage.transcript_rows import TITLE_LENGTH

__all__ = ["MIGRATIONS", "migrate"]

MIGRATIONS = Migrations("datamachine")


@MIGRATIONS()
def m001_settings(db: Database) -> None:
    """Settings: one row per key, the value stored as JSON text."""
    db.table("settings").create({"key": str, "value": str, "updated_at": float}, pk="key")


@MIGRATIONS()
def m002_transcripts(db: Database) -> None:
    """Transcripts: one row per session, its messages in order in ``transcript_messages``.

    ``status`` is ``running`` while a run writes it, then the run's final status. A row still
    ``running`` with no live lock was left by a killed process and reads back as ``interrupted``.
    ``message_count`` is kept in the row so a turn's append finds its next position without
    scanning the messages.
    """
    db.execute(
        """
        CREATE TABLE transcripts (
            id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            provider TEXT,
            model TEXT,
            mode TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            turn_count INTEGER NOT NULL DEFAULT 0,
            cumulative_turn_count INTEGER NOT NULL DEFAULT 0,
            message_count INTEGER NOT NULL DEFAULT 0,
            usage TEXT NOT NULL DEFAULT '{}',
            budgets TEXT NOT NULL DEFAULT '{}',
            result TEXT NOT NULL DEFAULT '{}'
        )
        """
    )
    db.execute("CREATE INDEX transcripts_updated_at ON transcripts (updated_at)")
    db.execute(
        """
        CREATE TABLE transcript_messages (
            session_id TEXT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            envelope TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (session_id, position)
        )
        """
    )


@MIGRATIONS()
def m003_transcript_locks(db: Database) -> None:
    """Transcript locks: at most one holder per session, until ``expires_at``.

    No foreign key to ``transcripts``: a run takes the lock before its transcript exists.
    ``holder`` (host and pid) is only for people debugging a stuck lock.
    """
    db.execute(
        """
        CREATE TABLE transcript_locks (
            session_id TEXT PRIMARY KEY,
            token TEXT NOT NULL,
            expires_at REAL NOT NULL,
            acquired_at REAL NOT NULL,
            holder TEXT NOT NULL DEFAULT ''
        )
        """
    )


@MIGRATIONS()
def m004_chat_sessions(db: Database) -> None:
    """Chat sessions: turn count, ``active``/``aborted`` status and the limit.

    ``max_turns`` holds an integer in [1, 10000] or the text ``'unlimited'`` (the column has no
    declared type, so SQLite keeps whichever it was given; the CHECK admits only those two).
    """
    db.execute(
        """
        CREATE TABLE chat_sessions (
            id TEXT PRIMARY KEY,
            turn_count INTEGER NOT NULL DEFAULT 0 CHECK (turn_count >= 0),
            status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'aborted')),
            max_turns NOT NULL CHECK (
                max_turns = 'unlimited'
                OR (typeof(max_turns) = 'integer' AND max_turns BETWEEN 1 AND 10000)
            ),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )


@MIGRATIONS()
def m005_jobs(db: Database) -> None:
    """Jobs: a pipeline step's unit of work, its status and its engine data (JSON).

    AUTOINCREMENT so a job id is never reused, even after the newest job is deleted.
    """
    db.execute(
        """
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            flow_step_id TEXT,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'completed', 'failed')),
            engine_data TEXT NOT NULL DEFAULT '{}',
            failure_reason TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL
        )
        """
    )
    db.execute("CREATE INDEX jobs_status ON jobs (status, id)")


@MIGRATIONS()
def m006_api_tokens(db: Database) -> None:
    """API tokens for ``/chat``: the name and the SHA-256 of the token, never the token."""
    db.execute(
        """
        CREATE TABLE api_tokens (
            name TEXT PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            revoked_at REAL
        )
        """
    )


@MIGRATIONS()
def m007_spend(db: Database) -> None:
    """Spend windows (``spend_limits``): settled use per window, and the open reservations of
    requests in flight (each with an expiry, so a killed process's reservation stops counting).
    """
    db.execute(
        """
        CREATE TABLE spend_settled (
            limit_name TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            window_start TEXT NOT NULL,
            amount INTEGER NOT NULL DEFAULT 0,
            updated_at REAL NOT NULL,
            PRIMARY KEY (limit_name, scope_key, window_start)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE spend_reservations (
            id TEXT NOT NULL,
            limit_name TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            window_start TEXT NOT NULL,
            amount INTEGER NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (id, limit_name)
        )
        """
    )
    db.execute("CREATE INDEX spend_reservations_window ON spend_reservations "
               "(limit_name, scope_key, window_start)")


@MIGRATIONS()
def m008_token_claims(db: Database) -> None:
    """Who may do what over ``/chat`` (DESIGN.md 20).

    ``api_tokens.tools`` is the token's tool allowlist (a JSON list, NULL: the site's default)
    and ``api_tokens.site`` the caller site it may claim (NULL: none). ``chat_sessions
    .token_name`` is the token that created the session (NULL: made through the Python API),
    the only one that may continue it; ``transcripts.token_name`` records the token of the
    run that wrote the transcript.
    """
    db.execute("ALTER TABLE api_tokens ADD COLUMN tools TEXT")
    db.execute("ALTER TABLE api_tokens ADD COLUMN site TEXT")
    db.execute("ALTER TABLE chat_sessions ADD COLUMN token_name TEXT")
    db.execute("ALTER TABLE transcripts ADD COLUMN token_name TEXT")


@MIGRATIONS()
def m009_rejected_mark(db: Database) -> None:
    """Stored refusals carry the executor's own mark, ``_dm_rejected``, instead of ``rejected``.

    ``rejected`` was a key any tool could return, hiding its result from the results and the
    completion counts; the executor now writes a key tools cannot set. A stored ``rejected``
    is moved only where the executor wrote it: a tool result whose ``error_type`` is one of its
    refusals. Anything else is a tool's own data and stays as it is.
    """
    db.execute(
        """
        UPDATE transcript_messages
        SET envelope = json_set(json_remove(envelope, '$.payload.rejected'),
                                '$.payload._dm_rejected', json('true'))
        WHERE envelope LIKE '%"rejected":true%'
          AND json_extract(envelope, '$.type') = 'tool_result'
          AND json_type(envelope, '$.payload.rejected') = 'true'
          AND json_extract(envelope, '$.payload.error_type') IN (
              'duplicate_tool_call', 'tool_runtime_rule_rejected', 'approval_declined',
              'tools_closed', 'session_aborted')
        """
    )



@MIGRATIONS()
def m010_run_viewer(db: Database) -> None:
    """What the run viewer (``/ui/``, DESIGN.md 17) reads and needs.

    ``transcripts.title``: the text of the session's first user message (at most 200
    characters), so the runs list shows and searches what each run was asked without reading
    its messages; filled here for the transcripts stored before it (the first user message
    whose content is non-blank text, as new rows get it). ``transcripts_recent``
    (``updated_at, id``) replaces ``transcripts_updated_at``: the list pages by that pair.
    ``transcripts.timeline``: the rare events every run of the session recorded (JSON, a
    column of its own so listings never read it); ``transcript_messages.run_base``: the
    session's turns before the run that wrote the message, which tells its runs apart (NULL
    for messages stored before). ``api_tokens.scope``: ``chat`` (the ``/chat`` endpoint,
    every token made before) or ``viewer`` (a login to ``/ui/``, never accepted by ``/chat``).
    ``site_secrets``: keys the site makes for itself once (the viewer's cookie signing key),
    outside the settings, which are listed and exported. ``ui_logins``: the viewer's open
    logins (the SHA-256 of each session's nonce), so signing out ends a session on the server,
    not only in the browser.
    """
    db.execute("ALTER TABLE transcripts ADD COLUMN title TEXT")
    db.execute(
        f"""
        UPDATE transcripts SET title = (
            SELECT replace(substr(json_extract(m.envelope, '$.content'), 1, {TITLE_LENGTH}),
                           char(0), char(65533))
            FROM transcript_messages m
            WHERE m.session_id = transcripts.id AND json_valid(m.envelope)
              AND json_extract(m.envelope, '$.role') = 'user'
              AND json_type(m.envelope, '$.content') = 'text'
              AND trim(json_extract(m.envelope, '$.content'), ' ' || char(9, 10, 11, 12, 13))
                  != ''
            ORDER BY m.position LIMIT 1)
        """
    )
    db.execute("ALTER TABLE transcripts ADD COLUMN timeline TEXT")
    db.execute("ALTER TABLE transcript_messages ADD COLUMN run_base INTEGER")
    db.execute("DROP INDEX transcripts_updated_at")
    db.execute("CREATE INDEX transcripts_recent ON transcripts (updated_at, id)")
    db.execute("ALTER TABLE api_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'chat' "
               "CHECK (scope IN ('chat', 'viewer'))")
    db.execute(
        """
        CREATE TABLE ui_logins (
            id TEXT PRIMARY KEY,
            token_name TEXT NOT NULL,
            created_at REAL NOT NULL,
            ended_at REAL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE site_secrets (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL,
            created_at REAL NOT NULL
        )
        """
    )


@MIGRATIONS()
def m011_compactions(db: Database) -> None:
    """``transcript_compactions``: each time a run sent a smaller view of its history than the
    history (DESIGN.md 21), numbered per session (``seq``): the run (``run_base``, the
    session's turns before it) and its coming ``turn``, the ``strategy``, the estimated
    tokens before and after, the messages removed or cleared, ``upto`` (how many of the
    session's messages the view stood for), the ``context_window`` it fit (a continued run with no
    window of its own starts with it: one a provider's overflow answer taught), the summary it
    wrote, and on the latest one of a
    run the ``view`` itself (JSON envelopes), which a continued run starts from instead of
    compacting again."""
    db.execute(
        """
        CREATE TABLE transcript_compactions (
            session_id TEXT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            run_base INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            strategy TEXT NOT NULL,
            tokens_before INTEGER NOT NULL,
            tokens_after INTEGER NOT NULL,
            messages_removed INTEGER NOT NULL,
            upto INTEGER NOT NULL,
            context_window INTEGER,
            summary TEXT,
            view TEXT,
            created_at REAL NOT NULL,
            PRIMARY KEY (session_id, seq)
        )
        """
    )


@MIGRATIONS()
def m012_job_outcome(db: Database) -> None:
    """What a job's end says beside its status, as a run's result says it (DESIGN.md 22):
    ``jobs.flags`` (a JSON list: ``max_<budget>_reached`` for the budget that ran out, and the
    flags of the job's last run), ``jobs.budget`` (the budget that stopped it: ``job_attempts``
    when its attempts ran out, the run's budget when its run stopped on one; NULL: none) and
    ``jobs.budgets`` (JSON: the snapshot of each budget, by name). Jobs settled before keep
    ``[]``, NULL and ``{}``."""
    db.execute("ALTER TABLE jobs ADD COLUMN flags TEXT NOT NULL DEFAULT '[]'")
    db.execute("ALTER TABLE jobs ADD COLUMN budget TEXT")
    db.execute("ALTER TABLE jobs ADD COLUMN budgets TEXT NOT NULL DEFAULT '{}'")


@MIGRATIONS()
def m013_tool_intents(db: Database) -> None:
    """``tool_intents`` (DESIGN.md 24): what a run was about to do before each call of an
    ``idempotent`` or ``write`` tool (or an approved call), stored before the call runs and
    settled in the commit that stores its result: the session, the call's idempotency key
    (one row per call, however often it runs), ``seq`` (the order the session's intents were
    first stored in), its id, turn and tool, its canonical
    ``arguments``, the tool's ``effects``, the ``approval`` that let it run (a pause id,
    ``asked``, or NULL), ``state`` (``pending`` or ``settled``) and when each happened. A
    ``pending`` row that a run finds when it goes on is a call whose outcome is unknown."""
    db.execute(
        """
        CREATE TABLE tool_intents (
            session_id TEXT NOT NULL REFERENCES transcripts (id) ON DELETE CASCADE,
            idempotency_key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            call_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            tool_name TEXT NOT NULL,
            arguments TEXT NOT NULL,
            effects TEXT NOT NULL,
            approval TEXT,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            settled_at REAL,
            PRIMARY KEY (session_id, idempotency_key)
        )
        """
    )


def migrate(db: Database, *, label: str = "database", migrations: Migrations = MIGRATIONS) -> None:
    """Apply pending ``migrations`` atomically; any failure leaves the schema untouched.

    Raises :class:`DatabaseError` naming ``label`` (the file) and, when a migration function
    failed, that migration.
    """
    try:
        if not migrations.pending(db):
            return
        db.conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise DatabaseError(f"Cannot migrate the database {label}: {exc}.") from exc
    try:
        # pending() is read again inside apply(), under the write lock: a process that waited
        # here while another one migrated finds nothing left to do.
        migrations.apply(db)
    except BaseException as exc:
        failed = _first_pending(db, migrations)
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        if not isinstance(exc, Exception):
            raise
        where = f"migration {failed!r}" if failed else "a migration"
        raise DatabaseError(
            f"Cannot migrate the database {label}: {where} failed ({type(exc).__name__}: {exc}). "
            "Nothing was changed; fix the cause (disk space, permissions, a damaged file) and "
            "start again."
        ) from exc
    try:
        db.conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise DatabaseError(f"Cannot migrate the database {label}: {exc}.") from exc


def _first_pending(db: Database, migrations: Migrations) -> str | None:
    # Read inside the failed transaction: migrations applied before the failure are recorded
    # there, so the first one still pending is the one that raised.
    try:
        pending = migrations.pending(db)
    except sqlite3.Error:
        return None
    return pending[0].name if pending else None
