"""The task queue a host puts pipeline jobs on: :class:`JobQueue` (``host.queue``), behind
``host.jobs.enqueue`` and ``datamachine jobs enqueue`` (DESIGN.md 18). Workers run the jobs:
:mod:`datamachine.job_worker`.

Why procrastinate and not Celery: the scale-out setup already has PostgreSQL for the stores, and
procrastinate needs nothing else (Celery would add Redis, a second server to run and secure).
Its workers fetch with ``SELECT ... FOR UPDATE SKIP LOCKED``, so one queued job is handed to one
worker; they send heartbeats, so the jobs of a worker that died (``kill -9``) can be found and
handed out again; it retries with the strategy we give it. Its tables live in the ``datamachine``
schema beside ours (``procrastinate_*``).

What a job is: a row of ``jobs`` (``pending`` until a worker starts it) whose engine data holds
the run's request under ``"request"``, and one procrastinate job carrying its id. A worker runs
it as a pipeline-mode conversation on the transcript ``job-<id>``.

procrastinate (the ``postgres`` extra) is imported when the queue is first used, never at boot:
a SQLite host never loads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamachine.errors import UsageError, first_field_error

if TYPE_CHECKING:
    import procrastinate

    from datamachine.providers.registry import ProviderRegistry
    from datamachine.registry import BudgetSpecs
    from datamachine.storage.jobs import Job, JobStore
    from datamachine.storage.task_queue import TaskQueueStore
    from datamachine.tools.registry import ToolRegistry

__all__ = ["JOB_QUEUE", "TASK_NAME", "JobQueue", "JobRequest", "job_session_id"]

JOB_QUEUE = "datamachine"
TASK_NAME = "datamachine.run_job"


class JobRequest(BaseModel):
    """What a queued job runs: stored in its engine data (``engine_data["request"]``), so any
    worker can run it from the database alone."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[str] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1, le=10_000)


def job_session_id(job_id: int) -> str:
    """The transcript a job's run writes: the same for every attempt, so a later one
    continues it."""
    return f"job-{job_id}"


class JobQueue:
    """One host's side of the task queue: the procrastinate app on its database (made on first
    use), whether the queue's tables exist, the connections opened to put jobs on it.

    ``tools``, ``providers`` and ``budgets`` are the host's: a job naming a tool or provider
    the host does not have, or giving a budget a ceiling it cannot have
    (``budget_ceilings``), is refused before anything is stored.
    """

    def __init__(self, tables: TaskQueueStore, *, tools: ToolRegistry,
                 providers: ProviderRegistry, budgets: BudgetSpecs) -> None:
        self._tables = tables
        self._tools = tools
        self._providers = providers
        self._budgets = budgets
        self._app: procrastinate.App | None = None
        self._tables_ready = False
        # Opened once, on the first job put on the queue (its connections are reused), and
        # closed with the host.
        self._opened: procrastinate.App | None = None

    def url(self) -> str:
        """The PostgreSQL URL of the queue's database; on SQLite a UsageError saying what to
        set (there is no queue there)."""
        url = self._tables.postgres_url
        if url is None:
            raise UsageError(
                "The job queue runs on PostgreSQL: set DATAMACHINE_DB=postgresql://... (or boot "
                "with db_path=\"postgresql://...\") on every host that enqueues or works. "
                "See `datamachine docs scale-out`.")
        return url

    def app(self) -> procrastinate.App:
        """The procrastinate app of the host's database, made once. Workers register the job
        task on it (:func:`datamachine.job_worker.run_worker`); putting a job on the queue
        needs only its name."""
        if self._app is not None:
            return self._app
        url = self.url()
        try:
            import procrastinate
        except ImportError as exc:
            raise UsageError(f"The job queue needs the postgres extra ({exc}): pip install "
                             "'datamachine-agents[postgres]'.") from None
        self._app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=self._tables.conninfo(url)))
        return self._app

    def ensure_tables(self) -> None:
        """procrastinate's tables, created once per database: applied by procrastinate itself
        while this host holds the whole-database lock, so hosts starting together take turns."""
        if self._tables_ready:
            return
        app = self.app()

        def apply() -> None:
            with app.open():
                app.schema_manager.apply_schema()

        self._tables.create_tables_once(apply)
        self._tables_ready = True

    def enqueue(self, store: JobStore, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[str] | None = None, provider: str | None = None,
                model: str | None = None, *, payload: Mapping[str, Any] | None = None,
                max_turns: int | None = None, flow_step_id: str | None = None) -> Job:
        """Store a ``pending`` job in ``store`` and put it on the queue; the job (``job.id``).

        Everything is checked before anything is written: the messages, the tool names
        (registered on this host), the provider, a JSON-only payload. If the queue refuses the
        job, the job row is removed again. (The row and the queue entry are two commits: a
        process killed between them leaves a ``pending`` job that ``datamachine jobs list
        --status pending`` shows and no worker runs; :meth:`requeue` puts it on the queue.)
        """
        self.url()  # on SQLite: refused before anything is checked
        request = self._checked(messages, tools, provider, model, payload, max_turns)
        self.ensure_tables()
        job = store.create(flow_step_id, {"request": request.model_dump(mode="json")})
        try:
            self._defer(job.id)
        except BaseException:
            store.delete_pending(job.id)
            raise
        return job

    def requeue(self, store: JobStore, job_id: int) -> Job:
        """Put a ``pending`` job on the queue again: one whose queue entry was never written
        (its process died between the two commits of :meth:`enqueue`). A job already waiting
        on the queue, or one that started, is refused with what to do instead."""
        self.url()  # on SQLite: refused first
        job = store.get(job_id)
        if job.status != "pending":
            raise UsageError(f"Job {job.id} is {job.status!r}; only a pending job can be "
                             "queued again (a running one is continued by the workers; enqueue "
                             "a new job to run a finished one again).")
        self.ensure_tables()
        from procrastinate.exceptions import AlreadyEnqueued

        try:
            self._defer(job.id)
        except AlreadyEnqueued:
            raise UsageError(f"Job {job.id} is already on the queue; a worker will run it "
                             "(`datamachine worker`).") from None
        return job

    def close(self) -> None:
        """Close the connections opened to put jobs on the queue (the host closes it)."""
        opened, self._opened = self._opened, None
        if opened is not None:
            with contextlib.suppress(Exception):
                opened.close()

    def _defer(self, job_id: int) -> None:
        app = self.app()
        if self._opened is None:
            self._opened = app.open()
        app.configure_task(TASK_NAME, queue=JOB_QUEUE, lock=job_session_id(job_id),
                           queueing_lock=job_session_id(job_id)).defer(job_id=job_id)

    def _checked(self, messages: Any, tools: Any, provider: Any, model: Any, payload: Any,
                 max_turns: Any) -> JobRequest:
        """The job's request, checked as its run would check it (UsageError naming what is
        wrong)."""
        from agents_api import normalize_messages
        from agents_api.errors import InvalidMessage

        request = _request(messages, tools, provider, model, payload, max_turns)
        try:
            normalize_messages(request.messages)
        except InvalidMessage as exc:
            raise UsageError(f"Cannot enqueue the job: messages: {exc}") from None
        unknown = [name for name in request.tools if name not in self._tools.names()]
        if unknown:
            raise UsageError(f"Cannot enqueue the job: no tool named "
                             f"{' or '.join(map(repr, unknown))} is registered on this host "
                             "(see `datamachine tools`).")
        if request.provider is not None and request.provider not in self._providers.names():
            raise UsageError(f"Cannot enqueue the job: no provider named {request.provider!r} "
                             f"(known: {', '.join(sorted(self._providers.names()))}).")
        # Each ceiling in its budget's unit, as the run (and, for job_attempts, the worker)
        # would check it: on a worker, a bad one would only fail the job.
        for name, ceiling in (request.payload.get("budget_ceilings") or {}).items():
            try:
                self._budgets.check_ceiling(name, f"payload['budget_ceilings'][{name!r}]",
                                            ceiling)
            except UsageError as exc:
                raise UsageError(f"Cannot enqueue the job: {exc}") from None
        return request


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
    _, runtime = split_payload(request.payload)  # runtime options checked now, not on a worker
    _check_assertions(runtime.completion_assertions, request.tools)
    return request


def _check_assertions(raw: Any, tools: Sequence[str]) -> None:
    """A queued job's completion assertions, checked as its run would, with the warnings a run
    would only report (nobody reads a queued run's warnings) as errors."""
    from datamachine.completion.assertions import parse_assertions
    from datamachine.completion.preflight import unavailable_required_tool_names

    assertions, warnings = parse_assertions(raw)
    if warnings:
        raise UsageError(f"Cannot enqueue the job: {'; '.join(warnings)} (see `datamachine docs "
                         "completion` for the keys).")
    missing = unavailable_required_tool_names(assertions, tools)
    if missing:
        raise UsageError(f"Cannot enqueue the job: completion_assertions require "
                         f"{', '.join(map(repr, missing))}, which the job does not offer "
                         "(add them to its tools).")
