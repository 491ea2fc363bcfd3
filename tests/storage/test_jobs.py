"""Jobs: the pending -> running -> completed|failed lifecycle and merged engine data."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from sqlite_utils import Database

import bootstrap
from datamachine.errors import InvalidJobTransition, JobNotFound, UsageError
from datamachine.host import Host
from datamachine.storage import JobOutcome
from datamachine.storage.sqlite_migrations import MIGRATIONS

SPENT = {"current": 5, "ceiling": 5, "remaining": 0, "exceeded": True, "hard_ceiling": 100,
         "rail": "ceiling"}


def test_a_job_moves_pending_running_completed_with_timestamps(host: Host) -> None:
    with freeze_time("2026-01-01 12:00:00") as clock:
        job = host.jobs.create(flow_step_id="step-1", engine_data={"source": "feed"})
        assert (job.status, job.flow_step_id, job.engine_data) == (
            "pending", "step-1", {"source": "feed"})
        assert job.started_at is None
        assert job.finished_at is None
        clock.tick(3)
        started = host.jobs.start(job.id)
        clock.tick(4)
        done = host.jobs.complete(job.id)
    assert started.status == "running"
    assert done.status == "completed"
    assert done.failure_reason is None
    assert done.started_at == job.created_at + 3
    assert done.finished_at == job.created_at + 7
    assert host.jobs.get(job.id) == done


def test_a_failed_job_keeps_its_reason(host: Host) -> None:
    job = host.jobs.start(host.jobs.create().id)
    failed = host.jobs.fail(job.id, "completion_assertions_missing")
    assert failed.status == "failed"
    assert failed.failure_reason == "completion_assertions_missing"


@pytest.mark.parametrize(
    ("steps", "move"),
    [((), "complete"), ((), "fail"), (("start",), "start"),
     (("start", "complete"), "fail"), (("start", "fail"), "complete"),
     (("start", "complete"), "start")],
)
def test_moves_against_the_lifecycle_are_refused_and_change_nothing(
    host: Host, steps: tuple[str, ...], move: str
) -> None:
    job = host.jobs.create()
    for step in steps:
        if step == "fail":
            host.jobs.fail(job.id, "boom")
        else:
            getattr(host.jobs, step)(job.id)
    before = host.jobs.get(job.id)
    attempt = (lambda: host.jobs.fail(job.id, "again")) if move == "fail" else (
        lambda: getattr(host.jobs, move)(job.id))
    with pytest.raises(InvalidJobTransition, match=f"Job {job.id} is '{before.status}'"):
        attempt()
    assert host.jobs.get(job.id) == before
    assert not host.handle.conn.in_transaction


def test_engine_data_merges_top_level_keys(host: Host) -> None:
    job = host.jobs.create(engine_data={"a": 1, "b": {"x": 1}})
    host.jobs.merge_engine_data(job.id, {"b": {"y": 2}, "transcript_session_id": "s1"})
    merged = host.jobs.merge_engine_data(job.id, {"usage": {"total_tokens": 5}})
    assert merged.engine_data == {"a": 1, "b": {"y": 2}, "transcript_session_id": "s1",
                                  "usage": {"total_tokens": 5}}


def test_list_filters_by_status_newest_first(host: Host) -> None:
    first, second, third = (host.jobs.create() for _ in range(3))
    host.jobs.start(second.id)
    assert [j.id for j in host.jobs.list()] == [third.id, second.id, first.id]
    assert [j.id for j in host.jobs.list(status="pending")] == [third.id, first.id]
    assert [j.id for j in host.jobs.list(status="running")] == [second.id]
    assert [j.id for j in host.jobs.list(limit=1)] == [third.id]
    with pytest.raises(UsageError, match="status must be one of"):
        host.jobs.list(status="done")  # type: ignore[arg-type]


def test_missing_jobs_and_bad_arguments_are_clear_errors(host: Host) -> None:
    with pytest.raises(JobNotFound, match="42"):
        host.jobs.get(42)
    with pytest.raises(JobNotFound):
        host.jobs.start(42)
    with pytest.raises(JobNotFound):
        host.jobs.merge_engine_data(42, {})
    with pytest.raises(UsageError, match="JSON-serializable"):
        host.jobs.create(engine_data={"x": object()})
    with pytest.raises(UsageError, match="integer"):
        host.jobs.get("1")  # type: ignore[arg-type]
    job = host.jobs.start(host.jobs.create().id)
    with pytest.raises(UsageError, match="reason"):
        host.jobs.fail(job.id, "  ")


@pytest.mark.parametrize("job_id", [2**63, 10**30, 0, -1, True])
def test_an_id_no_job_can_have_is_a_usage_error_at_every_job_entry_point(
        host: Host, job_id: int) -> None:
    # 2**63 reached SQLite and raised OverflowError; 0 and -1 were a JobNotFound. None of them
    # is a job id whatever the database holds: a usage error, before the database is asked.
    job = host.jobs.start(host.jobs.create().id)
    for call in (host.jobs.get, host.jobs.start, host.jobs.complete,
                 lambda j: host.jobs.fail(j, "boom"),
                 lambda j: host.jobs.merge_engine_data(j, {"k": 1})):
        with pytest.raises(UsageError, match=r"job id is an integer from 1 to 9223372036854775807"):
            call(job_id)
    assert host.jobs.get(job.id) == job


def test_the_largest_possible_job_id_is_a_lookup(host: Host) -> None:
    with pytest.raises(JobNotFound, match="9223372036854775807"):
        host.jobs.get(2**63 - 1)


def test_a_limit_beyond_what_sqlite_counts_lists_everything(host: Host) -> None:
    job = host.jobs.create()
    assert [j.id for j in host.jobs.list(limit=2**70)] == [job.id]


@pytest.mark.parametrize("job_id", [2**63, "99999999999999999999999", "\u00b2", 0])
def test_a_payload_job_id_no_job_can_have_is_reported_not_raised(host: Host,
                                                                  job_id: object) -> None:
    result = host.run_conversation([{"role": "user", "content": "go"}],
                                   payload={"job_id": job_id})
    assert result.status == "completed"
    assert any("is not a job id" in warning for warning in result.warnings)


def test_job_ids_are_never_reused(host: Host) -> None:
    job = host.jobs.create()
    host.handle.conn.execute("DELETE FROM jobs WHERE id = ?", [job.id])
    assert host.jobs.create().id == job.id + 1


def test_a_jobs_end_records_what_stopped_it(backend_host: Host) -> None:
    jobs = backend_host.jobs
    job = jobs.start(jobs.create().id)
    assert (job.flags, job.budget, job.budgets) == ([], None, {})
    failed = jobs.fail(job.id, "provider_connection_error", JobOutcome(
        flags=("max_job_attempts_reached",), budget="job_attempts",
        budgets={"job_attempts": SPENT}))
    assert (failed.status, failed.failure_reason) == ("failed", "provider_connection_error")
    assert failed.flags == ["max_job_attempts_reached"]
    assert failed.budget == "job_attempts"
    assert failed.budgets == {"job_attempts": SPENT}
    assert jobs.get(job.id) == failed
    assert jobs.list(status="failed") == [failed]
    completed = jobs.complete(jobs.start(jobs.create().id).id, JobOutcome(
        flags=("max_conversation_turns_reached",), budget="conversation_turns"))
    assert (completed.flags, completed.budget, completed.budgets) == (
        ["max_conversation_turns_reached"], "conversation_turns", {})
    # An end without an outcome records none.
    plain = jobs.complete(jobs.start(jobs.create().id).id)
    assert (plain.flags, plain.budget, plain.budgets) == ([], None, {})


@pytest.mark.parametrize(("outcome", "message"), [
    (JobOutcome(flags=("",)), "flags are non-empty strings"),
    (JobOutcome(flags=(3,)), "flags are non-empty strings"),  # type: ignore[arg-type]
    (JobOutcome(budget=" "), "budget is a budget name or None"),
    (JobOutcome(budgets={"x": {"when": object()}}), "JSON-serializable"),
    ({"flags": []}, "outcome must be a JobOutcome"),
])
def test_an_outcome_the_job_cannot_hold_is_refused_and_changes_nothing(
        backend_host: Host, outcome: Any, message: str) -> None:
    job = backend_host.jobs.start(backend_host.jobs.create().id)
    with pytest.raises(UsageError, match=message):
        backend_host.jobs.fail(job.id, "boom", outcome)
    assert backend_host.jobs.get(job.id) == job


def test_m012_gives_the_jobs_stored_before_it_no_flags(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    MIGRATIONS.apply(Database(conn), stop_before="m012_job_outcome")  # a version before
    conn.execute("INSERT INTO jobs (status, engine_data, failure_reason, created_at, "
                 "updated_at) VALUES ('failed', '{\"k\": 1}', 'boom', 0, 0)")
    conn.commit()
    conn.close()
    with bootstrap.boot(db_path=path, load_entrypoints=False) as host:
        [old] = host.jobs.list()
        assert (old.status, old.engine_data, old.failure_reason) == ("failed", {"k": 1}, "boom")
        assert (old.flags, old.budget, old.budgets) == ([], None, {})


def test_m012_gives_the_jobs_stored_before_it_no_flags_on_postgresql(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True,
                         options="-c search_path=datamachine") as conn:
        # The database as m011 left it: m012 undone, and a job settled before it.
        for statement in ("ALTER TABLE jobs DROP COLUMN flags",
                          "ALTER TABLE jobs DROP COLUMN budget",
                          "ALTER TABLE jobs DROP COLUMN budgets",
                          "DELETE FROM datamachine_migrations WHERE name = 'm012_job_outcome'"):
            conn.execute(statement)
        conn.execute("INSERT INTO jobs (status, engine_data, failure_reason, created_at, "
                     "updated_at) VALUES ('failed', '{\"k\": 1}', 'boom', 0, 0)")
    with bootstrap.boot(db_path=pg_url, load_entrypoints=False) as host:  # migrates
        [old] = host.jobs.list()
        assert (old.status, old.engine_data, old.failure_reason) == ("failed", {"k": 1}, "boom")
        assert (old.flags, old.budget, old.budgets) == ([], None, {})
        done = host.jobs.fail(host.jobs.start(host.jobs.create().id).id, "x",
                              JobOutcome(flags=("f",), budget="b"))
        assert (done.flags, done.budget) == (["f"], "b")
