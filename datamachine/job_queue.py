"""Pipeline jobs on a distributed task queue: ``host.jobs.enqueue`` and ``datamachine worker``
(DESIGN.md 18), on procrastinate over the host's own PostgreSQL database.

Why procrastinate and not Celery: the scale-out setup already has PostgreSQL for the stores, and
procrastinate needs nothing else (Celery would add Redis, a second server to run and secure).
Its workers fetch with ``SELECT ... FOR UPDATE SKIP LOCKED``, so one queued job is handed to one
worker; they send heartbeats, so the jobs of a worker that died (``kill -9``) can be found and
handed out again; it retries with the strategy we give it. Its tables live in the ``datamachine``
schema beside ours (``procrastinate_*``).

What a job is: a row of ``jobs`` (``pending`` until a worker starts it) whose engine data holds
the run's request under ``"request"``, and one procrastinate job carrying its id. A worker runs
it as a pipeline-mode conversation on the transcript ``job-<id>``. A second attempt, after a
provider outage or a worker that died, continues that transcript instead of starting over (the
turns already stored are not paid for twice), and the transcript lock makes sure two workers
never write one job's run at once: an attempt that finds the lock held waits and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import procrastinate
from procrastinate.exceptions import JobRetry
from procrastinate.retry import BaseRetryStrategy, RetryDecision
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.errors import brief_repr
from datamachine.errors import DataMachineError, UsageError, first_field_error

if TYPE_CHECKING:
    from datamachine.host import Host
    from datamachine.storage.jobs import Job

__all__ = ["JOB_QUEUE", "OUTAGE_CODES", "JobNotDone", "JobRequest", "enqueue", "job_session_id",
           "queue_app", "run_job", "run_worker"]

logger = logging.getLogger("datamachine.worker")

JOB_QUEUE = "datamachine"
TASK_NAME = "datamachine.run_job"
# Provider failures worth another attempt later: the model was unreachable or overloaded, not
# wrong. Any other failure settles the job as failed at once.
OUTAGE_CODES = frozenset({"provider_timeout", "provider_connection_error",
                          "provider_unavailable", "provider_http_error",
                          "provider_stream_error"})
# Another run holds (or took over) the job's transcript: a worker that died, whose lock has
# not run out yet, or one that is slow but alive. Never a reason to fail the job.
BUSY_CODES = frozenset({"transcript_lock_contention", "transcript_lock_lost"})
MAX_RETRY_WAIT_S = 300.0


class JobRequest(BaseModel):
    """What a queued job runs: stored in its engine data (``engine_data["request"]``), so any
    worker can run it from the database alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[str] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1, le=10_000)


class JobNotDone(DataMachineError, RuntimeError):
    """An attempt that could not finish its job and leaves it for a later one (a provider
    outage, or another run holding the job's transcript); procrastinate retries it."""


def job_session_id(job_id: int) -> str:
    """The transcript a job's run writes: the same for every attempt, so a later one
    continues it."""
    return f"job-{job_id}"


def _require_postgres(host: Host) -> str:
    from datamachine.storage._tx import dialect

    url = getattr(host.handle, "url", None)
    if dialect(host.handle.conn) != "postgresql" or not isinstance(url, str):
        raise UsageError(
            "The job queue runs on PostgreSQL: set DATAMACHINE_DB=postgresql://... (or boot "
            "with db_path=\"postgresql://...\") on every host that enqueues or works. "
            "See `datamachine docs scale-out`.")
    return url


def queue_app(host: Host) -> procrastinate.App:
    """The procrastinate app of ``host``'s database, with the job task registered (bound to
    ``host``: a worker runs jobs on it). Built once per host; its tables are created on first
    use."""
    cached = getattr(host, "_job_queue_app", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    from datamachine.storage._pg import conninfo

    url = _require_postgres(host)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(url)))

    @app.task(name=TASK_NAME, queue=JOB_QUEUE, pass_context=True,
              retry=_RetryOutages(host))
    def run_queued_job(context: procrastinate.JobContext, job_id: int) -> str:
        attempt = (context.job.attempts if context.job is not None else 0) + 1
        return run_job(host, job_id, final=attempt >= _max_attempts(host))

    host._job_queue_app = app  # type: ignore[attr-defined]
    return app


def _max_attempts(host: Host) -> int:
    return int(host.settings.effective("job_max_attempts"))


class _RetryOutages(BaseRetryStrategy):
    """procrastinate's retry strategy for :class:`JobNotDone`: exponential backoff from the
    setting ``job_retry_wait`` (doubling per attempt, at most 5 minutes), up to
    ``job_max_attempts`` attempts in all."""

    def __init__(self, host: Host) -> None:
        self._host = host

    def get_retry_exception(self, exception: BaseException, job: Any) -> Any:

        if not isinstance(exception, JobNotDone) or job.attempts + 1 >= _max_attempts(self._host):
            return None
        base = float(self._host.settings.effective("job_retry_wait"))
        wait = min(MAX_RETRY_WAIT_S, base * 2 ** job.attempts)
        return JobRetry(RetryDecision(retry_in={"seconds": wait}))


def _ensure_schema(app: procrastinate.App, host: Host) -> None:
    """procrastinate's tables, created once per database (under the whole-database lock, so
    hosts starting together take turns)."""
    if getattr(host, "_job_queue_ready", False):
        return
    from datamachine.storage._tx import connection_lock, immediate

    conn = host.handle.conn
    with immediate(host.handle, connection_lock(host.handle), host.handle.label if hasattr(
            host.handle, "label") else "database", "create the job queue's tables"):
        exists = conn.execute("SELECT to_regclass('datamachine.procrastinate_jobs')").fetchone()
        if exists is None or exists[0] is None:
            conn.execute(app.schema_manager.get_schema())
    host._job_queue_ready = True  # type: ignore[attr-defined]


def _request(messages: Any, tools: Any, provider: Any, model: Any, payload: Any,
             max_turns: Any) -> JobRequest:
    from datamachine.conversation.payload import check_payload_is_data, split_payload

    try:
        request = JobRequest(messages=messages, tools=list(tools or []), provider=provider,
                             model=model, payload=dict(payload or {}), max_turns=max_turns)
    except (ValidationError, TypeError) as exc:
        where, why = (first_field_error(exc)[:2] if isinstance(exc, ValidationError)
                      else ("arguments", str(exc)))
        raise UsageError(f"Cannot enqueue the job: {where}: {why}.") from None
    check_payload_is_data(request.payload)
    split_payload(request.payload)  # runtime options checked now, not on a worker later
    return request


def enqueue(host: Host, messages: Sequence[Mapping[str, Any]], tools: Sequence[str] | None = None,
            provider: str | None = None, model: str | None = None, *,
            payload: Mapping[str, Any] | None = None, max_turns: int | None = None,
            flow_step_id: str | None = None) -> Job:
    """Store a ``pending`` job and put it on the queue; the job (``job.id``).

    Everything is checked before anything is written: the messages, the tool names (registered
    on this host), the provider, a JSON-only payload. If the queue refuses the job, the job row
    is removed again, so nothing is left that no worker will ever run.
    """
    from agents_api import normalize_messages
    from agents_api.errors import InvalidMessage

    _require_postgres(host)
    request = _request(messages, tools, provider, model, payload, max_turns)
    try:
        normalize_messages(request.messages)
    except InvalidMessage as exc:
        raise UsageError(f"Cannot enqueue the job: messages: {exc}") from None
    unknown = [name for name in request.tools if name not in host.tools.names()]
    if unknown:
        raise UsageError(f"Cannot enqueue the job: no tool named {', '.join(map(repr, unknown))} "
                         "is registered on this host (see `datamachine tools`).")
    if request.provider is not None and request.provider not in host.providers.names():
        raise UsageError(f"Cannot enqueue the job: no provider named {request.provider!r} "
                         f"(known: {', '.join(sorted(host.providers.names()))}).")
    app = queue_app(host)
    _ensure_schema(app, host)
    job = host.jobs.create(flow_step_id, {"request": request.model_dump(mode="json")})
    try:
        with app.open():
            app.configure_task(TASK_NAME, queue=JOB_QUEUE, lock=job_session_id(job.id),
                               queueing_lock=job_session_id(job.id)).defer(job_id=job.id)
    except BaseException:
        host.handle.conn.execute("DELETE FROM jobs WHERE id = ? AND status = 'pending'", [job.id])
        raise
    return job


def run_job(host: Host, job_id: int, *, final: bool = True) -> str:
    """Run (or go on with) job ``job_id`` on ``host``; its status when this attempt ends.

    ``final``: the last attempt the queue will make, so a provider outage fails the job instead
    of leaving it for a retry. Raises :class:`JobNotDone` when a later attempt should go on.
    """
    from agents_api.drive import drive_sync
    from datamachine.conversation.continuation import continuation_steps

    job = host.jobs.get(job_id)
    if job.status in ("completed", "failed"):
        return job.status  # an attempt that finished it already (its ack was lost)
    try:
        request = JobRequest.model_validate(job.engine_data.get("request"))
    except ValidationError as exc:
        return _fail(host, job_id, f"job_request_invalid: {first_field_error(exc)[1]}")
    session_id = job_session_id(job_id)
    ttl = int(host.settings.effective("job_lock_ttl"))
    payload = {**request.payload, "job_id": job_id, "transcript_session_id": session_id,
               "transcript_lock_ttl": ttl}
    if not final:
        payload["job_retry_codes"] = sorted(OUTAGE_CODES | BUSY_CODES)
    tools = [host.tools.get(name) for name in request.tools] or None
    if tools is not None and None in tools:
        missing = [name for name in request.tools if host.tools.get(name) is None]
        return _fail(host, job_id, f"job_tools_missing: {', '.join(missing)} not registered "
                                   "on this worker")
    if host.transcripts.exists(session_id):  # an earlier attempt stored turns: go on from there
        done = host.transcripts.summary(session_id).cumulative_turn_count
        ceiling = request.max_turns or int(host.settings.effective("max_turns"))
        result = drive_sync(continuation_steps(
            host, session_id, max(1, ceiling - done), tools, request.provider, request.model,
            payload=payload, lock_ttl=ttl))
    else:
        result = host.run_conversation(request.messages, tools, request.provider, request.model,
                                       "pipeline", payload, request.max_turns)
    status = host.jobs.get(job_id).status
    if status not in ("pending", "running"):
        return status
    if final:  # nothing settled it and no attempt follows: it must not stay running
        return _fail(host, job_id, f"job_attempts_exhausted: {result.error_code or result.status}")
    if result.error_code in BUSY_CODES:
        raise JobNotDone(f"Job {job_id}: another run holds its transcript {session_id!r}; "
                         "trying again later.")
    raise JobNotDone(f"Job {job_id}: {result.error_code or result.status} "
                     f"({result.error}); trying again later.")


def _fail(host: Host, job_id: int, reason: str) -> str:
    if host.jobs.get(job_id).status == "pending":
        host.jobs.start(job_id)
    host.jobs.fail(job_id, reason)
    return "failed"


async def _recover_stalled(app: procrastinate.App, stalled_after: float,
                           every: float) -> None:
    """Hand the jobs of dead workers (no heartbeat for ``stalled_after`` seconds) out again."""
    while True:
        await asyncio.sleep(every)
        try:
            stalled = await app.job_manager.get_stalled_jobs(
                seconds_since_heartbeat=stalled_after)
            for job in stalled:
                with contextlib.suppress(Exception):  # another worker took it first
                    await app.job_manager.retry_job(job)
                    logger.warning("datamachine worker: job %s (procrastinate %s) was left by a "
                                   "worker that stopped; handed out again",
                                   job.task_kwargs.get("job_id"), job.id)
        except Exception:
            logger.exception("datamachine worker: looking for stalled jobs failed")


def run_worker(host: Host, *, concurrency: int = 4, stalled_after: float = 30.0,
               heartbeat: float | None = None, poll_interval: float = 1.0,
               wait: bool = True) -> None:
    """Run queued jobs on ``host`` until stopped (SIGINT/SIGTERM), ``concurrency`` at a time.

    ``stalled_after``: seconds without a heartbeat after which another worker's jobs count as
    abandoned and are run again (continuing their transcripts); heartbeats go out every
    ``heartbeat`` seconds (default: a third of it). New jobs arrive at once (LISTEN/NOTIFY);
    a retry that comes due is found within ``poll_interval`` seconds. ``wait=False`` returns
    once the queue is empty (for scripts and tests).
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"concurrency must be a whole number from 1, got "
                         f"{brief_repr(concurrency)}.")
    if not stalled_after > 0:
        raise UsageError(f"stalled_after must be a number of seconds above 0, got "
                         f"{brief_repr(stalled_after)}.")
    beat = heartbeat if heartbeat is not None else stalled_after / 3
    app = queue_app(host)
    _ensure_schema(app, host)

    async def work() -> None:
        async with app.open_async():
            recovery = asyncio.create_task(_recover_stalled(app, stalled_after, beat))
            try:
                await app.run_worker_async(
                    queues=[JOB_QUEUE], concurrency=concurrency, wait=wait,
                    update_heartbeat_interval=beat, stalled_worker_timeout=stalled_after,
                    fetch_job_polling_interval=poll_interval,
                    install_signal_handlers=True, delete_jobs="never")
            finally:
                recovery.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await recovery

    asyncio.run(work())
