"""One process of a kill -9 case (test_kill_points.py): ``python -m tests.exactly_once.kill_child
SPEC`` where SPEC is JSON.

``step`` is ``start`` (a pipeline run), ``chat_start`` (a chat session's first message),
``job_start`` (a job's first attempt, ``run_job``), ``approve`` (resume a run paused for a
tool's approval, approving it) or ``settle`` (every path that goes on, until the session is
finished: ``continue_conversation``, ``resume``, ``resolve``, a chat session's next message,
a job's next attempt). With ``kill_at`` = N the process sends itself SIGKILL at its Nth kill
point: every loop event, every provider request, and just before and after each tool's side
effect. It prints one JSON line when it was not killed: what it did and how many kill points
it passed. Time is frozen at ``hours`` after a fixed start, so a later process finds the dead
one's transcript lock long expired without waiting for it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import sys
from typing import Any

from freezegun import freeze_time

import bootstrap
from datamachine import hookimpl
from datamachine.host import Host
from tests.exactly_once.crash_tools import ALL_TOOLS, POINTS, CrashTools, Planner

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
USER = [{"role": "user", "content": "do the plan"}]


class KillSwitch:
    """Counts kill points; at the chosen one the process dies as kill -9 kills it."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.passed = 0

    def point(self) -> None:
        self.passed += 1
        if self.kill_at is not None and self.passed >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    @hookimpl
    def on_loop_event(self, event: str, payload: dict[str, Any]) -> None:
        self.point()


class CountingPlanner(Planner):
    def __init__(self, plan: list[list[dict[str, Any]]], switch: KillSwitch) -> None:
        super().__init__(plan)
        self.switch = switch

    @hookimpl
    def text_result(self, request: Any) -> dict[str, Any]:
        self.switch.point()
        return super().text_result(request)


class Person:
    """Answers ``confirm_continuation`` for a call in doubt (``answer``), and says so."""

    def __init__(self, answer: bool | None, log: list[dict[str, Any]]) -> None:
        self.answer = answer
        self.log = log

    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        if context.get("kind") != "tool_in_doubt":
            return None
        self.log.append({"asked": context["tool_call"]["id"], "answer": self.answer})
        return self.answer


def main(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["LEDGER_FILE"] = spec["ledger"]
    switch = KillSwitch(spec.get("kill_at"))
    POINTS.append(switch.point)
    log: list[dict[str, Any]] = []
    plugins: list[object] = [CountingPlanner(spec["plan"], switch), switch, CrashTools()]
    if spec.get("ask") is not None:
        plugins.append(Person(spec["ask"] == "yes" if spec["ask"] != "nobody" else None, log))
    with freeze_time(T0 + dt.timedelta(hours=spec["hours"])), bootstrap.boot(
            spec["db"], plugins=plugins, load_entrypoints=False) as host:
        host.settings.set("confirmation", "pause" if spec.get("pause") else "ask")
        step = spec["step"]
        if step == "start":
            result = host.run_conversation(USER, ALL_TOOLS, "scripted", "m",
                                           payload={"transcript_session_id": spec["session"]})
            log.append({"did": "start", "status": result.status, "pending": result.pending})
        elif step == "chat_start":
            host.chat_sessions.create(session_id=spec["session"])
            result = host.chat(spec["session"], USER[0]["content"], ALL_TOOLS)
            log.append({"did": "chat", "status": result.status, "pending": result.pending})
        elif step == "job_start":
            from datamachine.job_worker import run_job

            job = host.jobs.create(engine_data={"request": {
                "messages": USER, "tools": [t.name for t in ALL_TOOLS], "max_turns": 20}})
            log.append({"did": "job_created", "job_id": job.id})
            print(json.dumps({"job_id": job.id}), flush=True)
            log.append({"did": "job", "status": run_job(host, job.id)})
        elif step == "approve":
            result = host.resume(spec["session"], True, tools=ALL_TOOLS)
            log.append({"did": "approve", "status": result.status, "pending": result.pending})
        else:
            settle(host, spec, log)
    return {"log": log, "points": switch.passed}


def settle(host: Host, spec: dict[str, Any], log: list[dict[str, Any]]) -> None:
    """Go on until the session is finished, as its owner would: a job's next attempt, a
    person's answer to a pause (in doubt: ``approve`` from the case's seed), a continue."""
    from datamachine.job_worker import run_job

    session, rng = spec["session"], random.Random(spec["seed"])
    for _ in range(12):
        if spec.get("job_id") is not None:
            status = run_job(host, spec["job_id"])
            log.append({"did": "job", "status": status})
            if status in ("completed", "failed"):
                return
            continue
        if not host.transcripts.exists(session):  # died before anything was stored
            if spec.get("chat"):
                if session not in {s.id for s in host.chat_sessions.list()}:
                    host.chat_sessions.create(session_id=session)
                result = host.chat(session, USER[0]["content"], ALL_TOOLS)
            else:
                result = host.run_conversation(USER, ALL_TOOLS, "scripted", "m",
                                               payload={"transcript_session_id": session})
            log.append({"did": "start", "status": result.status, "pending": result.pending})
            continue
        summary = host.transcripts.get_transcript(session)
        if summary.status == "awaiting_confirmation":
            pending = summary.result.get("pending") or {}
            call = (pending.get("tool_call") or {}).get("id")
            answer = "approve" if pending.get("kind") != "tool_in_doubt" else rng.choice(
                ["approve", "decline", "resolve"])
            if answer == "resolve":  # someone looked: it happened
                result = host.resolve(session, str(call), "done, as the service's log shows",
                                      tools=ALL_TOOLS)
            else:
                result = host.resume(session, answer == "approve", tools=ALL_TOOLS)
            log.append({"did": answer, "kind": pending.get("kind"), "call": call,
                        "approve": answer == "approve", "status": result.status,
                        "pending": result.pending})
        elif summary.status in ("running", "interrupted") and spec.get("chat"):
            result = host.chat(session, "go on", ALL_TOOLS)
            log.append({"did": "chat", "status": result.status, "pending": result.pending})
        elif summary.status in ("running", "interrupted"):
            result = host.continue_conversation(session, 10, ALL_TOOLS)
            log.append({"did": "continue", "status": result.status, "pending": result.pending})
        else:
            return


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1])), default=str), flush=True)
