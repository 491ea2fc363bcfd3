"""The model of the queue tests: 20 ms per turn (an I/O-bound provider), a ``step`` tool call
per turn until the job's ``steps`` are done, and a log line per request so the parent can count
what each worker was asked.

It lives in the worker processes as a plugin (``text_result``), with the ``step`` tool the jobs
name. A prompt with a file in ``$DM_TEST_OUTAGE_DIR`` holding ``TURN COUNT`` meets a provider
that is down: its requests at turn ``TURN`` (0-based) fail as outages while ``COUNT`` is above
zero (one less each time), so the first attempts of a job fail and a later one goes on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from datamachine import ProviderRequest, hookimpl
from datamachine.errors import ProviderError
from datamachine.tools import tool

TURN_SECONDS = 0.02


@tool
def step(n: int) -> str:
    """Do one step of the job.

    Args:
        n: Which step.
    """
    return f"step {n} done"


def expected_messages(prompt: str, steps: int) -> list[tuple[str, str, str]]:
    """(type, role, text) of every message a job's whole transcript holds, in order."""
    found = [("text", "user", prompt)]
    for n in range(1, steps + 1):
        found += [("text", "assistant", f"{prompt}: step {n}"), ("tool_call", "assistant", ""),
                  ("tool_result", "tool", "")]
    return [*found, ("text", "assistant", f"{prompt}: done after {steps} steps")]


def _outage(prompt: str, done: int) -> bool:
    directory = os.environ.get("DM_TEST_OUTAGE_DIR")
    if not directory:
        return False
    marker = Path(directory) / prompt
    if not marker.exists():
        return False
    turn, left = (int(part) for part in marker.read_text().split())
    if turn != done or left <= 0:
        return False
    marker.write_text(f"{turn} {left - 1}")
    return True


class SlowModel:
    """The plugin (see the module docstring)."""

    def __init__(self, log: str | None = None) -> None:
        self.log = log

    @hookimpl
    def register_tools(self) -> list[Any]:
        return [step]

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        messages = request.messages
        prompt = str(next(m for m in messages if m["role"] == "user")["content"])
        steps = int(prompt.rsplit(" ", 1)[-1])  # "job 17 steps 5"
        done = sum(1 for m in messages if m["role"] == "tool")
        time.sleep(TURN_SECONDS)
        if self.log:
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()}\t{prompt}\t{done}\n")
        if _outage(prompt, done):
            return ProviderError("the model server is down (simulated)",
                                 code="provider_connection_error", provider=request.provider)
        if done < steps:
            return {"content": f"{prompt}: step {done + 1}",
                    "tool_calls": [{"name": "step", "parameters": {"n": done + 1}}]}
        return {"content": f"{prompt}: done after {steps} steps"}
