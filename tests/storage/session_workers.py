"""Code that runs in child processes for the concurrency tests of chat sessions, continuation,
lock takeover, crashes and first boots (``tests/storage/test_concurrency.py``).

Children come from a ``forkserver`` that has already imported the project, so starting one
costs a fork, not an interpreter start. Every child boots its own host on the shared database
file, exactly like a second worker or a second server would. The model is a ``text_result``
plugin whose answers say what it was shown, so the parent can check that every stored answer
follows exactly the history the model saw.
"""

from __future__ import annotations

import datetime as dt
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freezegun import freeze_time

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.host import Host
from datamachine.tools import tool

# A fixed moment the cooperating processes agree on (freezegun in each of them).
T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def answer_for(text: str, seen: int) -> str:
    """What the model answers to the user message ``text`` after seeing ``seen`` messages."""
    return f"answer to {text} after {seen}"


class SeeingModel:
    """Answers the last user message, naming how many messages the request held; with
    ``steps``, first calls ``step`` that many times (one call per turn)."""

    def __init__(self, steps: int = 0) -> None:
        self.steps = steps

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        messages = request.messages
        last_user: dict[str, Any] = next(
            (m for m in reversed(messages) if m["role"] == "user"), {})
        since = 0
        for message in reversed(messages):
            if message["role"] == "user":
                break
            since += message["role"] == "tool"
        if request.tools and since < self.steps:
            return {"content": f"step {since + 1} for {last_user.get('content')}",
                    "tool_calls": [{"name": "step", "parameters": {"n": since + 1}}]}
        return {"content": answer_for(str(last_user.get("content")), len(messages))}


@tool
def step(n: int) -> str:
    """Do one step of the work."""
    return f"step {n} done"


def boot_host(db_path: str, steps: int = 0) -> Host:
    """A host on the shared file with the seeing model and no installed plugins."""
    return bootstrap.boot(db_path=db_path, plugins=[SeeingModel(steps)],
                          load_entrypoints=False)


def _many(db_path: str, name: str, barrier: Any, out: Any, count: int,
          one: Callable[[Host, str], str]) -> None:
    """``count`` calls of ``one(host, text)`` after the barrier; report ``(name, [(text,
    status), ...], error)`` and never raise."""
    outcomes: list[tuple[str, str]] = []
    try:
        host = boot_host(db_path)
        barrier.wait(timeout=60)
        for index in range(count):
            text = f"{name}-{index}"
            outcomes.append((text, one(host, text)))
        host.close()
    except Exception:
        out.put((name, outcomes, traceback.format_exc()))
        return
    out.put((name, outcomes, None))


def chat_many(db_path: str, name: str, session_id: str, count: int, barrier: Any,
              out: Any) -> None:
    """``count`` chats on one session."""
    _many(db_path, name, barrier, out, count,
          lambda host, text: host.chat(session_id, text).status)


def continue_many(db_path: str, name: str, session_id: str, count: int, barrier: Any,
                  out: Any) -> None:
    """``count`` continuations (one turn each) of one transcript."""
    _many(db_path, name, barrier, out, count,
          lambda host, text: host.continue_conversation(session_id, extend_by=1).status)


class BlockingModel:
    """Sets ``started`` when asked, then answers only once ``release`` is set."""

    def __init__(self, started: Any, release: Any) -> None:
        self.started = started
        self.release = release

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.started.set()
        self.release.wait(timeout=60)  # the parent decides when this turn ends
        return {"content": "the stale run's answer"}


def stale_chat(db_path: str, session_id: str, started: Any, release: Any, out: Any) -> None:
    """A chat whose one turn outlives its 60 s lock (in this process's frozen time)."""
    try:
        with freeze_time(T0):
            host = bootstrap.boot(db_path=db_path, plugins=[BlockingModel(started, release)],
                                  load_entrypoints=False)
            result = host.chat(session_id, "from the stale run",
                               payload={"transcript_lock_ttl": 60})
            out.put((result.status, result.error_code, result.error, None))
            host.close()
    except Exception:
        out.put((None, None, None, traceback.format_exc()))


def chat_until_killed(db_path: str, session_id: str, iteration: int, progress: str) -> None:
    """Chat on ``session_id`` (three tool turns and an answer per message) until killed.

    Time is frozen at ``T0`` plus an hour per iteration: the lock of the run killed before
    (TTL 300 s) has expired by then, as it would have in real time. Each finished chat appends
    a line to ``progress``.
    """
    with freeze_time(T0 + dt.timedelta(hours=iteration)):
        host = boot_host(db_path, steps=3)
        index = 0
        with Path(progress).open("a") as marks:
            while True:
                text = f"i{iteration}-m{index}"
                result = host.chat(session_id, text, tools=[step])
                marks.write(f"{text} {result.status}\n")
                marks.flush()
                index += 1


def boot_rounds(name: str, rounds: int, paths: Any, barrier: Any, out: Any) -> None:
    """Each round, boot a host on the round's new file at the same instant as the others."""
    failures: list[str] = []
    for index in range(rounds):
        barrier.wait(timeout=60)
        try:
            host = bootstrap.boot(db_path=paths[index], load_entrypoints=False)
            host.close()
        except Exception:
            failures.append(f"round {index}: {traceback.format_exc()}")
    out.put((name, failures))
