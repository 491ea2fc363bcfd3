"""The report_blocker tool, and pipeline jobs settled with the run's completion outcome."""

from __future__ import annotations

from typing import Any

import pytest

from datamachine.errors import InvalidJobTransition
from datamachine.host import Host
from tests.completion.helpers import (
    USER,
    Events,
    broken,
    call,
    fetch,
    remember_post,
    save_note,
    say,
    turn,
)

NOTE_REQUIRED = {"required_tool_names": ["save_note"]}


def run(host: Host, script: list[dict[str, Any]], tools: list[Any], *, mode: str = "pipeline",
        max_turns: int | None = None, **payload: Any) -> Any:
    payload["script"] = script
    return host.run_conversation(USER, tools, "scripted", "m", mode=mode, payload=payload,
                                 max_turns=max_turns)


# -- report_blocker --------------------------------------------------------------------------
def test_blocker_ends_the_run_incomplete_with_the_reason(host: Host) -> None:
    events = Events()
    script = [turn(call("broken")), say("Done."),
              turn(call("report_blocker", reason="The notes service is down.")),
              say("never asked")]
    result = run(host, script, [broken], mode="chat",
                 completion_assertions={"required_tool_names": ["broken"]}, event_sink=events)
    assert (result.status, result.completed, result.turn_count) == ("incomplete", False, 3)
    assert result.blocker == "The notes service is down."
    assert result.completion_nudge_count == 1
    assert result.completion_assertions_missing == {"tool_names": ["broken"]}
    assert "The notes service is down." in (result.warning or "")
    [reported] = events.named("blocker_reported")
    assert reported["reason"] == "The notes service is down."
    assert reported["turn"] == 3
    assert reported["completion_assertions_missing"] == {"tool_names": ["broken"]}
    assert events.names[-1] == "completed"
    # The terminal event carries the settled verdict, as the result and the transcript do.
    assert events.named("completed")[0]["status"] == "incomplete"


def test_blocker_tool_is_offered_only_when_assertions_are_configured(host: Host) -> None:
    with_assertions = run(host, [turn(call("save_note", text="n")), say("ok")], [save_note],
                          mode="chat", completion_assertions=NOTE_REQUIRED)
    assert "report_blocker" in with_assertions.request_metadata["tools"]["names"]
    without = run(host, [turn(call("report_blocker", reason="x")), say("ok")], [save_note],
                  mode="chat")
    assert without.request_metadata["tools"]["names"] == ["save_note"]
    assert without.blocker is None
    assert without.tool_execution_results[0]["result"]["error_type"] == "tool_not_found"


def test_blocker_with_an_empty_reason_is_refused_and_the_run_goes_on(host: Host) -> None:
    script = [turn(call("report_blocker", reason="  ")), turn(call("save_note", text="n")),
              say("Filed.")]
    result = run(host, script, [save_note], mode="chat", completion_assertions=NOTE_REQUIRED)
    assert (result.status, result.blocker) == ("completed", None)
    first = result.tool_execution_results[0]["result"]
    assert first["success"] is False


def test_a_users_own_report_blocker_tool_is_left_alone(host: Host) -> None:
    from datamachine import tool

    reports: list[str] = []

    @tool
    def report_blocker(reason: str) -> str:
        """Log a blocker.

        Args:
            reason: Why.
        """
        reports.append(reason)
        return "logged"

    script = [turn(call("report_blocker", reason="r")), turn(call("save_note", text="n")),
              say("ok")]
    result = run(host, script, [report_blocker, save_note], mode="chat",
                 completion_assertions=NOTE_REQUIRED)
    assert (result.status, result.blocker, reports) == ("completed", None, ["r"])


# -- pipeline jobs ---------------------------------------------------------------------------
def test_pipeline_job_completes_with_diagnostics_usage_and_transcript(host: Host) -> None:
    job = host.jobs.create(flow_step_id="step-1", engine_data={"source": "feed"})
    script: list[dict[str, Any]] = [
        {"content": "", "tool_calls": [call("remember_post", post_id=9)],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
        {"content": "Stored.", "usage": {"total_tokens": 4}},
    ]
    result = run(host, script, [remember_post], job_id=job.id, mode="chat,pipeline",
                 completion_assertions={"required_engine_data_keys": ["post_id"]})
    assert (result.status, result.completed) == ("completed", True)
    stored = host.jobs.get(job.id)
    assert stored.status == "completed"
    assert stored.failure_reason is None
    data = stored.engine_data
    assert data["source"] == "feed"
    assert data["post_id"] == 9  # written by the tool through ToolContext.engine_data
    assert data["usage"]["total_tokens"] == 9
    assert data["transcript_session_id"] == result.transcript_session_id
    assert data["completion_assertions_complete"] is True
    assert data["completion_assertions_satisfied"] == {"engine_data_keys": ["post_id"]}
    assert data["conversation_status"] == "completed"


@pytest.mark.parametrize(("ceilings", "budget"), [
    ({"conversation_turns": 2}, "conversation_turns"), ({"tool_calls": 1}, "tool_calls")])
def test_a_run_that_stops_on_a_budget_says_so_on_its_job(
        backend_host: Host, ceilings: dict[str, int], budget: str) -> None:
    job = backend_host.jobs.create()
    script = [turn(call("save_note", text=str(n))) for n in range(3)]
    result = run(backend_host, script, [save_note], job_id=job.id, budget_ceilings=ceilings,
                 final_summary=False)
    assert (result.status, result.budget) == ("budget_exceeded", budget)
    stored = backend_host.jobs.get(job.id)
    # A run stopped at a budget still completes its job; the job says which budget stopped it.
    assert stored.status == "completed"
    assert stored.flags == [f"max_{budget}_reached"] == result.flags
    assert stored.budget == budget
    assert stored.budgets == result.budgets
    assert stored.budgets[budget]["exceeded"] is True


def test_a_failed_job_keeps_the_flags_of_the_run_that_failed_it(backend_host: Host) -> None:
    job = backend_host.jobs.create()
    run(backend_host, [say("Done."), say("Really done.")], [save_note], job_id=job.id,
        max_turns=2, completion_assertions=NOTE_REQUIRED)
    stored = backend_host.jobs.get(job.id)
    assert (stored.status, stored.failure_reason) == ("failed", "completion_assertions_missing")
    assert stored.flags == ["max_conversation_turns_reached"]
    assert stored.budget == "conversation_turns"


def test_a_job_whose_run_completed_has_no_flags_and_no_budget(backend_host: Host) -> None:
    job = backend_host.jobs.create()
    result = run(backend_host, [say("ok")], [], job_id=job.id)
    stored = backend_host.jobs.get(job.id)
    assert (stored.status, stored.flags, stored.budget) == ("completed", [], None)
    assert stored.budgets == result.budgets


def test_pipeline_job_fails_when_assertions_are_missing(host: Host) -> None:
    job = host.jobs.create()
    result = run(host, [say("Done."), say("Really done.")], [save_note], job_id=job.id,
                 max_turns=2, completion_assertions=NOTE_REQUIRED)
    assert result.max_turns_reached is True
    stored = host.jobs.get(job.id)
    assert (stored.status, stored.failure_reason) == ("failed", "completion_assertions_missing")
    data = stored.engine_data
    assert data["completion_nudge_count"] == 2
    assert data["completion_nudge_last_turn"] == 2
    assert data["completion_assertions_missing"] == {"tool_names": ["save_note"]}
    assert data["completion_assertions_complete"] is False
    assert data["completed"] is False


def test_each_nudge_is_merged_into_the_job_while_the_run_goes_on(host: Host) -> None:
    job = host.jobs.create()
    seen: list[dict[str, Any]] = []

    from datamachine import tool

    @tool
    def save_note(text: str) -> str:
        """Save a note, and look at the job meanwhile.

        Args:
            text: The note.
        """
        current = host.jobs.get(job.id)
        seen.append({"status": current.status, **current.engine_data})
        return "saved"

    script = [say("Later."), turn(call("save_note", text="n")), say("Saved.")]
    result = run(host, script, [save_note], job_id=job.id, completion_assertions=NOTE_REQUIRED)
    assert result.status == "completed"
    assert seen[0]["status"] == "running"
    assert seen[0]["completion_nudge_count"] == 1
    assert seen[0]["completion_assertions_missing"] == {"tool_names": ["save_note"]}
    assert host.jobs.get(job.id).status == "completed"


def test_preflight_failure_fails_the_job(host: Host) -> None:
    job = host.jobs.create()
    result = run(host, [say("x")], [fetch], job_id=job.id, completion_assertions=NOTE_REQUIRED)
    assert result.error_code == "completion_required_tool_unavailable"
    stored = host.jobs.get(job.id)
    assert (stored.status, stored.failure_reason) == (
        "failed", "completion_required_tool_unavailable")
    assert stored.engine_data["unavailable_required_tool_names"] == ["save_note"]


def test_blocker_fails_the_job_with_assertions_missing(host: Host) -> None:
    job = host.jobs.create()
    run(host, [turn(call("report_blocker", reason="No access."))], [save_note], job_id=job.id,
        completion_assertions=NOTE_REQUIRED)
    stored = host.jobs.get(job.id)
    assert stored.failure_reason == "completion_assertions_missing"
    assert stored.engine_data["blocker"] == "No access."


def test_provider_error_fails_the_job_with_its_error_code(host: Host) -> None:
    job = host.jobs.create()
    result = run(host, [turn(call("fetch", url="a"))], [fetch], job_id=job.id)
    assert result.status == "error"
    stored = host.jobs.get(job.id)
    assert (stored.status, stored.failure_reason) == ("failed", "script_exhausted")


def test_a_running_job_is_completed_by_the_run(host: Host) -> None:
    job = host.jobs.create()
    host.jobs.start(job.id)
    run(host, [say("ok")], [], job_id=job.id)
    assert host.jobs.get(job.id).status == "completed"


def test_a_finished_job_is_refused_before_any_provider_call(host: Host) -> None:
    job = host.jobs.create()
    host.jobs.start(job.id)
    host.jobs.complete(job.id)
    with pytest.raises(InvalidJobTransition, match="already 'completed'"):
        run(host, [say("never")], [], job_id=job.id)


def test_unknown_job_is_a_warning_and_non_pipeline_runs_leave_jobs_alone(host: Host) -> None:
    result = run(host, [say("ok")], [], job_id=404)
    assert any("Job 404 does not exist" in w for w in result.warnings)
    job = host.jobs.create()
    run(host, [say("ok")], [], mode="chat", job_id=job.id)
    assert host.jobs.get(job.id).status == "pending"
