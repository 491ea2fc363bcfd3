"""What the run viewer shows of a stored transcript, as plain values for the templates.

Everything here is pure: a :class:`~datamachine.storage.transcripts.TranscriptSummary` (and a
run's messages) in, rows, bars, reasons and a timeline out. The templates only lay them out, and
Jinja escapes every value they print.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from datamachine.conversation.metering import format_usd
from datamachine.storage.transcript_rows import TITLE_LENGTH
from datamachine.storage.transcripts import TranscriptSummary
from datamachine.tools.results import REJECTED

__all__ = ["BudgetBar", "RunRow", "TimelineItem", "TurnGroup", "budget_bars", "duration_text",
           "run_row", "stop_reason", "timeline"]

_REFUSALS = {
    "duplicate_tool_call": "duplicate rejected",
    "tool_runtime_rule_rejected": "rule rejected",
    "approval_declined": "approval declined",
    "tools_closed": "tools closed",
    "session_aborted": "session aborted",
}
_MESSAGE_KINDS = {
    "final_summary": "final summary",
    "completion_nudge": "completion nudge",
    "completion_policy_continue": "completion policy",
}
_MARK_AFTER_TURN = frozenset({"budget_extended", "budget_exceeded", "turn_interrupted",
                              "final_summary", "completion_nudge_added", "blocker_reported"})
_BEFORE_SUMMARY = frozenset({"budget_exceeded", "turn_interrupted"})
_REASON_LENGTH = 160
# The most characters of one message or tool payload a run's page shows.
MAX_SHOWN = 20_000


@dataclass(frozen=True, slots=True)
class BudgetBar:
    """One budget as a bar: ``percent`` of its ceiling used (0-100), ``stopped``: the budget
    that stopped the run."""

    name: str
    current: int | float
    ceiling: int | float
    percent: int
    stopped: bool
    exceeded: bool
    rail: str | None


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of the runs list."""

    id: str
    title: str
    status: str
    reason: str
    mode: str
    provider: str
    model: str
    turns: int
    tokens: int | None
    cost: str | None
    started: str
    duration: str
    bars: list[BudgetBar]


@dataclass(slots=True)
class TimelineItem:
    """One entry of a turn: ``kind`` is ``message``, ``tool_call``, ``tool_result`` or
    ``mark`` (a recorded event); ``label`` what it is, ``text`` its words, ``detail`` the
    collapsible JSON (parameters, a result), ``flag`` a refusal or a special message."""

    kind: str
    label: str
    text: str = ""
    detail: str = ""
    flag: str = ""
    ok: bool = True


@dataclass(slots=True)
class TurnGroup:
    """The messages of one turn, in order (turn 0: what the run was given); ``run``: which
    run of the session (from 1), ``opens_run``: the first group of a later run."""

    turn: int
    items: list[TimelineItem] = field(default_factory=list)
    run: int = 1
    opens_run: bool = False


def _number(value: object) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def budget_bars(budgets: dict[str, Any], stopping: str | None) -> list[BudgetBar]:
    """The run's budgets as bars, in the order the run reported them."""
    bars: list[BudgetBar] = []
    for name, snapshot in budgets.items():
        if not isinstance(snapshot, dict):
            continue
        current, ceiling = _number(snapshot.get("current")), _number(snapshot.get("ceiling"))
        if current is None or ceiling is None:
            continue
        percent = 100 if ceiling <= 0 else max(0, min(100, round(100 * current / ceiling)))
        rail = snapshot.get("rail")
        bars.append(BudgetBar(name=str(name), current=current, ceiling=ceiling, percent=percent,
                              stopped=name == stopping, exceeded=snapshot.get("exceeded") is True,
                              rail=rail if isinstance(rail, str) else None))
    return bars


def _short(text: str, length: int = _REASON_LENGTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= length else text[:length - 1] + "…"


def stop_reason(summary: TranscriptSummary) -> str:
    """Why the run stopped (or what it is doing), in one line a person reads."""
    result, status = summary.result, summary.status
    budget = result.get("budget")
    if status == "running":
        return "Running now."
    if status == "interrupted":
        return "Interrupted: its process stopped mid-run (no lock stands behind it)."
    if status == "awaiting_confirmation":
        view = pending_view(result.get("pending")) or {}
        kind = str(view.get("kind") or "an answer").replace("_", " ")
        what = view.get("budget") or (view.get("tool_call") or {}).get("name")
        return _short(f"Waiting for a person: {kind}{f' ({what})' if what else ''}.")
    spent = ""
    if isinstance(budget, str):  # every stop on a budget says which, the same way
        snapshot = summary.budgets.get(budget, {})
        used = (f" at {snapshot.get('current')}/{snapshot.get('ceiling')}"
                if isinstance(snapshot, dict) and "current" in snapshot else "")
        rail = snapshot.get("rail") if isinstance(snapshot, dict) else None
        rail_text = {"hard_ceiling": " (hard ceiling)", "time": " (time ran out)"}.get(
            str(rail), "")
        spent = f"Budget {budget} spent{used}{rail_text}"
    if status == "budget_exceeded" and spent:
        return _short(f"{spent}.")
    if status == "error":
        code, error = result.get("error_code"), result.get("error")
        said = f"Error{f' {code}' if code else ''}: {error or 'no message'}"
        return _short(f"{spent}; {said}" if spent else said)
    if status == "incomplete" and spent:
        return _short(f"Incomplete: {spent[0].lower()}{spent[1:]}.")
    if status == "completed":
        nudges = result.get("completion_nudge_count") or 0
        return "Answered." if not nudges else f"Answered after {nudges} completion nudge(s)."
    for key in ("warning", "error"):
        if isinstance(result.get(key), str) and result[key]:
            return _short(result[key])
    missing = result.get("completion_assertions_missing")
    if missing:
        return _short(f"Completion assertions not met: {json.dumps(missing)}")
    return status.replace("_", " ").capitalize() + "."


def pending_view(pending: object) -> dict[str, Any] | None:
    """What a paused run waits for, with the shapes the page expects (a stored value of
    another shape shows as missing instead of failing the page)."""
    if not isinstance(pending, dict):
        return None
    call = pending.get("tool_call")
    tool_call = None
    if isinstance(call, dict):
        parameters = call.get("parameters")
        tool_call = {"name": str(call.get("name", "?")), "id": str(call.get("id") or ""),
                     "parameters": _pretty(parameters if parameters is not None else {})}
    pause_id = pending.get("pause_id")
    return {"kind": str(pending.get("kind") or ""), "budget": pending.get("budget"),
            "extend_by": pending.get("extend_by"), "tool_call": tool_call,
            "pause_id": pause_id if isinstance(pause_id, str) else ""}


def damaged_row(session_id: str, status: str) -> RunRow:
    """The list's line of a run whose stored values cannot be shown."""
    return RunRow(id=session_id, title="(a damaged row)", status=status,
                  reason="Its stored values cannot be shown; see `datamachine transcripts "
                         "show` for it.", mode="-", provider="-", model="-", turns=0,
                  tokens=None, cost=None, started="-", duration="-", bars=[])


def duration_text(seconds: float) -> str:
    """``seconds`` the way a person reads a duration."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def when(timestamp: float) -> str:
    """A stored moment as UTC text."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def run_row(summary: TranscriptSummary) -> RunRow:
    """The runs list's line for one transcript."""
    found = summary.result.get("session_usage")
    usage = found if isinstance(found, dict) else summary.usage  # every run of the session
    tokens = usage.get("total_tokens")
    cost = usage.get("cost_usd")
    title = summary.title or "(no user message)"
    if len(title) >= TITLE_LENGTH:
        title += "…"
    return RunRow(
        id=summary.id, title=title, status=summary.status,
        reason=stop_reason(summary), mode=summary.mode or "-", provider=summary.provider or "-",
        model=summary.model or "-", turns=summary.cumulative_turn_count,
        tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
        cost=_cost(cost),
        started=when(summary.created_at),
        duration=duration_text(summary.updated_at - summary.created_at),
        bars=budget_bars(summary.budgets, summary.result.get("budget")))


def _cost(value: object) -> str | None:
    """Dollars for people; None (shown as "-") for a value no run spends."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value < 1e12):  # also NaN
        return None
    return format_usd(value * 1_000_000)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _cut(text: str) -> str:
    if len(text) <= MAX_SHOWN:
        return text
    return (f"{text[:MAX_SHOWN]}\n… ({len(text) - MAX_SHOWN:,} more characters: "
            "`datamachine transcripts show` prints it whole)")


def _item(envelope: dict[str, Any]) -> TimelineItem:
    kind, role = envelope.get("type"), str(envelope.get("role", "?"))
    payload = _mapping(envelope.get("payload"))
    metadata = _mapping(envelope.get("metadata"))
    content = envelope.get("content")
    text = content if isinstance(content, str) else _pretty(content)
    if kind == "tool_call":
        call_id = metadata.get("tool_call_id")
        return TimelineItem("tool_call", str(payload.get("tool_name", "?")),
                            detail=_cut(_pretty(payload.get("parameters", {}))),
                            flag=f"call {call_id}" if call_id else "")
    if kind == "tool_result":
        rejected = payload.get(REJECTED) is True
        flag = (_REFUSALS.get(str(payload.get("error_type")), "rejected") if rejected else "")
        ok = payload.get("success") is True
        shown = payload.get("result") if ok and "result" in payload else text
        return TimelineItem("tool_result", str(payload.get("tool_name", "?")),
                            text=_short(text[:1000], 200),
                            detail=_cut(shown if isinstance(shown, str) else _pretty(shown)),
                            flag=flag, ok=ok)
    return TimelineItem("message", role, text=_cut(text),
                        flag=_MESSAGE_KINDS.get(str(metadata.get("type")), ""))


def mark_text(mark: dict[str, Any]) -> str:
    """One recorded event as a sentence."""
    event, budget = mark.get("event"), mark.get("budget", "")
    used = f"{mark.get('current')}/{mark.get('ceiling')}"
    if event == "budget_pressure":
        return f"Pressure {mark.get('tier')} on {budget} ({used}): the model was warned."
    if event == "budget_extended":
        return f"{budget} extended: ceiling now {mark.get('ceiling')} (at {mark.get('current')})."
    if event == "budget_exceeded":
        rail = mark.get("rail")
        return f"{budget} spent ({used}{f', {rail}' if rail else ''}): the run stops."
    if event == "turn_interrupted":
        return f"The turn was cut off: {budget} ran out."
    if event == "final_summary":
        error = f", {mark['error']}" if mark.get("error") else ""
        return (f"Final summary by the {mark.get('source', 'model')} "
                f"after {mark.get('attempts', 1)} attempt(s){error}.")
    if event == "completion_nudge_added":
        return f"Completion nudge {mark.get('completion_nudge_count')}: the task was not done."
    if event == "blocker_reported":
        return f"Blocker reported: {mark.get('reason', '')}"
    if event == "context_compacted":
        return (f"Context compacted by {mark.get('strategy', '?')}: about "
                f"{_count(mark.get('tokens_before'))} tokens down to "
                f"{_count(mark.get('tokens_after'))} ({mark.get('messages_removed', 0)} "
                "message(s) removed or cleared from what the model is sent).")
    if event == "context_overflow":
        return (f"The provider said the prompt was too long "
                f"({_count(mark.get('sent_tokens'))} tokens): the context window is now "
                f"{_count(mark.get('ceiling'))} tokens.")
    if event == "loop_guard":
        what = {"nudge": "the model was told to stop repeating itself",
                "hide_tool": f"tool {mark.get('tool')} was taken away",
                "stop": "the run stops"}.get(str(mark.get("step")), str(mark.get("step")))
        tool = f" ({mark['tool']})" if mark.get("tool") else ""
        return (f"Loop guard: {str(mark.get('signal', '?')).replace('_', ' ')}{tool}, "
                f"{mark.get('count')}/{mark.get('ceiling')} turns stuck: {what}.")
    return str(event)


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"


def timeline(numbered: list[tuple[int | None, int, dict[str, Any]]],
             marks: list[dict[str, Any]], *, complete: bool = True) -> list[TurnGroup]:
    """The messages grouped by run and turn, with the recorded events placed in their turns.

    A session holds several runs (chat messages, a continuation, a resumed pause), each
    numbering its turns from 1 again; every stored message and event names its run by
    ``run_base`` (the session's turns before it), so both find their group exactly. Messages
    stored before that existed (``run_base`` None) are grouped by their turn numbers alone.
    An event of a run with no group here lands in a group of its own at the end, unless the
    messages were cut (``complete`` False): then its run is not on the page.
    """
    runs: dict[object, list[TurnGroup]] = {}
    order: list[TurnGroup] = []
    previous: tuple[object, int] | None = None
    legacy = 0  # old messages: a new run wherever the turn numbers start again
    for run_base, turn, envelope in numbered:
        key: object = run_base
        if run_base is None:
            if previous is not None and (turn < previous[1] or (turn == 0 != previous[1])):
                legacy += 1
            key = ("legacy", legacy)
        if previous != (key, turn):
            groups = runs.setdefault(key, [])
            group = TurnGroup(turn, run=list(runs).index(key) + 1,
                              opens_run=not groups and bool(order))
            groups.append(group)
            order.append(group)
            previous = (key, turn)
        order[-1].items.append(_item(envelope))
    in_front: dict[int, int] = {}  # marks placed before a turn's messages so far, per group
    for mark in marks:
        if not isinstance(mark, dict):
            continue
        event = mark.get("event")
        event = event if isinstance(event, str) else str(event)
        run_base, found_turn = mark.get("run_base"), mark.get("turn")
        turn = found_turn if isinstance(found_turn, int) else 0
        its_run = runs.get(run_base) if isinstance(run_base, int) else None
        target = next((g for g in its_run or () if g.turn == turn), None)
        if target is None:
            if not complete:
                continue  # its run is past the messages shown
            number = list(runs).index(run_base) + 1 if its_run else len(runs) + 1
            target = TurnGroup(turn, run=number, opens_run=not its_run and bool(order))
            runs.setdefault(run_base, []).append(target)
            order.append(target)
        item = TimelineItem("mark", event.replace("_", " "), text=mark_text(mark))
        if event in _BEFORE_SUMMARY:
            # The stop comes before the final summary it asked for.
            at = next((i for i, it in enumerate(target.items) if it.flag == "final summary"),
                      len(target.items))
            target.items.insert(at, item)
        elif event in _MARK_AFTER_TURN:
            target.items.append(item)
        else:
            placed = in_front.get(id(target), 0)
            target.items.insert(placed, item)
            in_front[id(target)] = placed + 1
    # A group a mark added belongs after its run's other groups.
    position = {id(g): i for i, g in enumerate(order)}
    return sorted(order, key=lambda g: (g.run, position[id(g)]))
