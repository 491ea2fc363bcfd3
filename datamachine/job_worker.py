"""Workers of the task queue: ``datamachine worker`` runs queued pipeline jobs
(:func:`run_worker`), one attempt at a time (:func:`run_attempt`, :func:`run_job`). Jobs are
put on the queue by :class:`datamachine.job_queue.JobQueue` (``host.jobs.enqueue``).

A job runs as a pipeline-mode conversation on the transcript ``job-<id>``. A second attempt,
after a provider outage or a worker that died, continues that transcript instead of starting
over (the turns already stored are not paid for twice), and the transcript lock makes sure two
workers never write one job's run at once: an attempt that finds the lock held waits and
retries.

A job's attempts are counted by the budget ``job_attempts`` (DESIGN.md 22), resolved through
the host's registry like every other bounded loop: the payload's
``budget_ceilings["job_attempts"]``, else the setting ``job_max_attempts``, else its default,
clamped to its range. The attempt that spends it fails the job saying so: ``Job.flags`` holds
``max_job_attempts_reached``, ``Job.budget`` is ``job_attempts``, ``Job.budgets`` its snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import procrastinate
from procrastinate.exceptions import JobRetry
from procrastinate.retry import BaseRetryStrategy, RetryDecision
from pydantic import ValidationError

from agents_api.errors import brief_repr
from agents_api.transcript import HeldLock
from datamachine.budgets_builtin import CONVERSATION_TURNS, JOB_ATTEMPTS
from datamachine.errors import DataMachineError, InvalidBudgetValue, UsageError, first_field_error
from datamachine.job_queue import JOB_QUEUE, TASK_NAME, JobRequest, job_session_id
from datamachine.storage.jobs import JobOutcome
from datamachine.storage.task_queue import TaskQueueStore

if TYPE_CHECKING:
    from agents_api import IterationBudget
    from datamachine.host import Host
    from datamachine.storage.jobs import Job

__all__ = ["OUTAGE_CODES", "JobNotDone", "run_attempt", "run_job", "run_worker", "worker_app"]

logger = logging.getLogger("datamachine.worker")

# Failures worth another attempt later: the model (or the database) was unreachable, not
# wrong. HTTP errors are not among them: the provider layer already retried the statuses worth
# retrying (429, 5xx) with backoff, so what reaches the run is an answer to act on. Any other
# failure settles the job as failed at once.
OUTAGE_CODES = frozenset({"provider_timeout", "provider_connection_error",
                          "provider_unavailable", "provider_stream_error",
                          "transcript_write_failed"})
# Another run holds (or took over) the job's transcript: a worker that died, whose lock has
# not run out yet, or one that is slow but alive. Never a reason to fail the job.
BUSY_CODES = frozenset({"transcript_lock_contention", "transcript_lock_lost"})
RETRY_CODES = OUTAGE_CODES | BUSY_CODES
# Where a job counts the outages its attempts met (its engine data): the attempts its budget
# job_attempts has used.
OUTAGES_KEY = "queue_outages"
# Where a job keeps the notice of a clamped job_attempts ceiling (its engine data).
WARNINGS_KEY = "budget_warnings"
MAX_RETRY_WAIT_S = 300.0


class JobNotDone(DataMachineError, RuntimeError):
    """An attempt that could not finish its job and leaves it for a later one (a provider
    outage, or another run holding the job's transcript); procrastinate retries it after
    ``retry_in`` seconds."""

    def __init__(self, message: str, *, retry_in: float = 1.0) -> None:
        super().__init__(message)
        self.retry_in = retry_in


def worker_app(host: Host) -> procrastinate.App:
    """The procrastinate app of ``host``'s queue with the job task registered, bound to
    ``host`` (a worker runs jobs on it); registered once per host."""
    app = host.queue.app()
    if TASK_NAME not in app.tasks:

        @app.task(name=TASK_NAME, queue=JOB_QUEUE, retry=_RetryWhenAsked())
        def run_queued_job(job_id: int) -> str:
            return run_attempt(host, job_id)

    return app


class _RetryWhenAsked(BaseRetryStrategy):
    """procrastinate's retry strategy: retry exactly when :func:`run_job` said so
    (:class:`JobNotDone`), after the wait it named. procrastinate counts every attempt; a job's
    outages are counted by the job itself (its engine data), so waiting for a dead worker's
    lock never uses up the attempts its outages have."""

    def get_retry_exception(self, exception: BaseException, job: Any) -> Any:
        if not isinstance(exception, JobNotDone):
            return None
        return JobRetry(RetryDecision(
            retry_in={"milliseconds": max(1, round(exception.retry_in * 1000))}))


def run_attempt(host: Host, job_id: int) -> str:
    """One attempt of job ``job_id`` as the queue runs it: :func:`run_job`, with anything it
    did not expect turned into a decision, so a job row is never left ``pending`` or
    ``running`` with no attempt to come. A database failure (a restart, a dropped connection)
    is retried like an outage; anything else fails the job, naming the error."""
    from datamachine.errors import DatabaseError

    try:
        return run_job(host, job_id)
    except JobNotDone as exc:
        logger.info("%s", exc)
        raise
    except DatabaseError as exc:
        logger.warning("datamachine worker: job %s: %s", job_id, exc)
        try:
            return _outage_or_fail(host, job_id, "database_error", str(exc))
        except DatabaseError:
            raise JobNotDone(f"Job {job_id}: the database is unreachable ({exc}); trying "
                             "again later.", retry_in=_backoff(host, 0)) from None
    except Exception as exc:
        logger.exception("datamachine worker: job %s failed", job_id)
        with contextlib.suppress(Exception):
            return _fail(host, job_id, f"job_error: {type(exc).__name__}: {exc}")
        raise


def _backoff(host: Host, outages: int) -> float:
    base = float(host.settings.effective("job_retry_wait"))
    return float(min(MAX_RETRY_WAIT_S, base * 2 ** outages))


def _attempts(host: Host, job: Job) -> IterationBudget:
    """The job's budget ``job_attempts``, counting the attempts its outages used: resolved by
    the registry from the payload's ``budget_ceilings["job_attempts"]`` (checked as a run
    checks it), else the setting, else the default, then clamped. A clamp is logged and kept
    in the job's engine data (``budget_warnings``). An override that is no ceiling raises
    :class:`InvalidBudgetValue`."""
    request = job.engine_data.get("request")
    payload = request.get("payload") if isinstance(request, Mapping) else None
    ceilings = payload.get("budget_ceilings") if isinstance(payload, Mapping) else None
    override = ceilings.get(JOB_ATTEMPTS) if isinstance(ceilings, Mapping) else None
    if override is not None:
        host.budgets.check_ceiling(JOB_ATTEMPTS, f"payload['budget_ceilings'][{JOB_ATTEMPTS!r}]",
                                   override)
    used = job.engine_data.get(OUTAGES_KEY)
    warnings: list[str] = []
    budget = host.budgets.create(
        JOB_ATTEMPTS, current=used if isinstance(used, int) and not isinstance(used, bool)
        and used > 0 else 0, ceiling_override=override, warnings=warnings)
    if warnings and job.engine_data.get(WARNINGS_KEY) != warnings:
        logger.warning("datamachine worker: job %s: %s", job.id, "; ".join(warnings))
        host.jobs.merge_engine_data(job.id, {WARNINGS_KEY: warnings})
    return budget


def _outage_or_fail(host: Host, job_id: int, code: str, detail: str,
                    ran: JobOutcome | None = None) -> str:
    """Count this attempt, which met an outage, on the job's ``job_attempts``; another attempt
    after a backoff (JobNotDone), or, when that was the last, fail the job with ``code``
    saying which budget ran out (``ran``: what the attempt's run recorded, kept beside it)."""
    job = host.jobs.get(job_id)
    if job.status not in ("pending", "running"):
        return job.status
    try:
        attempts = _attempts(host, job)
    except InvalidBudgetValue as exc:
        return _fail(host, job_id, f"job_request_invalid: {exc}")
    attempts.increment()
    used = attempts.current()
    # Counted before the job fails: a worker that dies in between leaves a job whose next
    # attempt finds its attempts spent and fails it without asking the model.
    host.jobs.merge_engine_data(job_id, {OUTAGES_KEY: used})
    if attempts.exceeded():
        return _out_of_attempts(host, job_id, attempts, code, ran)
    raise JobNotDone(f"Job {job_id}: {code} ({detail}); attempt {used + 1} of "
                     f"{attempts.ceiling()} later.", retry_in=_backoff(host, used - 1))


def _out_of_attempts(host: Host, job_id: int, attempts: IterationBudget, code: str,
                     ran: JobOutcome | None = None) -> str:
    """Fail the job whose ``job_attempts`` are spent with ``code``, saying so as a run does:
    the flag ``max_job_attempts_reached`` after those of its last run (``ran``), the budget
    ``job_attempts``, its snapshot beside the run's."""
    ran = ran or JobOutcome()
    flag = attempts.to_response_flag()
    logger.warning("datamachine worker: job %s: %s (%s)", job_id, attempts.to_warning(), code)
    return _fail(host, job_id, code, JobOutcome(
        flags=(*(f for f in ran.flags if f != flag), flag), budget=JOB_ATTEMPTS,
        budgets={**ran.budgets, JOB_ATTEMPTS: attempts.snapshot()}))


def _busy(host: Host, job_id: int, session_id: str) -> JobNotDone:
    """Another run holds the job's transcript: try again when its lock runs out (a dead
    worker's), or shortly (a live one renews it every turn and then finishes the job)."""
    from agents_api import clock

    info = host.transcripts.locks.info(session_id)
    left = info.expires_at - clock.now() if info is not None else 0.0
    wait = min(MAX_RETRY_WAIT_S, max(_backoff(host, 0), left + 0.1))
    return JobNotDone(f"Job {job_id}: another run holds its transcript {session_id!r}; "
                      f"trying again in {wait:.1f} s.", retry_in=wait)


def run_job(host: Host, job_id: int) -> str:
    """Run (or go on with) job ``job_id`` on ``host``; its status when this attempt ends.

    Raises :class:`JobNotDone` (with the wait before the next attempt) when a later attempt
    should go on: after a provider outage (as many attempts as the budget ``job_attempts``
    allows, counted in the job's engine data; the last one fails the job with the flag
    ``max_job_attempts_reached``), or while another run holds the job's transcript (never
    counted: a dead worker's lock runs out, a live worker finishes).
    """
    from agents_api.drive import drive_sync
    from datamachine.completion.jobs import job_outcome
    from datamachine.conversation.resuming import TranscriptFinished, continuation_steps

    job = host.jobs.get(job_id)
    if job.status in ("completed", "failed"):
        return job.status  # an attempt that finished it already (its ack was lost)
    try:
        request = JobRequest.model_validate(job.engine_data.get("request"))
    except ValidationError as exc:
        return _fail(host, job_id, f"job_request_invalid: {first_field_error(exc)[1]}")
    attempts = _checked(host, job, request)
    if isinstance(attempts, str):
        return attempts
    session_id = job_session_id(job_id)
    stored = host.transcripts.summary(session_id) if host.transcripts.exists(session_id) \
        else None
    ttl = int(host.settings.effective("job_lock_ttl"))
    settled = _settled_already(host, job, request, stored, ttl, attempts)
    if settled is not None:
        return settled
    # The run leaves its job running on an outage or a busy lock: whether another attempt
    # follows is the worker's to decide, with the job's attempts budget.
    payload = {**request.payload, "job_id": job_id, "transcript_session_id": session_id,
               "transcript_lock_ttl": ttl, "job_retry_codes": sorted(RETRY_CODES)}
    tools = [host.tools.get(name) for name in request.tools] or None
    if stored is not None:  # an earlier attempt stored turns: go on from there
        ceiling = _turn_ceiling(host, request)
        try:
            result = drive_sync(continuation_steps(
                host, session_id, max(1, ceiling - stored.cumulative_turn_count), tools,
                request.provider, request.model, payload=payload, lock_ttl=ttl,
                unfinished_only=_unfinished))
        except TranscriptFinished as finished:  # another attempt finished it meanwhile
            return _settle_from(host, job_id, finished.record)
    else:
        # A first attempt takes the lock before it looks: a duplicate attempt (a worker taken
        # for dead that was only slow) may have run the whole job between our look above and
        # now, and starting afresh would run it a second time on its finished transcript.
        token = host.transcripts.acquire(session_id, ttl)
        if token is None:
            raise _busy(host, job_id, session_id)
        if host.transcripts.exists(session_id):
            host.transcripts.release(session_id, token)
            return run_job(host, job_id)  # go on with (or settle) what it stored
        held = HeldLock(host.transcripts, session_id, token)
        try:
            result = host.run_conversation(request.messages, tools, request.provider,
                                           request.model, "pipeline",
                                           {**payload, "transcript_lock": held},
                                           request.max_turns)
        finally:
            host.transcripts.release(session_id, token)  # freed already when the run ended
    after = host.jobs.get(job_id)
    if after.status == "completed":
        # An earlier attempt's error stays in the engine data unless cleared: the job did not
        # end with it.
        stale = {key: None for key in ("error", "error_code")
                 if after.engine_data.get(key) is not None and getattr(result, key) is None}
        if stale:
            host.jobs.merge_engine_data(job_id, stale)
    if after.status not in ("pending", "running"):
        return after.status
    if result.error_code in BUSY_CODES:
        raise _busy(host, job_id, session_id)
    return _outage_or_fail(host, job_id, result.error_code or f"job_{result.status}",
                           str(result.error), job_outcome(
                               {"flags": result.flags, "budget": result.budget,
                                "budgets": result.budgets}))


def _checked(host: Host, job: Job, request: JobRequest) -> IterationBudget | str:
    """The job's ``job_attempts`` when this worker can run it (a clamped ceiling is reported
    here); else the job failed at once, its status (a tool or provider this worker lacks, an
    attempts ceiling that is no ceiling)."""
    missing = [name for name in request.tools if host.tools.get(name) is None]
    if missing:
        return _fail(host, job.id, f"job_tools_missing: {', '.join(missing)} not registered "
                                   "on this worker")
    if request.provider is not None and request.provider not in host.providers.names():
        return _fail(host, job.id, f"job_provider_missing: {request.provider} not registered "
                                   "on this worker")
    try:
        return _attempts(host, job)
    except InvalidBudgetValue as exc:
        return _fail(host, job.id, f"job_request_invalid: {exc}")


def _turn_ceiling(host: Host, request: JobRequest) -> int:
    """The job's whole run's turn ceiling, as its first attempt's run resolved it: the
    budget ``conversation_turns`` from ``max_turns``, else the payload's ``budget_ceilings``,
    else the setting, else the default, clamped (a later attempt goes on with what is left)."""
    override = request.max_turns
    if override is None:
        ceilings = request.payload.get("budget_ceilings")
        found = ceilings.get(CONVERSATION_TURNS) if isinstance(ceilings, Mapping) else None
        override = found if isinstance(found, int) and not isinstance(found, bool) else None
    return host.budgets.resolve(CONVERSATION_TURNS, override).ceiling


def _settled_already(host: Host, job: Job, request: JobRequest, stored: Any, ttl: int,
                     attempts: IterationBudget) -> str | None:
    """The job's status when an earlier attempt's run is over and only its settling is left
    (never ask the model again), or when its ``attempts`` are spent already (its ceiling was
    lowered since); None when the run must go on (or start)."""
    if stored is not None and not _unfinished(stored):
        # The run ended and was stored, but its job was not settled (the worker died between
        # the two, or settling failed): settle it from what was stored.
        return _settle_from(host, job.id, stored)
    if stored is not None and _answered(host, stored.id, request):
        return _close_answered(host, job.id, stored.id, ttl)
    if attempts.exceeded():
        last = job.engine_data.get("error_code")
        return _out_of_attempts(host, job.id, attempts, last if isinstance(last, str) and last
                                else attempts.to_response_flag())
    return None


# Payload keys under which a run's end is more than the model's answer (a policy decides).
_DECIDED_ENDS = ("completion_assertions", "completion_policy", "output_type")


def _answered(host: Host, session_id: str, request: JobRequest) -> bool:
    """Whether a job's unfinished transcript ends with the model's answer: its worker died
    after storing the last turn (an answer, no tool call after it) and before the run's final
    write. Going on would ask the model for that answer a second time. Only for jobs whose
    end the answer alone decides: no completion assertions or policy, no structured output,
    no handler tools (those may have nudged the answer instead)."""
    if any(request.payload.get(key) for key in _DECIDED_ENDS):
        return False
    if any(getattr(host.tools.get(name), "handler", None) for name in request.tools):
        return False
    messages = host.transcripts.get(session_id)
    last = messages[-1] if messages else {}
    return bool(last.get("type") == "text" and last.get("role") == "assistant"
                and isinstance(last.get("content"), str) and last["content"].strip()
                and not (last.get("metadata") or {}).get("type"))


def _close_answered(host: Host, job_id: int, session_id: str, ttl: int) -> str:
    """Store the end of a run whose answer was stored (see :func:`_answered`) and settle its
    job, under the transcript's lock (another attempt may be at it: then wait for it)."""
    token = host.transcripts.acquire(session_id, ttl)
    if token is None:
        raise _busy(host, job_id, session_id)
    try:
        now = host.transcripts.summary(session_id)
        if not _unfinished(now):  # another attempt ended it meanwhile
            return _settle_from(host, job_id, now)
        host.transcripts.set_status(session_id, "completed")
    finally:
        host.transcripts.release(session_id, token)
    logger.info("datamachine: job %s: its run had answered before its worker stopped; "
                "settled from the stored answer", job_id)
    return _settle_from(host, job_id, None)


def _unfinished(record: Any) -> bool:
    """Whether a job's stored transcript is one to go on with: a run still going (or killed),
    or one that stopped on an outage or a busy lock; not one that ended."""
    return bool(record.status in ("running", "interrupted")
                or record.result.get("error_code") in RETRY_CODES)


def _settle_from(host: Host, job_id: int, record: Any) -> str:
    """Settle the job from its run's stored transcript ``record`` (None: a run that answered
    and stored nothing more), with the flags, budget and budgets it stored."""
    from datamachine.completion.jobs import failure_reason, job_outcome

    stored: Mapping[str, Any] = record.result if record is not None else {}
    outcome = job_outcome({**stored, "budgets": record.budgets if record is not None else {}})
    reason = failure_reason(stored, remaining_handlers=stored.get("remaining_handlers") or ())
    if reason is None:
        if host.jobs.get(job_id).status == "pending":
            host.jobs.start(job_id)
        host.jobs.complete(job_id, outcome)
        return "completed"
    return _fail(host, job_id, reason, outcome)


def _fail(host: Host, job_id: int, reason: str, outcome: JobOutcome | None = None) -> str:
    if host.jobs.get(job_id).status == "pending":
        host.jobs.start(job_id)
    host.jobs.fail(job_id, reason, outcome)
    return "failed"


# Taken by the one worker at a time that looks for the jobs of dead workers.
_RECOVERY_LOCK = "datamachine:stalled-job-recovery"


async def _recover_stalled(app: procrastinate.App, url: str, stalled_after: float,
                           every: float) -> None:
    """Hand the jobs of dead workers (no heartbeat for ``stalled_after`` seconds) out again.

    One worker at a time does it (a session advisory lock on a connection of its own), reading
    the stalled jobs while it holds the lock: two workers acting on one stale list could put a
    job back in the queue after a live worker had fetched it.
    """
    while True:
        await asyncio.sleep(every)
        await _recover_once(app, url, stalled_after)


async def _recover_once(app: procrastinate.App, url: str, stalled_after: float) -> None:
    try:
        async with TaskQueueStore.alone(url, _RECOVERY_LOCK) as held:
            if not held:
                return  # another worker is at it
            for job in await app.job_manager.get_stalled_jobs(
                    seconds_since_heartbeat=stalled_after):
                with contextlib.suppress(Exception):  # it finished meanwhile
                    await app.job_manager.retry_job(job)
                    logger.warning("datamachine worker: job %s was left by a worker that "
                                   "stopped; handed out again",
                                   job.task_kwargs.get("job_id"))
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
    app = worker_app(host)
    host.queue.ensure_tables()
    url = host.queue.url()

    async def work() -> None:
        async with app.open_async():
            if not wait:  # a burst: no loop to find dead workers' jobs later, so look once now
                await _recover_once(app, url, stalled_after)
            recovery = asyncio.create_task(_recover_stalled(app, url, stalled_after, beat))
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
