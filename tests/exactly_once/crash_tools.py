"""Tools with side effects, and a model that calls them, for the exactly-once tests.

Each effectful tool appends one line to a ledger (a list in this process, and the file named
by ``LEDGER_FILE`` when set, so a test can read what a killed process did): the tool's name,
its argument and the call's idempotency key. ``CRASH`` makes the next effectful call (or the
Nth) die right after its side effect, as a process killed there would (a BaseException
nothing in the run catches: its turn is never stored).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from datamachine import ToolContext, hookimpl, tool

LEDGER: list[dict[str, str]] = []
CRASH: dict[str, bool | int] = {"after_effect": False}
# Called before and after each side effect (the kill-point counter of kill_child.py).
POINTS: list[Any] = []


class Crash(BaseException):
    """The process died here (in-process stand-in for kill -9; the real one is in
    test_kill_points.py)."""


def _effect(name: str, value: str, context: ToolContext) -> None:
    for point in POINTS:
        point()
    line = {"tool": name, "value": value, "key": context.idempotency_key}
    LEDGER.append(line)
    path = os.environ.get("LEDGER_FILE")
    if path:
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    for point in POINTS:
        point()
    left = CRASH["after_effect"]  # True: die after this effect; N: after the Nth from now
    if left:
        if left is not True and left > 1:
            CRASH["after_effect"] = left - 1
            return
        CRASH["after_effect"] = False
        raise Crash(f"died after {name}({value})")


@tool(effects="write")
def send(to: str, context: ToolContext) -> str:
    """Send a message (must never be sent twice unasked).

    Args:
        to: Who gets it.
    """
    _effect("send", to, context)
    return f"sent to {to}"


@tool(effects="idempotent")
def charge(cents: int, context: ToolContext) -> str:
    """Charge a card (the payment service dedupes by key).

    Args:
        cents: How much.
    """
    _effect("charge", str(cents), context)
    return f"charged {cents}"


@tool
def look(q: str) -> str:
    """Look something up (no side effect).

    Args:
        q: What to look up.
    """
    return f"found {q}"


@tool(effects="write", runtime={"requires_approval": True})
def publish(title: str, context: ToolContext) -> str:
    """Publish a post (a person approves it first).

    Args:
        title: The post's title.
    """
    _effect("publish", title, context)
    return f"published {title}"


TOOLS = [send, charge, look]
ALL_TOOLS = [send, charge, look, publish]


class CrashTools:
    """Registers the tools, as a plugin would (a job's worker finds them by name)."""

    @hookimpl
    def register_tools(self) -> list[Any]:
        return list(ALL_TOOLS)


class Planner:
    """A sensible model working through ``plan`` (turns, each a list of calls ``{"name",
    "parameters"}``): it never asks for a call it has asked for before (whatever its result
    said, an in-doubt one included), asks for the rest of the first turn not done yet, and
    when every call was asked answers with the last result it read."""

    def __init__(self, plan: list[list[dict[str, Any]]], *, ids: str | None = "r") -> None:
        self.plan = plan
        self.requests = 0
        # None: calls without ids (the provider numbers them call_<turn>_<n>, the same in
        # every run); "same": every call of a turn has the id "0".
        self.ids = ids

    @hookimpl
    def text_result(self, request: Any) -> dict[str, Any]:
        self.requests += 1
        asked = {_signature(call) for message in request.messages
                 for call in message.get("tool_calls") or ()}
        for turn in self.plan:
            left = [call for call in turn if _signature(call) not in asked]
            if left:
                return {"content": "", "tool_calls": [
                    {**self._id(n), **call} for n, call in enumerate(left)]}
        results = [m for m in request.messages if m["role"] == "tool"]
        return {"content": f"final: {results[-1]['content'] if results else ''}"}


    def _id(self, n: int) -> dict[str, str]:
        if self.ids is None:
            return {}
        return {"id": "0" if self.ids == "same" else f"r{self.requests}c{n}"}


def _signature(call: dict[str, Any]) -> str:
    return json.dumps([call.get("name"), call.get("parameters")], sort_keys=True)
