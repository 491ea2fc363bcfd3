"""Code that runs in child processes for the spend-limit tests (``test_spend_processes.py``).

Each child boots its own host on the shared database file, as another worker or server would,
and reports what its runs spent, so the parent can compare it with what the store settled.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.tools import tool

TOKENS_PER_REQUEST = 100


@tool
def step(i: int) -> str:
    """One step of work.

    Args:
        i: Which step.
    """
    return f"step {i} done"


def _script() -> list[dict[str, Any]]:
    usage = {"prompt_tokens": 80, "completion_tokens": 20, "total_tokens": TOKENS_PER_REQUEST}
    return [{"tool_calls": [{"id": "s1", "name": "step", "parameters": {"i": 1}}],
             "usage": usage},
            {"content": "done", "usage": usage}]


def spend_runs(db_path: str, runs: int, out: Any) -> None:
    """Run ``runs`` two-request conversations; report each run's status and tokens."""
    try:
        host = bootstrap.boot(db_path=db_path, load_entrypoints=False)
        try:
            report = []
            for _ in range(runs):
                result = host.run_conversation(
                    [{"role": "user", "content": "work"}], [step], "scripted", "m",
                    payload={"script": _script(), "final_summary": False,
                             "persist_transcript": False})
                report.append((result.status, result.budget,
                               int(result.usage.get("total_tokens", 0))))
        finally:
            host.close()
        out.put(("ok", report))
    except BaseException:
        out.put(("error", traceback.format_exc()))


class HangingModel:
    """A model that says it was asked, then never answers (the parent kills the process)."""

    def __init__(self, out: Any) -> None:
        self.out = out

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.out.put(("asked", None))
        threading.Event().wait()  # until the parent's kill -9
        return {"content": "never"}


def reserve_and_hang(db_path: str, ttl: int, out: Any) -> None:
    """Start a run whose request reserves spend and then hangs in the provider."""
    try:
        host = bootstrap.boot(db_path=db_path, load_entrypoints=False,
                              plugins=[HangingModel(out)])
        host.run_conversation([{"role": "user", "content": "work"}], [], "scripted", "m",
                              payload={"transcript_lock_ttl": ttl})
    except BaseException:
        out.put(("error", traceback.format_exc()))
