"""The run page's requests table: one row per provider request, the failed attempts before it.

Pure, like :mod:`datamachine.server.ui.present`: the records ``TranscriptStore.requests``
returns (latency, usage, options, failed attempts, error; written by the turn runner into the
run's timeline) in, :class:`RequestRow` values out. Stored data is not trusted to have the
shape the runner wrote: a damaged record shows as what can be read of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AttemptRow", "RequestRow", "request_rows"]

NOT_REPORTED = "not reported"
_MESSAGE_LENGTH = 300


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """An attempt that failed and was retried: ``status`` (``HTTP 503``, or ``no answer``),
    ``message``, and the wait before the next attempt."""

    status: str
    message: str
    waited: str


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One provider request: its place (``run``, ``turn``, ``label``), ``latency``, the token
    counts (``not reported`` when the provider sent none), the ``options`` sent, and how it
    ended (``ok``, ``error``); ``attempts``: the failed attempts before it, oldest first."""

    number: int
    run: int
    turn: int
    label: str
    latency: str
    prompt: str
    completion: str
    options: str
    ok: bool
    error: str
    attempts: list[AttemptRow] = field(default_factory=list)


def latency_text(ms: object) -> str:
    """``840 ms``, ``12.4 s``; ``-`` when unknown."""
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
        return "-"
    if ms < 1000:
        return f"{round(ms)} ms"
    return f"{ms / 1000:.1f} s"


def _tokens(usage: object, key: str) -> str:
    value = usage.get(key) if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NOT_REPORTED
    return f"{value:,}"


def _options(options: object) -> str:
    if not isinstance(options, dict) or not options:
        return "-"
    return ", ".join(
        f"{key}={value if isinstance(value, str | int | float) else json.dumps(value)}"
        for key, value in options.items())


def _attempt(raw: object) -> AttemptRow:
    found = raw if isinstance(raw, dict) else {}
    status = found.get("status")
    waited = found.get("waited")
    return AttemptRow(
        status=f"HTTP {status}" if isinstance(status, int) else "no answer",
        message=str(found.get("error") or "")[:_MESSAGE_LENGTH],
        waited=(f"{waited:g} s" if isinstance(waited, int | float)
                and not isinstance(waited, bool) else "-"))


def request_rows(records: list[dict[str, Any]]) -> list[RequestRow]:
    """The records of a session's requests as rows, numbered in order; ``run`` counts the
    session's runs (by their ``run_base``) from 1, as the timeline does."""
    runs: dict[object, int] = {}
    rows: list[RequestRow] = []
    for record in records:
        run = runs.setdefault(record.get("run_base"), len(runs) + 1)
        turn = record.get("turn")
        turn = turn if isinstance(turn, int) and not isinstance(turn, bool) else 0
        label = ("Final summary" if record.get("summary") is True
                 else f"Compaction summary before turn {turn}"
                 if record.get("compaction") is True else f"Turn {turn}")
        if run > 1:
            label = f"Run {run} · {label}"
        attempts = record.get("attempts")
        rows.append(RequestRow(
            number=len(rows) + 1, run=run, turn=turn, label=label,
            latency=latency_text(record.get("ms")),
            prompt=_tokens(record.get("usage"), "prompt_tokens"),
            completion=_tokens(record.get("usage"), "completion_tokens"),
            options=_options(record.get("options")), ok=record.get("ok") is not False,
            error=str(record.get("error") or "")[:_MESSAGE_LENGTH],
            attempts=[_attempt(a) for a in attempts] if isinstance(attempts, list) else []))
    return rows
