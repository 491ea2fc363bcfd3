"""A queued job's attempts are the budget ``job_attempts`` (DESIGN.md 22): resolved through the
registry (payload ``budget_ceilings``, else the setting ``job_max_attempts``, else 5; clamped
to [1, 100] and the clamp reported), and a job that runs out of them fails saying so
(``Job.flags``, ``Job.budget``, ``Job.budgets``; ``datamachine jobs show``).

The model is the ``openai`` provider against a loopback server that closes every connection
before answering (an outage, which the worker retries) or answers 503 (an HTTP error, which it
does not), with ``provider_max_retries`` 0 unless said otherwise, so the server's request count
is the count of attempts. Attempts are driven one by one with ``run_attempt``, as a worker
runs them, without the waits between them: nothing sleeps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import bootstrap
from datamachine import BudgetSpec, hookimpl
from datamachine.cli import cli
from datamachine.errors import DuplicateBudgetError
from datamachine.host import Host
from datamachine.job_worker import OUTAGES_KEY, WARNINGS_KEY, JobNotDone, run_attempt
from tests.plugins import claims_job_attempts
from tests.providers.fake_openai import completion
from tests.providers.replay import CLOSE, ReplayServer

PROMPT = [{"role": "user", "content": "summarize the feed"}]
OUT_OF_ATTEMPTS = "max_job_attempts_reached"


def _answer(status: str, body: Any, *headers: str) -> bytes:
    """The bytes of one HTTP answer with a JSON body, closing the connection."""
    data = json.dumps(body).encode()
    head = [f"HTTP/1.1 {status}", "Content-Type: application/json", *headers,
            "Connection: close", f"Content-Length: {len(data)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


# Overloaded, and no wait asked before the provider layer's retry.
HTTP_503 = _answer("503 Service Unavailable",
                   {"error": {"message": "overloaded", "type": "server_error"}},
                   "retry-after-ms: 0")


@pytest.fixture
def db_host(db_target: str) -> Iterator[Host]:
    """A host on a database the command line can open too (a file, or PostgreSQL)."""
    host = bootstrap.boot(db_path=db_target, load_entrypoints=False)
    try:
        yield host
    finally:
        host.close()


def _queued(host: Host, server: ReplayServer, *, payload: dict[str, Any] | None = None,
            used: int = 0) -> int:
    """A job as ``jobs.enqueue`` stores it, on the ``openai`` provider at ``server``;
    ``used``: the attempts earlier outages took already."""
    host.settings.set("openai_base_url", server.url)
    host.settings.set("allow_model_requests", True)
    if host.settings.get("provider_max_retries") is None:
        host.settings.set("provider_max_retries", 0)
    request = {"messages": PROMPT, "tools": [], "provider": "openai", "model": "m",
               "payload": payload or {}, "max_turns": None}
    data: dict[str, Any] = {"request": request}
    if used:
        data[OUTAGES_KEY] = used
    return host.jobs.create("step-1", data).id


def _attempt_until_settled(host: Host, job_id: int) -> tuple[str, int]:
    """Run the job's attempts as a worker would (the waits left out) until one settles it;
    its status and how many attempts ran."""
    for attempts in range(1, 1000):
        try:
            return run_attempt(host, job_id), attempts
        except JobNotDone:
            continue
    raise AssertionError("the job never settled")


def _snapshot(current: int, ceiling: int, hard: int = 100) -> dict[str, Any]:
    return {"current": current, "ceiling": ceiling, "remaining": max(0, ceiling - current),
            "exceeded": current >= ceiling, "hard_ceiling": hard,
            "rail": ("hard_ceiling" if current >= hard else "ceiling") if current >= ceiling
            else None}


def _check_ran_out(host: Host, job_id: int, current: int, ceiling: int, *,
                   hard: int = 100) -> None:
    job = host.jobs.get(job_id)
    assert (job.status, job.failure_reason) == ("failed", "provider_connection_error")
    # Each attempt's run ran out of provider retries (0 here), then the job out of attempts:
    # the run's flag first, the job's last.
    assert job.flags == ["max_provider_retries_reached", OUT_OF_ATTEMPTS]
    assert job.budget == "job_attempts"
    assert job.budgets["job_attempts"] == _snapshot(current, ceiling, hard)
    assert job.engine_data[OUTAGES_KEY] == current


def test_a_job_gets_five_attempts_by_default_then_fails_naming_the_budget(
        backend_host: Host) -> None:
    with ReplayServer(*[CLOSE] * 5) as server:
        job_id = _queued(backend_host, server)
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 5)
        assert len(server.requests) == 5  # one request per attempt; a sixth would get a 599
    _check_ran_out(backend_host, job_id, 5, 5)
    # The budgets of the last attempt's run are kept beside it.
    assert {"conversation_turns", "tool_calls"} <= set(backend_host.jobs.get(job_id).budgets)


def test_the_setting_job_max_attempts_sets_the_ceiling(backend_host: Host) -> None:
    backend_host.settings.set("job_max_attempts", 3)
    with ReplayServer(*[CLOSE] * 3) as server:
        job_id = _queued(backend_host, server)
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 3)
        assert len(server.requests) == 3
    _check_ran_out(backend_host, job_id, 3, 3)


def test_a_jobs_budget_ceilings_override_the_setting(backend_host: Host) -> None:
    backend_host.settings.set("job_max_attempts", 4)
    with ReplayServer(*[CLOSE] * 2) as server:
        job_id = _queued(backend_host, server, payload={"budget_ceilings": {"job_attempts": 2}})
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 2)
        assert len(server.requests) == 2
    _check_ran_out(backend_host, job_id, 2, 2)


def test_one_attempt_means_no_second_one(backend_host: Host) -> None:
    with ReplayServer(CLOSE) as server:
        job_id = _queued(backend_host, server, payload={"budget_ceilings": {"job_attempts": 1}})
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 1)
        assert len(server.requests) == 1
    _check_ran_out(backend_host, job_id, 1, 1)


def test_a_setting_above_the_clamp_is_clamped_to_100_and_the_clamp_reported(
        backend_host: Host, caplog: pytest.LogCaptureFixture) -> None:
    backend_host.settings.set("job_max_attempts", 500)
    with ReplayServer(CLOSE, CLOSE) as server:
        # 98 attempts met outages already: two are left of the clamped 100, not 402.
        job_id = _queued(backend_host, server, used=98)
        with caplog.at_level(logging.WARNING, logger="datamachine.worker"):
            assert _attempt_until_settled(backend_host, job_id) == ("failed", 2)
        assert len(server.requests) == 2
    _check_ran_out(backend_host, job_id, 100, 100)
    notice = ("Budget 'job_attempts': requested ceiling 500 (from setting) is outside its "
              "range [1, 100]; using 100.")
    assert backend_host.jobs.get(job_id).engine_data[WARNINGS_KEY] == [notice]
    assert notice in caplog.text


def test_an_override_above_the_clamp_is_clamped_too(backend_host: Host) -> None:
    with ReplayServer(CLOSE) as server:
        job_id = _queued(backend_host, server, used=99,
                         payload={"budget_ceilings": {"job_attempts": 250}})
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 1)
        assert len(server.requests) == 1
    _check_ran_out(backend_host, job_id, 100, 100)
    assert "requested ceiling 250 (from override)" in backend_host.jobs.get(
        job_id).engine_data[WARNINGS_KEY][0]


def test_attempts_spent_already_fail_the_job_before_any_request(backend_host: Host) -> None:
    """Its ceiling was lowered after three outages: no fourth request is sent."""
    with ReplayServer() as server:
        job_id = _queued(backend_host, server, used=3)
        backend_host.jobs.merge_engine_data(job_id, {"error_code": "provider_timeout"})
        backend_host.settings.set("job_max_attempts", 2)
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 1)
        assert server.requests == []
    job = backend_host.jobs.get(job_id)
    assert (job.failure_reason, job.flags, job.budget) == (
        "provider_timeout", [OUT_OF_ATTEMPTS], "job_attempts")
    assert job.budgets == {"job_attempts": _snapshot(3, 2)}


@pytest.mark.parametrize("ceiling", [0, "3", 10_001, True])
def test_an_override_that_is_no_ceiling_fails_the_job_before_any_request(
        backend_host: Host, ceiling: object) -> None:
    with ReplayServer() as server:
        job_id = _queued(backend_host, server,
                         payload={"budget_ceilings": {"job_attempts": ceiling}})
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 1)
        assert server.requests == []
    job = backend_host.jobs.get(job_id)
    assert job.failure_reason is not None
    assert job.failure_reason.startswith(
        "job_request_invalid: payload['budget_ceilings']['job_attempts'] must be")
    assert job.flags == []


def test_an_attempt_that_succeeds_completes_the_job_without_the_flag(backend_host: Host) -> None:
    with ReplayServer(CLOSE, _answer("200 OK", completion("Summarized."))) as server:
        job_id = _queued(backend_host, server, payload={"budget_ceilings": {"job_attempts": 2}})
        status, attempts = _attempt_until_settled(backend_host, job_id)
        assert len(server.requests) == 2
    job = backend_host.jobs.get(job_id)
    assert (status, attempts, job.status) == ("completed", 2, "completed")
    assert OUT_OF_ATTEMPTS not in job.flags
    assert job.budget != "job_attempts"
    assert job.engine_data[OUTAGES_KEY] == 1


def test_a_503_the_provider_layer_gave_up_on_fails_the_job_at_its_first_attempt(
        backend_host: Host) -> None:
    """HTTP errors are not outages (docs/scale-out.md): the provider layer retried the 503
    (provider_max_retries), and the job does not multiply those retries by its attempts."""
    backend_host.settings.set("provider_max_retries", 2)
    with ReplayServer(*[HTTP_503] * 3) as server:
        job_id = _queued(backend_host, server)
        assert _attempt_until_settled(backend_host, job_id) == ("failed", 1)
        assert len(server.requests) == 3  # the first request and its two retries
    job = backend_host.jobs.get(job_id)
    assert job.failure_reason == "provider_http_error"
    assert OUT_OF_ATTEMPTS not in job.flags
    assert "job_attempts" not in job.budgets


def test_jobs_show_says_which_budget_ran_out(db_host: Host, db_target: str) -> None:
    db_host.settings.set("job_max_attempts", 3)
    with ReplayServer(*[CLOSE] * 3) as server:
        job_id = _queued(db_host, server)
        _attempt_until_settled(db_host, job_id)
    runner = CliRunner()
    shown = runner.invoke(cli, ["--db", db_target, "jobs", "show", str(job_id)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[:4] == [f"job {job_id}: failed (provider_connection_error)",
                         "flow step: step-1",
                         f"flags: max_provider_retries_reached, {OUT_OF_ATTEMPTS}",
                         "budget: job_attempts ran out (3/3)"]
    assert "budget job_attempts: 3/3" in lines
    as_json = runner.invoke(cli, ["--db", db_target, "jobs", "show", str(job_id), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert (data["status"], data["budget"]) == ("failed", "job_attempts")
    assert data["flags"] == ["max_provider_retries_reached", OUT_OF_ATTEMPTS]
    assert data["budgets"]["job_attempts"] == _snapshot(3, 3)


class WidensJobAttempts:
    """Registers ``job_attempts`` again once the host is up, with the clamp [1, 200]."""

    @hookimpl
    def host_started(self, host: Host) -> None:
        host.budgets.register(BudgetSpec(name="job_attempts", default=5, min=1, max=200,
                                         setting="job_max_attempts", scope="job"))


def test_a_plugin_claiming_job_attempts_at_boot_is_a_boot_error_naming_both() -> None:
    with pytest.raises(DuplicateBudgetError, match=r"'job_attempts' is registered by both "
                                                   r"'bootstrap' and "
                                                   r"'tests\.plugins\.claims_job_attempts'"):
        bootstrap.boot(db_path=":memory:", plugins=[claims_job_attempts],
                       load_entrypoints=False)


def test_the_clamp_is_the_registrations_a_plugin_that_widens_it_is_obeyed(
        db_target: str) -> None:
    with bootstrap.boot(db_path=db_target, plugins=[WidensJobAttempts()],
                        load_entrypoints=False) as host:
        host.settings.set("job_max_attempts", 150)
        with ReplayServer(CLOSE, CLOSE) as server:
            job_id = _queued(host, server, used=148)
            assert _attempt_until_settled(host, job_id) == ("failed", 2)
            assert len(server.requests) == 2
        _check_ran_out(host, job_id, 150, 150, hard=200)
        assert WARNINGS_KEY not in host.jobs.get(job_id).engine_data  # nothing clamped



def test_a_later_attempt_goes_on_with_the_turns_left_of_the_jobs_ceiling(
        db_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn ceiling a later attempt goes on with is the budget ``conversation_turns`` of
    the job, resolved as its first run resolved it (here from ``budget_ceilings``), not the
    setting read on its own."""
    from tests.queue.slow_model import SlowModel

    prompt = "turns 1 steps 5"
    monkeypatch.setenv("DM_TEST_OUTAGE_DIR", str(tmp_path))
    (tmp_path / prompt).write_text("1 1")  # the job's second turn meets one outage
    with bootstrap.boot(db_path=db_target, plugins=[SlowModel()],
                        load_entrypoints=False) as host:
        request = {"messages": [{"role": "user", "content": prompt}], "tools": ["step"],
                   "provider": None, "model": None, "max_turns": None,
                   "payload": {"budget_ceilings": {"conversation_turns": 3},
                               "final_summary": False}}
        job_id = host.jobs.create(None, {"request": request}).id
        assert _attempt_until_settled(host, job_id) == ("completed", 2)
        job = host.jobs.get(job_id)
        # Two turns in the first attempt (the second one failed), one in the second: 3.
        assert host.transcripts.summary(f"job-{job_id}").cumulative_turn_count == 3
        assert (job.flags, job.budget) == (["max_conversation_turns_reached"],
                                           "conversation_turns")
