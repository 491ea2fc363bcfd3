"""kill -9 at random points of real runs, on SQLite and on PostgreSQL (DESIGN.md 24, issue 38).

Each case runs a plan of tool calls (``write`` tools that send and publish, an ``idempotent``
one that charges, a ``read`` one) in a child process that sends itself SIGKILL at a kill point
drawn from a seeded generator: any loop event, any provider request, just before or just after
a side effect. Every side effect appends a line to a ledger file (fsynced). A second process
then goes on the way the case's owner would: ``continue_conversation`` (nobody to ask, a person
who answers, or ``confirmation="pause"`` and then ``resume`` or ``resolve``), a job's next
attempt, a resume of an approval whose run died, or a chat session's next message. Then, from
the ledger and the database:

- no ``write`` call is in the ledger twice, unless a person approved running it again;
- every ``idempotent`` call's repeats carry one key;
- every call left unsettled by the kill is settled by the path that went on: an idempotent one
  run again with its key, a write one paused, asked or reported in doubt, never run unasked;
- the session ends finished, with no call left unsettled.

Cases run four at a time (each in its own database); time is frozen per process, so a later
process finds a dead one's lock expired without waiting.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import bootstrap
from datamachine.job_queue import job_session_id

ROOT = Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("KILL_CASES", "52"))  # per backend
TIMEOUT_S = 120

LOOK = {"name": "look", "parameters": {"q": "weather"}}
PLAN = [[LOOK, {"name": "send", "parameters": {"to": "ada"}}],
        [{"name": "charge", "parameters": {"cents": 500}}],
        [{"name": "send", "parameters": {"to": "bob"}},
         {"name": "charge", "parameters": {"cents": 700}}]]
APPROVAL_PLAN = [[LOOK], [{"name": "publish", "parameters": {"title": "hello"}}],
                 [{"name": "charge", "parameters": {"cents": 900}}],
                 [{"name": "send", "parameters": {"to": "cy"}}]]
WRITE_TOOLS = {"send", "publish"}
SCENARIOS = ("continue", "pause", "job", "approval", "chat")


@dataclass
class Case:
    index: int
    backend: str
    db: str
    ledger: Path
    scenario: str
    seed: int
    session: str = ""
    kill_at: int = 0
    job_id: int | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    unsettled: list[Any] = field(default_factory=list)
    killed: bool = False


def child(spec: dict[str, Any]) -> tuple[int, list[str]]:
    """Run one child process; its return code and its stdout lines."""
    done = subprocess.run([sys.executable, "-m", "tests.exactly_once.kill_child",
                           json.dumps(spec)], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=False)
    if done.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child {spec['step']} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr[-4000:]}")
    return done.returncode, done.stdout.splitlines()


def spec_of(case: Case, step: str, hours: int, **more: Any) -> dict[str, Any]:
    pause = case.scenario in ("pause", "approval") or (case.scenario == "chat"
                                                       and case.seed % 2 == 0)
    ask = None
    if case.scenario in ("continue", "job") or (case.scenario == "chat" and case.seed % 2):
        ask = ("nobody", "yes", "no")[case.seed % 3]
    return {"db": case.db, "ledger": str(case.ledger), "session": case.session,
            "plan": APPROVAL_PLAN if case.scenario == "approval" else PLAN,
            "step": step, "hours": hours, "pause": pause, "ask": ask, "seed": case.seed,
            "job_id": case.job_id, "chat": case.scenario == "chat", **more}


def clean_points(backend_db: str, scenario: str, tmp: Path) -> int:
    """How many kill points the killed step of ``scenario`` passes when nothing kills it."""
    case = Case(-1, "", backend_db, tmp / f"clean-{scenario}.jsonl", scenario, 0,
                session=f"clean-{scenario}-{uuid.uuid4().hex[:6]}")
    if scenario == "approval":
        child(spec_of(case, "start", 0))
        _, out = child(spec_of(case, "approve", 1))
    else:
        first = {"job": "job_start", "chat": "chat_start"}.get(scenario, "start")
        _, out = child(spec_of(case, first, 0))
    points = int(json.loads(out[-1])["points"])
    assert points > 10
    return points


def run_case(case: Case, points: dict[str, int]) -> Case:
    rng = random.Random(case.seed)
    case.kill_at = rng.randint(1, points[case.scenario])
    case.session = f"case-{case.index}"
    hours = 0
    if case.scenario == "approval":
        _, out = child(spec_of(case, "start", hours))
        case.logs += json.loads(out[-1])["log"]
        hours += 1
        code, out = child(spec_of(case, "approve", hours, kill_at=case.kill_at))
    elif case.scenario == "job":
        code, out = child(spec_of(case, "job_start", hours, kill_at=case.kill_at))
        case.job_id = int(json.loads(out[0])["job_id"])
        case.session = job_session_id(case.job_id)
    else:
        first = "chat_start" if case.scenario == "chat" else "start"
        code, out = child(spec_of(case, first, hours, kill_at=case.kill_at))
    case.killed = code == -signal.SIGKILL
    if not case.killed:
        case.logs += json.loads(out[-1])["log"]
    with bootstrap.boot(case.db, load_entrypoints=False) as host:
        if host.transcripts.exists(case.session):
            case.unsettled = host.transcripts.unsettled_intents(case.session)
    code, out = child(spec_of(case, "settle", hours + 1))
    assert code == 0
    case.logs += json.loads(out[-1])["log"]
    return case


def check(case: Case) -> None:
    where = f"case {case.index} ({case.backend}, {case.scenario}, kill at {case.kill_at})"
    lines = [json.loads(line) for line in case.ledger.read_text().splitlines()] \
        if case.ledger.exists() else []
    asked = [entry for entry in case.logs if "asked" in entry]
    approvals = {entry["asked"] for entry in asked if entry["answer"] is True}
    approvals |= {entry["call"] for entry in case.logs
                  if entry.get("kind") == "tool_in_doubt" and entry.get("approve")}
    in_doubt_calls = {intent.call_id: intent for intent in case.unsettled}
    reruns_allowed: Counter[str] = Counter()
    for call_id in approvals:
        intent = in_doubt_calls.get(call_id)
        assert intent is not None, f"{where}: an in-doubt answer for a call not in doubt"
        reruns_allowed[f"{intent.tool_name}:{next(iter(intent.arguments.values()))}"] += 1
    # 1. No write call twice without a person's approval.
    writes = Counter(f"{line['tool']}:{line['value']}" for line in lines
                     if line["tool"] in WRITE_TOOLS)
    for name, count in writes.items():
        assert count <= 1 + reruns_allowed[name], f"{where}: {name} ran {count} times: {lines}"
    # 2. An idempotent call's repeats carry one key.
    keys: defaultdict[str, set[str]] = defaultdict(set)
    for line in lines:
        if line["tool"] == "charge":
            keys[line["value"]].add(line["key"])
    assert all(len(found) == 1 for found in keys.values()), f"{where}: {dict(keys)}"
    # 3. Every unsettled call was settled as the contract says.
    with bootstrap.boot(case.db, load_entrypoints=False) as host:
        record = host.transcripts.get_transcript(case.session)
        left = host.transcripts.unsettled_intents(case.session)
    assert left == [], f"{where}: still unsettled: {left}"
    assert record.status == "completed", f"{where}: ended {record.status}: {case.logs}"
    results = {m["metadata"].get("tool_call_id"): m["payload"] for m in record.messages
               if m["type"] == "tool_result"}
    paused_on = {entry["pending"]["tool_call"]["id"] for entry in case.logs
                 if (entry.get("pending") or {}).get("kind") == "tool_in_doubt"}
    asked_on = {entry["asked"] for entry in asked}
    for intent in case.unsettled:
        result = results.get(intent.call_id)
        assert result is not None, f"{where}: no stored result for {intent}"
        if not intent.in_doubt:  # idempotent: run again, with the same key
            assert result.get("success") is True, f"{where}: {result}"
            assert any(line["key"] == intent.idempotency_key for line in lines), where
            continue
        told = result.get("error_type") == "tool_in_doubt"
        assert intent.call_id in paused_on or intent.call_id in asked_on or told, (
            f"{where}: {intent} was neither paused, asked nor reported in doubt: {result}")


@pytest.fixture
def databases(backend: str, tmp_path: Path, request: pytest.FixtureRequest
              ) -> Iterator[list[str]]:
    """One database per case (and one for the clean runs): files, or PostgreSQL databases
    copied from the migrated template."""
    count = CASES + 1
    if backend == "sqlite":
        yield [str(tmp_path / f"case-{n}.db") for n in range(count)]
        return
    import psycopg

    server = request.getfixturevalue("postgres_server")
    names = [f"dm_kill_{uuid.uuid4().hex[:10]}" for _ in range(count)]
    with psycopg.connect(server.url, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE DATABASE {name} TEMPLATE dm_template STRATEGY FILE_COPY")
    try:
        yield [server.url_for(name) for name in names]
    finally:
        with psycopg.connect(server.url, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_kill_9_at_random_points_never_repeats_a_write_unasked(
        backend: str, databases: list[str], tmp_path: Path) -> None:
    points = {scenario: clean_points(databases[-1], scenario, tmp_path)
              for scenario in SCENARIOS}
    cases = [Case(n, backend, databases[n], tmp_path / f"ledger-{n}.jsonl",
                  SCENARIOS[n % len(SCENARIOS)], seed=1000 * (backend == "postgresql") + n)
             for n in range(CASES)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda case: run_case(case, points), cases))
    for case in done:
        check(case)
    killed = [case for case in done if case.killed]
    assert len(killed) >= 50, f"only {len(killed)} of {CASES} cases were killed"
    # The kills left work in doubt in many cases, of every kind (not only clean points).
    assert sum(1 for case in done if case.unsettled) >= 10
    # ... on every path that goes on (the seeds are fixed, so this does not flap).
    assert {case.scenario for case in done if case.unsettled} == set(SCENARIOS)
    assert any(intent.in_doubt for case in done for intent in case.unsettled)
    assert any(not intent.in_doubt for case in done for intent in case.unsettled)
