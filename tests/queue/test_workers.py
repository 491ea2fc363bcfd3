"""Pipeline jobs on the task queue (DESIGN.md 18), with real worker processes on a real
PostgreSQL server: every job runs exactly once, a worker killed with SIGKILL leaves jobs that
the others finish from their transcripts, a provider outage is retried and continued.

Workers are ``python -m tests.queue.worker_main`` processes (what ``datamachine worker`` runs,
plus the test model). The parent waits for their progress by polling the database and the
model's request log, briefly and with a deadline; nothing here sleeps to let time pass.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import bootstrap
from datamachine.errors import JobNotFound, UsageError
from datamachine.host import Host
from tests.queue.slow_model import SlowModel, expected_messages

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


@pytest.fixture
def queue_host(pg_url: str) -> Iterator[Host]:
    host = bootstrap.boot(db_path=pg_url, load_entrypoints=False, plugins=[SlowModel()])
    try:
        yield host
    finally:
        host.close()


class Workers:
    """Worker processes on one database, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, url: str, log: Path, env: dict[str, str]) -> None:
        self.url, self.log, self.env = url, log, env
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, count: int, *, concurrency: int = 4, stalled_after: float = 2.0) -> None:
        for _ in range(count):
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.queue.worker_main", self.url, str(self.log),
                 str(concurrency), str(stalled_after)],
                cwd=ROOT, env=self.env, stderr=subprocess.PIPE))

    def requests_by_pid(self) -> Counter[int]:
        if not self.log.exists():
            return Counter()
        return Counter(int(line.split("\t")[0]) for line in self.log.read_text().splitlines())

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DM_TEST_OUTAGE_DIR": str(tmp_path / "down")}
    (tmp_path / "down").mkdir()
    group = Workers(pg_url, tmp_path / "requests.log", env)
    try:
        yield group
    finally:
        group.stop()


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _all_finished(host: Host, count: int) -> Callable[[], bool]:
    def check() -> bool:
        rows = host.handle.conn.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('completed', 'failed')").fetchall()
        return int(rows[0][0]) >= count
    return check


def _shape(message: dict[str, Any]) -> tuple[str, str, str]:
    text = message["content"] if message["type"] == "text" else ""
    return (message["type"], message["role"], text)


def _check_whole(host: Host, job_id: int, prompt: str, steps: int, *,
                 failed_turns: int = 0) -> None:
    job = host.jobs.get(job_id)
    assert job.status == "completed", (job_id, job.failure_reason, job.engine_data)
    stored = host.transcripts.get(f"job-{job_id}")
    assert [_shape(m) for m in stored] == expected_messages(prompt, steps)
    record = host.transcripts.summary(f"job-{job_id}")
    # Every provider turn counts, a failed one too (its run stopped there).
    assert record.cumulative_turn_count == steps + 1 + failed_turns
    assert record.message_count == len(stored)


def test_four_workers_run_four_hundred_jobs_each_exactly_once(
        queue_host: Host, workers: Workers) -> None:
    steps = 2
    jobs = {queue_host.jobs.enqueue([{"role": "user", "content": f"job {n} steps {steps}"}],
                                    ["step"], max_turns=10).id: f"job {n} steps {steps}"
            for n in range(400)}
    workers.start(4)
    _wait_until(_all_finished(queue_host, len(jobs)), "400 jobs")
    for job_id, prompt in jobs.items():
        _check_whole(queue_host, job_id, prompt, steps)
    # The model saw each job's every turn exactly once: nothing ran twice, nothing was lost.
    asked = Counter(tuple(line.split("\t")[1:]) for line in
                    workers.log.read_text().splitlines())
    assert len(asked) == 400 * (steps + 1)
    assert set(asked.values()) == {1}
    assert len(workers.requests_by_pid()) == 4  # all four took part


def test_jobs_of_workers_killed_mid_run_finish_on_the_others_with_whole_transcripts(
        queue_host: Host, workers: Workers) -> None:
    queue_host.settings.set("job_lock_ttl", 3)
    queue_host.settings.set("job_retry_wait", 0.2)
    steps = 8
    jobs = {queue_host.jobs.enqueue([{"role": "user", "content": f"long {n} steps {steps}"}],
                                    ["step"], max_turns=20).id: f"long {n} steps {steps}"
            for n in range(32)}
    workers.start(4)
    victims = workers.processes[:2]
    _wait_until(lambda: all(workers.requests_by_pid()[p.pid] >= 6 for p in victims),
                "the first two workers to be mid-run")
    for process in victims:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    _wait_until(_all_finished(queue_host, len(jobs)), "every job")
    for job_id, prompt in jobs.items():
        _check_whole(queue_host, job_id, prompt, steps)
    retried = queue_host.handle.conn.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE attempts > 0").fetchall()[0][0]
    assert retried >= 2  # the killed workers' jobs ran again (one per killed job at least)
    # After the kills, only the survivors worked.
    survivors = {p.pid for p in workers.processes[2:]}
    assert survivors <= set(workers.requests_by_pid())


def test_a_provider_outage_is_retried_and_the_job_goes_on_from_its_transcript(
        queue_host: Host, workers: Workers, tmp_path: Path) -> None:
    queue_host.settings.set("job_retry_wait", 0.1)
    prompt = "flaky 1 steps 3"
    # The first two requests of the job's third turn fail: the provider is down twice.
    (tmp_path / "down" / prompt).write_text("2 2")
    job = queue_host.jobs.enqueue([{"role": "user", "content": prompt}], ["step"], max_turns=10)
    workers.start(1)
    _wait_until(_all_finished(queue_host, 1), "the job")
    _check_whole(queue_host, job.id, prompt, 3, failed_turns=2)
    turns = Counter(line.split("\t")[2] for line in workers.log.read_text().splitlines())
    # Turns 0 and 1 were asked once (the later attempts went on from the transcript), turn 2
    # three times (two outages, then the answer), turn 3 once.
    assert turns == {"0": 1, "1": 1, "2": 3, "3": 1}


def test_an_outage_on_every_attempt_fails_the_job_on_the_last(
        queue_host: Host, workers: Workers, tmp_path: Path) -> None:
    queue_host.settings.set("job_retry_wait", 0.05)
    queue_host.settings.set("job_max_attempts", 3)
    prompt = "down 1 steps 1"
    (tmp_path / "down" / prompt).write_text("0 1000")
    job = queue_host.jobs.enqueue([{"role": "user", "content": prompt}], ["step"])
    workers.start(1)
    _wait_until(_all_finished(queue_host, 1), "the job")
    failed = queue_host.jobs.get(job.id)
    assert failed.status == "failed"
    assert failed.failure_reason == "provider_connection_error"
    # It says which budget ran out, as a run does.
    assert (failed.flags, failed.budget) == (["max_job_attempts_reached"], "job_attempts")
    assert failed.budgets["job_attempts"]["current"] == 3
    asked = [line for line in workers.log.read_text().splitlines() if prompt in line]
    assert len(asked) == 3  # one request per attempt (the model's own retries are not ours)


def test_enqueue_checks_everything_before_writing(queue_host: Host) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": ["nope"]}, "no tool named"),
        ({"messages": [{"role": "user", "content": "x"}], "provider": "nope"},
         "no provider named"),
        ({"messages": [{"role": "user", "content": "x"}], "payload": {"when": object()}},
         "must be JSON data"),
        ({"messages": [{"role": "user", "content": "x"}], "payload": {"final_summary": "no"}},
         "final_summary"),
        ({"messages": [{"content": "x"}]}, "missing 'role'"),
        ({"messages": [{"role": "user", "content": "x"}], "max_turns": 0}, "max_turns"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": ["step"],
          "payload": {"completion_assertions": {"step": 1}}}, "unknown key 'step'"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": ["step"],
          "payload": {"completion_assertions": {"minimum_successful_tool_counts": {"step": 0}}}},
         "minimum_successful_tool_counts"),
        ({"messages": [{"role": "user", "content": "x"}],
          "payload": {"completion_assertions": {"required_tool_names": ["step"]}}},
         "which the job does not offer"),
        ({"messages": [{"role": "user", "content": "x"}],
          "payload": {"budget_ceilings": {"job_attempts": 0}}},
         r"payload\['budget_ceilings'\]\['job_attempts'\] must be a positive integer"),
        ({"messages": [{"role": "user", "content": "x"}],
          "payload": {"budget_ceilings": {"tool_calls": 10_001}}}, "tool_calls"),
    ]
    for arguments, message in bad:
        with pytest.raises(UsageError, match=message):
            queue_host.jobs.enqueue(**arguments)
    assert queue_host.jobs.list() == []


def test_the_queue_needs_postgresql(host: Host) -> None:
    with pytest.raises(UsageError, match="DATAMACHINE_DB=postgresql://"):
        host.jobs.enqueue([{"role": "user", "content": "x"}])


def test_a_second_attempt_while_the_first_still_runs_waits_instead_of_running_twice(
        queue_host: Host, tmp_path: Path) -> None:
    """What keeps a job to one worker at a time even when the queue hands it out twice (a
    worker taken for dead that was only slow): the job's transcript lock."""
    import threading

    from datamachine.job_worker import JobNotDone, run_job

    log = tmp_path / "asked.log"
    url = getattr(queue_host.handle, "url", "")
    host = bootstrap.boot(db_path=url, load_entrypoints=False, plugins=[SlowModel(str(log))])
    try:
        prompt = "twice 1 steps 6"
        job = host.jobs.enqueue([{"role": "user", "content": prompt}], ["step"], max_turns=10)
        first: list[str] = []
        runner = threading.Thread(target=lambda: first.append(run_job(host, job.id)))
        runner.start()
        _wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 2,
                    "the first attempt to be mid-run")
        with pytest.raises(JobNotDone, match="another run holds its transcript"):
            run_job(host, job.id)
        runner.join(timeout=DEADLINE_S)
        assert first == ["completed"]
        assert run_job(host, job.id) == "completed"  # a late attempt finds it done
        _check_whole(host, job.id, prompt, 6)
        turns = Counter(line.split("\t")[2] for line in log.read_text().splitlines())
        assert set(turns.values()) == {1}  # every turn asked once
    finally:
        host.close()


def _logging_host(queue_host: Host, log: Path) -> Host:
    """A second host on the queue's database whose model writes every request to ``log``."""
    url = getattr(queue_host.handle, "url", "")
    return bootstrap.boot(db_path=url, load_entrypoints=False, plugins=[SlowModel(str(log))])


def _started_job(host: Host, prompt: str) -> Any:
    """A queued job of ``prompt`` (tool ``step``), marked started as a worker would."""
    job = host.jobs.enqueue([{"role": "user", "content": prompt}], ["step"])
    host.jobs.start(job.id)
    return job


def test_a_run_that_ended_before_its_job_was_settled_is_settled_not_asked_again(
        queue_host: Host, tmp_path: Path) -> None:
    """The worker died between storing the run's end and settling its job."""
    from datamachine.job_worker import run_job

    log = tmp_path / "asked.log"
    with _logging_host(queue_host, log) as host:
        prompt = "ended 1 steps 1"
        job = _started_job(host, prompt)
        ended = host.run_conversation([{"role": "user", "content": prompt}],
                                      [host.tools.get("step")], mode="pipeline",
                                      payload={"transcript_session_id": f"job-{job.id}"})
        assert ended.status == "completed"
        asked = log.read_text()
        assert run_job(host, job.id) == "completed"
        assert log.read_text() == asked  # nothing asked again
        assert host.jobs.get(job.id).status == "completed"


def test_a_run_killed_after_storing_its_answer_is_settled_not_asked_again(
        queue_host: Host, tmp_path: Path) -> None:
    """The worker died after the answer's turn was stored and before the run's final write
    (the kill test caught a final answer asked twice this way)."""
    from datamachine.job_worker import run_job

    log = tmp_path / "asked.log"
    with _logging_host(queue_host, log) as host:
        prompt = "killed 1 steps 1"
        job = _started_job(host, prompt)
        sid = f"job-{job.id}"
        # What the dead worker's run had stored: its prompt, then its turn's answer; the row
        # is still running, with no lock behind it.
        host.transcripts.begin(sid, [{"role": "user", "content": prompt}])
        host.transcripts.append_turn(sid, 1, [{"role": "assistant", "content": "all done"}])
        assert host.transcripts.summary(sid).status == "interrupted"
        assert run_job(host, job.id) == "completed"
        assert not log.exists() or log.read_text() == ""  # the model was not asked
        assert host.transcripts.summary(sid).status == "completed"
        assert [m["content"] for m in host.transcripts.get(sid)] == [prompt, "all done"]
        # A run killed after a tool call's turn still goes on (the model is asked).
        other = _started_job(host, "more 1 steps 1")
        host.transcripts.begin(f"job-{other.id}", [{"role": "user", "content": "more 1 steps 1"}])
        host.transcripts.append_turn(f"job-{other.id}", 1, [
            {"type": "tool_call", "role": "assistant", "content": "",
             "payload": {"tool_name": "step", "parameters": {"n": 1}},
             "metadata": {"tool_call_id": "c1"}},
            {"type": "tool_result", "role": "tool", "content": "ok",
             "payload": {"success": True, "result": "ok", "tool_name": "step"},
             "metadata": {"tool_call_id": "c1"}}])
        assert run_job(host, other.id) == "completed"
        assert log.exists()
        assert log.read_text() != ""


def test_an_http_error_the_provider_layer_gave_up_on_fails_the_job_at_once(
        queue_host: Host) -> None:
    from datamachine import ProviderRequest, hookimpl
    from datamachine.errors import ProviderError
    from datamachine.job_worker import run_job

    class Refusing:
        @hookimpl
        def text_result(self, request: ProviderRequest) -> Any:
            return ProviderError("HTTP 401: invalid API key", code="provider_http_error",
                                 status=401)

    url = getattr(queue_host.handle, "url", "")
    with bootstrap.boot(db_path=url, load_entrypoints=False, plugins=[Refusing()]) as host:
        job = host.jobs.enqueue([{"role": "user", "content": "x"}])
        assert run_job(host, job.id) == "failed"
        assert host.jobs.get(job.id).failure_reason == "provider_http_error"


def test_a_job_naming_a_provider_the_worker_lacks_fails_naming_it(queue_host: Host) -> None:
    from datamachine import hookimpl
    from datamachine.job_worker import run_job

    class Elsewhere:
        name = "elsewhere"

        def complete(self, request: Any) -> Any:
            raise AssertionError("never asked: the worker has no such provider")

    class ElsewherePlugin:
        @hookimpl
        def register_providers(self) -> list[Any]:
            return [Elsewhere()]

    url = getattr(queue_host.handle, "url", "")
    with bootstrap.boot(db_path=url, load_entrypoints=False,
                        plugins=[ElsewherePlugin()]) as enqueuer:
        job = enqueuer.jobs.enqueue([{"role": "user", "content": "x"}], provider="elsewhere")
    assert run_job(queue_host, job.id) == "failed"
    assert queue_host.jobs.get(job.id).failure_reason == (
        "job_provider_missing: elsewhere not registered on this worker")


def test_a_burst_worker_takes_over_the_jobs_a_dead_worker_left(
        queue_host: Host, workers: Workers) -> None:
    from datamachine.job_worker import run_worker

    queue_host.settings.set("job_lock_ttl", 1)
    steps = 30
    job = queue_host.jobs.enqueue([{"role": "user", "content": f"left 1 steps {steps}"}],
                                  ["step"], max_turns=40)
    workers.start(1, stalled_after=1.0)
    victim = workers.processes[0]
    _wait_until(lambda: workers.requests_by_pid()[victim.pid] >= 3, "the worker to be mid-run")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    conn = queue_host.handle.conn

    def abandoned() -> bool:  # its heartbeat is old and its lock ran out
        beats = conn.execute("SELECT count(*) FROM procrastinate_workers WHERE "
                             "last_heartbeat > now() - interval '1 second'").fetchone()
        return int(beats[0]) == 0 and queue_host.transcripts.locks.info(f"job-{job.id}") is None

    _wait_until(abandoned, "the dead worker's heartbeat and lock to run out")
    assert queue_host.jobs.get(job.id).status == "running"
    run_worker(queue_host, concurrency=1, stalled_after=1.0, wait=False, poll_interval=0.1)
    _check_whole(queue_host, job.id, f"left 1 steps {steps}", steps)


def test_a_pending_job_whose_queue_entry_was_lost_is_requeued_once(queue_host: Host) -> None:
    from datamachine.job_worker import run_worker

    # What a process killed between enqueue's two commits leaves: the job, not its entry.
    request = {"messages": [{"role": "user", "content": "lost 1 steps 1"}], "tools": ["step"],
               "provider": None, "model": None, "payload": {}, "max_turns": None}
    job = queue_host.jobs.create(None, {"request": request})
    with pytest.raises(JobNotFound):
        queue_host.jobs.requeue(10**6)
    assert queue_host.jobs.requeue(job.id).id == job.id
    with pytest.raises(UsageError, match="already on the queue"):
        queue_host.jobs.requeue(job.id)
    run_worker(queue_host, concurrency=1, wait=False, poll_interval=0.1)
    _check_whole(queue_host, job.id, "lost 1 steps 1", 1)
    with pytest.raises(UsageError, match="only a pending job"):
        queue_host.jobs.requeue(job.id)
