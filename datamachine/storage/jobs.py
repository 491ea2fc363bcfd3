"""Pipeline jobs: :class:`JobStore` and the :class:`Job` record.

A job moves ``pending`` -> ``running`` -> ``completed`` or ``failed`` and nowhere else; a move
against that order raises :class:`InvalidJobTransition` instead of silently rewriting history
(a job completed twice usually means two workers picked it up). Engine data is a JSON object a
pipeline run merges its diagnostics, usage and transcript id into; a merge is a read-modify-write
inside one ``BEGIN IMMEDIATE`` transaction, so concurrent merges from several processes never
lose each other's keys.

A job's end says what stopped it the way a run's result does (DESIGN.md 22): ``flags``
(``max_<budget>_reached``), ``budget`` (the budget that ran out) and ``budgets`` (snapshots),
given with the move to ``completed`` or ``failed`` (:class:`JobOutcome`).

Putting a job on the task queue (``enqueue``, ``requeue``) is the queue's business: the store
is given one (:class:`JobQueuing`, the host's ``datamachine.job_queue.JobQueue``) when it is
made, and imports nothing of it.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agents_api import clock
from agents_api.errors import brief_repr
from agents_api.jsontext import plain_json, unreadable
from datamachine.errors import InvalidJobTransition, JobNotFound, UsageError
from datamachine.storage._tx import (
    Connected,
    connection_lock,
    db_label,
    dialect,
    immediate,
    is_utf8,
    query,
    query_one,
)

__all__ = ["MAX_JOB_ID", "Job", "JobOutcome", "JobQueuing", "JobStatus", "JobStore",
           "check_job_id", "is_job_id"]

JobStatus = Literal["pending", "running", "completed", "failed"]
JOB_STATUSES: tuple[JobStatus, ...] = ("pending", "running", "completed", "failed")

# Allowed source statuses for each target status.
_TRANSITIONS: dict[JobStatus, tuple[JobStatus, ...]] = {
    "running": ("pending",),
    "completed": ("running",),
    "failed": ("running",),
}
_COLUMNS = ("id, flow_step_id, status, engine_data, failure_reason, created_at, updated_at, "
            "started_at, finished_at, flags, budget, budgets")


class Job(BaseModel):
    """One job as stored. ``engine_data`` is the JSON object runs merge their results into;
    ``flags``, ``budget`` and ``budgets`` say what stopped it, as a run's result does
    (``["max_job_attempts_reached"]``, ``"job_attempts"``, ``{"job_attempts": {"current": 5,
    ...}}``; empty until it ends, and for an end no budget decided)."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    id: int
    flow_step_id: str | None
    status: JobStatus
    engine_data: dict[str, Any]
    failure_reason: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    flags: list[str] = Field(default_factory=list)
    budget: str | None = None
    budgets: dict[str, dict[str, Any]] = Field(default_factory=dict)


# Never changed once made.
@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a job's end records beside its status and failure reason: the ``flags`` of its
    last run and of what stopped it (``max_<budget>_reached``), the ``budget`` that ran out
    (None: none did) and ``budgets``, each budget's snapshot by name
    (``agents_api.IterationBudget.snapshot()``)."""

    flags: tuple[str, ...] = ()
    budget: str | None = None
    budgets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


# Job ids are SQLite rowids handed out by ``create``: 1, 2, 3, ... up to the largest 64-bit
# signed integer. SQLite cannot even be asked about a larger one (OverflowError).
MAX_JOB_ID = 2**63 - 1


def is_job_id(value: object) -> bool:
    """Whether ``value`` could be a job id: an int (not a bool) from 1 to ``MAX_JOB_ID``."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_JOB_ID


def check_job_id(job_id: object) -> int:
    """``job_id`` if it could be a job id, else a UsageError.

    Out of range is a usage error, not ``JobNotFound``: like ``"x"``, ``0`` or ``2**63`` is no
    job id at all, whatever the database holds, and it is refused before the database is
    asked. ``JobNotFound`` means a well-formed id that no job has (yet, or any more).
    """
    if not isinstance(job_id, int) or not is_job_id(job_id):
        raise UsageError(f"A job id is an integer from 1 to {MAX_JOB_ID} (as returned by "
                         f"jobs.create), got {brief_repr(job_id)}.")
    return job_id


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"limit must be a positive integer, got {brief_repr(limit)}.")
    return min(limit, MAX_JOB_ID)  # more rows than SQLite can count is all of them


def _encode_data(engine_data: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if engine_data is None:
        return {}
    if not isinstance(engine_data, Mapping):
        raise UsageError(f"{what} must be a dict, got {type(engine_data).__name__}.")
    data = dict(engine_data)
    where = _non_text_key(data)
    if where is not None:
        # JSON would turn {1: "x"} into {"1": "x"}: a job that reads back other than written.
        raise UsageError(f"{what}{where[0]} has the key {brief_repr(where[1])}; keys must be "
                         "strings (JSON object keys).")
    try:
        plain_json(data)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} must be JSON-serializable: {exc}.") from None
    problem = unreadable(data)
    if problem is not None:
        raise UsageError(f"{what}{problem[0]} cannot be stored: {problem[1]}.")
    return data


def _non_text_key(value: Any, path: str = "") -> tuple[str, Any] | None:
    """(where, key) of the first mapping key that is not a string, else None."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, key
            found = _non_text_key(item, f"{path}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _non_text_key(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _job(row: Any) -> Job:
    return Job(**{**dict(row), "engine_data": json.loads(row["engine_data"]),
                  "flags": json.loads(row["flags"]), "budgets": json.loads(row["budgets"])})


def _outcome_values(outcome: JobOutcome) -> list[Any]:
    """``outcome`` as the ``flags``, ``budget`` and ``budgets`` columns hold it; a UsageError
    for what they cannot."""
    if not isinstance(outcome, JobOutcome):
        raise UsageError(f"outcome must be a JobOutcome, got {type(outcome).__name__}.")
    flags = list(outcome.flags)
    for flag in flags:
        if not isinstance(flag, str) or not flag.strip() or not is_utf8(flag):
            raise UsageError(f"A job's flags are non-empty strings, got {brief_repr(flag)}.")
    budget = outcome.budget
    if budget is not None and not (isinstance(budget, str) and budget.strip()
                                   and is_utf8(budget)):
        raise UsageError(f"A job's budget is a budget name or None, got {brief_repr(budget)}.")
    budgets = _encode_data(outcome.budgets, "the job's budgets")
    return [plain_json(flags), budget, plain_json(budgets)]


class JobQueuing(Protocol):
    """What puts a store's jobs on a task queue (the host's ``datamachine.job_queue
    .JobQueue``): it stores the job through ``store`` and queues it."""

    def enqueue(self, store: JobStore, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[str] | None, provider: str | None, model: str | None, *,
                payload: Mapping[str, Any] | None, max_turns: int | None,
                flow_step_id: str | None) -> Job:
        """Check the request, store a ``pending`` job and queue it; the job."""
        ...

    def requeue(self, store: JobStore, job_id: int) -> Job:
        """Queue the ``pending`` job ``job_id`` again; the job."""
        ...


class JobStore:
    """Create, read, list and move jobs through their statuses; with a ``queue``, put them on
    the task queue too."""

    def __init__(self, db: Connected, *, queue: JobQueuing | None = None) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self._queue = queue

    def enqueue(self, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[str] | None = None, provider: str | None = None,
                model: str | None = None, *, payload: Mapping[str, Any] | None = None,
                max_turns: int | None = None, flow_step_id: str | None = None) -> Job:
        """Store a ``pending`` job and put it on the task queue for ``datamachine worker``
        (DESIGN.md 18; PostgreSQL only). ``tools`` are names of registered tools; the payload
        must be JSON data. Returns the job; ``get(job.id)`` follows it."""
        return self._queuing("enqueue").enqueue(
            self, messages, tools, provider, model, payload=payload, max_turns=max_turns,
            flow_step_id=flow_step_id)

    def requeue(self, job_id: int) -> Job:
        """Put a ``pending`` job back on the task queue (its queue entry was lost: the process
        that enqueued it died between storing the job and queueing it)."""
        return self._queuing("requeue").requeue(self, job_id)

    def _queuing(self, method: str) -> JobQueuing:
        if self._queue is None:
            raise UsageError(f"{method}() needs a host's job store: use "
                             f"host.jobs.{method}(...).")
        return self._queue

    def create(self, flow_step_id: str | None = None,
               engine_data: Mapping[str, Any] | None = None) -> Job:
        """A new ``pending`` job, optionally tied to a flow step and seeded with engine data."""
        if flow_step_id is not None and not (isinstance(flow_step_id, str)
                                             and is_utf8(flow_step_id)):
            raise UsageError(f"flow_step_id must be a string or None, got "
                             f"{brief_repr(flow_step_id)}.")
        data = _encode_data(engine_data, "engine_data")
        now = clock.now()
        with self._lock:
            with immediate(self._db, self._lock, self._label, "create a job",
                           ("jobs:new",)) as conn:
                insert = ("INSERT INTO jobs (flow_step_id, status, engine_data, created_at, "
                          "updated_at) VALUES (?, 'pending', ?, ?, ?)")
                params = [flow_step_id, plain_json(data), now, now]
                if dialect(conn) == "sqlite":  # RETURNING needs SQLite 3.35; lastrowid is older
                    job_id = int(conn.execute(insert, params).lastrowid or 0)
                else:
                    job_id = int(conn.execute(insert + " RETURNING id", params).fetchone()[0])
            return self.get(job_id)

    def delete_pending(self, job_id: int) -> bool:
        """Remove job ``job_id`` if it is still ``pending`` (the queue refused it, so nothing
        will ever run it); True if it was removed."""
        jid = check_job_id(job_id)
        with immediate(self._db, self._lock, self._label, "delete a job",
                       (f"job:{jid}",)) as conn:
            cursor = conn.execute("DELETE FROM jobs WHERE id = ? AND status = 'pending'", [jid])
        return cursor.rowcount == 1

    def get(self, job_id: int) -> Job:
        """The job with ``job_id``; JobNotFound if there is none."""
        jid = check_job_id(job_id)
        with self._lock:
            row = query_one(self._db.conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", [jid])
        if row is None:
            raise JobNotFound(f"No job has id {jid} in {self._label}.")
        return _job(row)

    def list(self, status: JobStatus | None = None, limit: int = 50) -> builtins.list[Job]:
        """Jobs, newest first, optionally only those in ``status``."""
        if status is not None and status not in JOB_STATUSES:
            raise UsageError(f"status must be one of {', '.join(JOB_STATUSES)}, got {status!r}.")
        limit = _limit(limit)
        sql = f"SELECT {_COLUMNS} FROM jobs"
        params: builtins.list[Any] = []
        if status is not None:
            sql += " WHERE status = ?"
            params.append(status)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = query(self._db.conn, sql, params)
        return [_job(row) for row in rows]

    def start(self, job_id: int) -> Job:
        """``pending`` -> ``running``."""
        return self._move(job_id, "running")

    def complete(self, job_id: int, outcome: JobOutcome | None = None) -> Job:
        """``running`` -> ``completed``; ``outcome``: its run's flags, budget and budgets
        (a run that stopped on a budget still completes its job)."""
        return self._move(job_id, "completed", outcome=outcome)

    def fail(self, job_id: int, reason: str, outcome: JobOutcome | None = None) -> Job:
        """``running`` -> ``failed`` with ``reason`` (for example
        ``completion_assertions_missing``); ``outcome``: what stopped it (the budget
        ``job_attempts`` when its attempts ran out), written in the same transaction."""
        if not isinstance(reason, str) or not reason.strip() or not is_utf8(reason):
            raise UsageError(f"A job failure needs a non-empty reason string, got "
                             f"{brief_repr(reason)}.")
        return self._move(job_id, "failed", reason, outcome=outcome)

    def merge_engine_data(self, job_id: int, data: Mapping[str, Any]) -> Job:
        """Merge ``data``'s top-level keys into the job's engine data (later writes win)."""
        jid = check_job_id(job_id)
        update = _encode_data(data, "engine data to merge")
        with self._lock:
            with immediate(self._db, self._lock, self._label, "update a job",
                           (f"job:{jid}",)) as conn:
                row = query_one(conn, "SELECT engine_data FROM jobs WHERE id = ?", [jid])
                if row is None:
                    raise JobNotFound(f"No job has id {jid} in {self._label}.")
                merged = {**json.loads(row["engine_data"]), **update}
                conn.execute(
                    "UPDATE jobs SET engine_data = ?, updated_at = ? WHERE id = ?",
                    [plain_json(merged), clock.now(), jid],
                )
            return self.get(jid)

    def _move(self, job_id: int, target: JobStatus, reason: str | None = None, *,
              outcome: JobOutcome | None = None) -> Job:
        jid = check_job_id(job_id)
        allowed = _TRANSITIONS[target]
        # Set only with an end that brings them: an end without one leaves them as they were.
        ends = ", flags = ?, budget = ?, budgets = ?" if outcome is not None else ""
        end_values = _outcome_values(outcome) if outcome is not None else []
        now = clock.now()
        with self._lock:
            with immediate(self._db, self._lock, self._label, "update a job",
                           (f"job:{jid}",)) as conn:
                row = query_one(conn, "SELECT status FROM jobs WHERE id = ?", [jid])
                if row is None:
                    raise JobNotFound(f"No job has id {jid} in {self._label}.")
                current = row["status"]
                if current not in allowed:
                    raise InvalidJobTransition(
                        f"Job {jid} is {current!r}; it can become {target!r} only from "
                        f"{' or '.join(repr(s) for s in allowed)}. Jobs move pending -> running "
                        "-> completed or failed; create a new job to run the step again."
                    )
                conn.execute(
                    "UPDATE jobs SET status = ?, updated_at = ?, "
                    "started_at = CASE WHEN ? = 'running' THEN ? ELSE started_at END, "
                    "finished_at = CASE WHEN ? IN ('completed', 'failed') THEN ? "
                    "ELSE finished_at END, "
                    f"failure_reason = COALESCE(?, failure_reason){ends} WHERE id = ?",
                    [target, now, target, now, target, now, reason, *end_values, jid],
                )
            return self.get(jid)
