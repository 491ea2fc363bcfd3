"""One machine to many from the command line, as docs/scale-out.md tells it: set
DATAMACHINE_DB to a PostgreSQL URL, enqueue, start a worker, follow the job. Real subprocesses
of ``python -m datamachine``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("DATAMACHINE_") and not key.endswith("_API_KEY")}
    environ.update({"DATAMACHINE_DB": db, "DATAMACHINE_LOAD_PLUGINS": ""})
    return subprocess.run([sys.executable, "-m", "datamachine", *args], capture_output=True,
                          text=True, env=environ, timeout=120, check=False)


def test_enqueue_work_and_follow_a_job_on_postgresql(pg_url: str) -> None:
    enqueued = _cli(pg_url, "jobs", "enqueue", "hello from the queue")
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    assert job_id.isdigit()
    pending = json.loads(_cli(pg_url, "jobs", "show", job_id, "--json").stdout)
    assert pending["status"] == "pending"

    again = _cli(pg_url, "jobs", "requeue", job_id)
    assert again.returncode == 2
    assert "already on the queue" in again.stderr

    worked = _cli(pg_url, "worker", "--burst", "-c", "2")
    assert worked.returncode == 0, worked.stderr
    assert "2 at a time" in worked.stderr
    assert f"run_job[{job_id}]" in worked.stderr  # each job's progress is shown
    assert "Stopped worker" in worked.stderr

    done = json.loads(_cli(pg_url, "jobs", "show", job_id, "--json").stdout)
    assert done["status"] == "completed"
    assert done["engine_data"]["transcript_session_id"] == f"job-{job_id}"
    shown = _cli(pg_url, "transcripts", "show", f"job-{job_id}", "--json")
    assert shown.returncode == 0, shown.stderr
    contents = [m["content"] for m in json.loads(shown.stdout)["messages"]]
    assert contents == ["hello from the queue", "echo: hello from the queue"]


def test_bad_jobs_are_refused_with_the_fix_and_nothing_is_stored(pg_url: str) -> None:
    for args, message in [(("--tools", "nope", "hi"), "no tool named 'nope'"),
                          (("--payload", "[1]", "hi"), "--payload must be a JSON object"),
                          (("--provider", "nope", "hi"), "no provider named 'nope'")]:
        refused = _cli(pg_url, "jobs", "enqueue", *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert message in refused.stderr
        assert "Traceback" not in refused.stderr
    assert json.loads(_cli(pg_url, "jobs", "list", "--json").stdout) == []


def test_the_worker_on_sqlite_says_what_to_set(tmp_path: Path) -> None:
    refused = _cli(str(tmp_path / "one.db"), "worker", "--burst")
    assert refused.returncode == 2
    assert "DATAMACHINE_DB=postgresql://" in refused.stderr
    assert "at a time" not in refused.stderr  # refused before it claimed to start


def test_a_database_url_of_another_kind_is_refused_without_its_password(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "datamachine", "settings", "get", "max_turns"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("DATAMACHINE_")},
             "DATAMACHINE_DB": "postgresql+psycopg://dm:S3cretPW@127.0.0.1:5/dm"})
    assert refused.returncode != 0
    assert "only postgresql://" in refused.stderr
    assert "S3cretPW" not in refused.stderr + refused.stdout
    assert not any(tmp_path.iterdir())  # no directory named after the URL
