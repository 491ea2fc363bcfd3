"""Inspection commands: budgets, transcripts, jobs, sessions and plugins."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from agents_api.jsontext import compact_json, pretty_json
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json
from datamachine.cli.tables import table
from datamachine.storage.jobs import Job
from datamachine.storage.transcripts import TRANSCRIPT_STATUSES, TranscriptStatus

__all__ = ["COMMANDS", "jobs"]


@click.group()
def budgets() -> None:
    """Registered budgets and how their ceilings resolve."""


@budgets.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def budgets_list(state: State, as_json: bool) -> None:
    """Every registered budget: unit, scope, default, clamp, setting, the ceiling a run gets
    now and where it comes from, owner. "unset": counts only where a ceiling is given;
    "unlimited": set to no limit (JSON: null for both)."""
    host = state.host
    rows = []
    for name in host.budgets.registered_names():
        spec = host.budgets.get_spec(name)
        assert spec is not None
        resolved = host.budgets.resolve(name)
        limit = resolved.limit
        rows.append({"name": name, "unit": spec.unit, "scope": spec.scope,
                     "default": spec.default, "min": spec.min, "max": spec.max,
                     "setting": spec.setting,
                     "ceiling": limit if isinstance(limit, int) else None,
                     "source": resolved.source + (" (clamped)" if resolved.clamped else ""),
                     "owner": host.budgets.owner(name),
                     "_shown": "unset" if limit is None else limit})
    if as_json:
        emit_json([{k: v for k, v in row.items() if k != "_shown"} for row in rows])
        return
    table(["name", "unit", "scope", "default", "clamp", "setting", "ceiling", "from", "owner"],
          [[r["name"], r["unit"], r["scope"], "unset" if r["default"] is None else r["default"],
            f"[{r['min']:,}, {r['max']:,}]", r["setting"] or "-", _shown(r["_shown"]),
            r["source"], r["owner"]] for r in rows],
          whole=("name", "setting"))


def _shown(limit: object) -> str:
    return f"{limit:,}" if isinstance(limit, int) else str(limit)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group()
def transcripts() -> None:
    """Browse stored transcripts."""


@transcripts.command("list")
@click.option("-n", "--limit", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="At most this many, the most recently updated first.")
@click.option("--status", type=click.Choice(TRANSCRIPT_STATUSES),
              help="Only transcripts in this status.")
@click.option("--search", metavar="TEXT",
              help="Only transcripts with a message whose text holds TEXT (case-insensitive).")
@click.option("--mode", help="Only transcripts run in this mode (pipeline, chat, system, ...).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def transcripts_list(state: State, limit: int, status: TranscriptStatus | None,
                     search: str | None, mode: str | None, as_json: bool) -> None:
    """The most recent transcripts, optionally filtered; ids are shown whole (any unique
    prefix of one is enough for `transcripts show`, `continue` and `resume`)."""
    items = state.host.transcripts.list(limit=limit, status=status, search=search or None,
                                        mode=mode or None)
    if as_json:
        emit_json([item.model_dump() for item in items])
        return
    table(["id", "status", "turns", "messages", "tokens", "provider", "updated (UTC)"],
          [[t.id, t.status, t.turn_count, t.message_count,
            _count(t.usage.get("total_tokens", 0)),
            t.provider or "-", _when(t.updated_at)] for t in items],
          optional=("messages", "tokens"))


@transcripts.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def transcripts_show(state: State, session_id: str, as_json: bool) -> None:
    """One transcript (SESSION_ID: its id or a unique prefix): metadata, budgets and every
    message."""
    host = state.host
    record = host.transcripts.get_transcript(host.transcripts.resolve(session_id))
    compactions = host.transcripts.compactions(record.id)
    if as_json:
        emit_json({**record.model_dump(), "compactions": compactions})
        return
    click.echo(f"transcript {record.id}: {record.status}, {record.turn_count} turns "
               f"({record.cumulative_turn_count} in all), provider {record.provider}, "
               f"model {record.model}, mode {record.mode}")
    click.echo(f"usage: {compact_json(record.usage)}")
    for name, snap in record.budgets.items():
        click.echo(f"budget {name}: {snap.get('current')}/{snap.get('ceiling')}")
    # Each compaction after the last message it stood for (what the model was sent from then
    # on; the transcript keeps every message).
    marks: dict[int, list[dict[str, Any]]] = {}
    for compaction in compactions:
        marks.setdefault(int(compaction["upto"]), []).append(compaction)
    for position, message in enumerate(record.messages, start=1):
        kind, role = message.get("type"), message.get("role")
        payload = message.get("payload", {})
        if kind == "tool_call":
            text = f"{payload.get('tool_name')}({compact_json(payload.get('parameters', {}))})"
        else:
            text = str(message.get("content", ""))
        click.echo(f"[{role}/{kind}] {text}")
        for mark in marks.get(position, ()):
            click.echo(f"-- context compacted ({mark['strategy']}) before turn {mark['turn']}: "
                       f"about {mark['tokens_before']:,} -> {mark['tokens_after']:,} tokens "
                       f"sent, {mark['messages_removed']} message(s) removed or cleared --")


@click.group()
def jobs() -> None:
    """Browse pipeline jobs and the engine data their runs recorded."""


@jobs.command("list")
@click.option("--status", type=click.Choice(["pending", "running", "completed", "failed"]))
@click.option("-n", "--limit", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="At most this many, the most recently updated first.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def jobs_list(state: State, status: str | None, limit: int, as_json: bool) -> None:
    """The most recent jobs."""
    items = state.host.jobs.list(status=status, limit=limit)
    if as_json:
        emit_json([item.model_dump() for item in items])
        return
    table(["id", "status", "flow step", "failure", "updated (UTC)"],
           [[j.id, j.status, j.flow_step_id or "-", j.failure_reason or "-",
             _when(j.updated_at)] for j in items])


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_obj
@handle_errors
def jobs_show(state: State, job_id: int, as_json: bool) -> None:
    """One job: its status, what stopped it (flags, the budget that ran out, budget
    snapshots), its times and engine data."""
    job = state.host.jobs.get(job_id)
    if as_json:
        emit_json(job.model_dump())
        return
    for line in _job_lines(job):
        click.echo(line)


def _job_lines(job: Job) -> list[str]:
    """``jobs show`` as text: one fact a line, the engine data last."""
    status = job.status + (f" ({job.failure_reason})" if job.failure_reason else "")
    ran_out = job.budgets.get(job.budget or "", {})
    budget = (f"{job.budget} ran out ({ran_out.get('current')}/{ran_out.get('ceiling')})"
              if job.budget else "-")
    times = [f"created {_when(job.created_at)}"]
    times += [f"{what} {_when(at)}" for what, at in (("started", job.started_at),
                                                    ("finished", job.finished_at))
              if at is not None]
    lines = [f"job {job.id}: {status}", f"flow step: {job.flow_step_id or '-'}",
             f"flags: {', '.join(job.flags) or '-'}", f"budget: {budget}"]
    lines += [f"budget {name}: {snap.get('current')}/{snap.get('ceiling')}"
              for name, snap in job.budgets.items()]
    return [*lines, f"times (UTC): {', '.join(times)}",
            f"engine data: {pretty_json(job.engine_data)}"]


@click.group()
def sessions() -> None:
    """Browse chat sessions and their turn limits."""


@sessions.command("list")
@click.option("-n", "--limit", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="At most this many, the most recently updated first.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def sessions_list(state: State, limit: int, as_json: bool) -> None:
    """The most recent chat sessions."""
    items = state.host.chat_sessions.list(limit=limit)
    if as_json:
        emit_json([item.model_dump() for item in items])
        return
    table(["id", "status", "turns", "updated (UTC)"],
           [[c.id, c.status, f"{c.turn_count}/{c.max_turns}", _when(c.updated_at)]
            for c in items])


@sessions.command("show")
@click.argument("session_id")
@click.pass_obj
@handle_errors
def sessions_show(state: State, session_id: str) -> None:
    """One chat session (SESSION_ID: its id or a unique prefix), as JSON (read its messages
    with ``transcripts show``)."""
    sessions = state.host.chat_sessions
    emit_json(sessions.get(sessions.resolve(session_id)).model_dump())


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def plugins(state: State, as_json: bool) -> None:
    """Loaded plugins, their hooks and versions."""
    host = state.host
    rows = []
    for name, info in host.plugins.items():
        plugin = host.pm.get_plugin(name)
        hooks = sorted(c.name for c in host.pm.get_hookcallers(plugin) or [])
        rows.append({"name": name, "source": info.source, "distribution": info.distribution,
                     "version": info.version, "hooks": hooks})
    if as_json:
        emit_json(rows)
        return
    table(["name", "source", "distribution", "version", "hooks"],
           [[r["name"], r["source"], r["distribution"] or "-", r["version"] or "-",
             ", ".join(r["hooks"])] for r in rows],
          whole=("name", "distribution"))


COMMANDS = [budgets, transcripts, jobs, sessions, plugins]


def _count(value: object) -> object:
    """A token count for the list: ``not reported`` when no request of the run reported it."""
    return "not reported" if value is None else value
