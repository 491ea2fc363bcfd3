"""A pipeline run's job: start it, record nudges, and settle it with the run's outcome.

A pipeline step runs inside a job (payload ``job_id``). The job is where the rest of the
pipeline, and the people watching it, look for what the step did: so the run writes its
completion diagnostics, usage and transcript id into the job's engine data, and moves the job to
``completed``, or to ``failed`` with a reason a dashboard can group by
(``completion_assertions_missing`` when the model stopped before the outcome was in place).
A run that stopped on a budget says so on its job as in its result: the job's ``flags``
(``max_conversation_turns_reached``), ``budget`` and ``budgets`` (:func:`job_outcome`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agents_api.errors import brief_repr
from agents_api.jsontext import compact_json
from datamachine.errors import DataMachineError, InvalidJobTransition, JobNotFound
from datamachine.storage.jobs import JobOutcome, JobStore, is_job_id

__all__ = ["PipelineJob", "failure_reason", "job_diagnostics", "job_outcome"]

logger = logging.getLogger("datamachine.completion")

ASSERTIONS_MISSING = "completion_assertions_missing"
HANDLERS_MISSING = "completion_handlers_missing"
BLOCKER_REPORTED = "blocker_reported"


def _job_id(value: Any) -> int | None:
    """The job id a payload's ``job_id`` names (an int or its digits), else None: a value no
    job could have (``0``, ``2**63``) is reported as "not a job id", like ``"abc"``."""
    # isdecimal, not isdigit: int() refuses digits such as "²" that isdigit accepts.
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) <= 19:
        value = int(value.strip())
    return value if is_job_id(value) else None


def _json_ready(data: Mapping[str, Any]) -> dict[str, Any]:
    # Tools may leave non-JSON values in engine data; the job keeps their text form.
    return dict(json.loads(compact_json(dict(data))))


def failure_reason(result: Mapping[str, Any], *, remaining_handlers: Sequence[str] = ()
                   ) -> str | None:
    """Why the job of this run failed, or None when it completed (``result``: its fields)."""
    status = result.get("status")
    if status == "error":
        return str(result.get("error_code") or "conversation_error")
    if status in ("transcript_lock_contention", "aborted", "awaiting_confirmation"):
        return str(status)
    if result.get("completion_assertions_complete") is False:
        return ASSERTIONS_MISSING
    if remaining_handlers:
        return HANDLERS_MISSING
    if result.get("blocker") is not None:
        return BLOCKER_REPORTED
    return None


_DIAGNOSTIC_KEYS = ("completed", "turn_count", "usage", "transcript_session_id", "warning",
                    "error", "error_code", "completion_nudge_count", "completion_nudge",
                    "blocker")
_ASSERTION_KEYS = ("completion_assertions_required", "completion_assertions_missing",
                   "completion_assertions_satisfied", "completion_assertions_complete")


def job_diagnostics(result: Mapping[str, Any]) -> dict[str, Any]:
    """What a job's engine data keeps of its run (``result``: the result's fields)."""
    data: dict[str, Any] = {"conversation_status": result.get("status")}
    data.update({key: result.get(key) for key in _DIAGNOSTIC_KEYS})
    if result.get("completion_assertions_complete") is not None:
        data.update({key: result.get(key) for key in _ASSERTION_KEYS})
    if result.get("unavailable_required_tool_names"):
        data["unavailable_required_tool_names"] = result["unavailable_required_tool_names"]
        data["available_tool_names"] = result.get("available_tool_names")
    if result.get("remaining_handlers"):
        data["remaining_handlers"] = result["remaining_handlers"]
    return {key: value for key, value in data.items() if value is not None}


def job_outcome(result: Mapping[str, Any]) -> JobOutcome:
    """What a job's end records of the run that ended it (``result``: its fields, or a stored
    transcript's result with its ``budgets``): the run's flags, the budget it stopped on (None:
    none) and its budgets' snapshots."""
    flags = result.get("flags")
    budget = result.get("budget")
    budgets = result.get("budgets")
    return JobOutcome(
        flags=tuple(str(flag) for flag in flags) if isinstance(flags, list | tuple) else (),
        budget=budget if isinstance(budget, str) and budget else None,
        budgets=_json_ready(budgets) if isinstance(budgets, Mapping) else {})


class PipelineJob:
    """The job one pipeline run belongs to."""

    def __init__(self, store: JobStore, job_id: int,
                 retry_codes: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.id = job_id
        # Error codes after which the job stays running (payload ``job_retry_codes``, set by
        # the queue worker: it decides with the budget job_attempts whether another attempt
        # follows, and fails the job when none does).
        self.retry_codes = retry_codes

    @classmethod
    def resolve(cls, store: JobStore, modes: Sequence[str], payload: Mapping[str, Any],
                warnings: list[str], retry_codes: Sequence[str] = ()) -> PipelineJob | None:
        """The job of a pipeline-mode run with ``payload["job_id"]``, checked before the run
        (``retry_codes``: see the class).

        A job id this host does not know is reported in ``warnings`` (the caller may track jobs
        elsewhere); a job that already finished raises :class:`InvalidJobTransition`, because
        running a finished step again usually means two workers picked it up.
        """
        if "pipeline" not in modes:
            return None
        raw = payload.get("job_id")
        if raw is None or raw == "":
            return None
        job_id = _job_id(raw)
        if job_id is None:
            warnings.append(f"payload job_id {brief_repr(raw)} is not a job id; no job was "
                            "updated.")
            return None
        try:
            job = store.get(job_id)
        except JobNotFound:
            warnings.append(f"Job {job_id} does not exist on this host; no job was updated.")
            return None
        if job.status in ("completed", "failed"):
            raise InvalidJobTransition(
                f"Job {job_id} is already {job.status!r}; a pipeline run cannot start it again. "
                "Create a new job (host.jobs.create()) to run the step again."
            )
        return cls(store, job_id, frozenset(retry_codes))

    def start(self) -> None:
        """``pending`` -> ``running``; a job the host already started is left as it is."""
        if self.store.get(self.id).status == "pending":
            self.store.start(self.id)

    def merge(self, data: Mapping[str, Any], warnings: list[str] | None = None) -> None:
        """Merge ``data`` into the job's engine data; a storage failure becomes a warning."""
        try:
            self.store.merge_engine_data(self.id, _json_ready(data))
        except DataMachineError as exc:
            logger.warning("datamachine: updating job %s failed", self.id, exc_info=True)
            if warnings is not None:
                warnings.append(f"Job {self.id} engine data could not be updated: {exc}")

    def settle(self, engine_data: Mapping[str, Any], diagnostics: Mapping[str, Any],
               reason: str | None, warnings: list[str],
               outcome: JobOutcome | None = None) -> None:
        """Write the run's engine data and diagnostics, then complete or fail the job with
        ``outcome`` (the run's flags, budget and budgets), or leave it running, when the
        failure is one a later attempt may get past (``retry_codes``)."""
        self.merge({**engine_data, **diagnostics}, warnings)
        if reason is not None and diagnostics.get("error_code") in self.retry_codes:
            self.start()
            return
        try:
            self.start()
            if reason is None:
                self.store.complete(self.id, outcome)
            else:
                self.store.fail(self.id, reason, outcome)
        except DataMachineError as exc:
            logger.warning("datamachine: settling job %s failed", self.id, exc_info=True)
            warnings.append(f"Job {self.id} could not be marked finished: {exc}")
