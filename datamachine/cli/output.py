"""Readable run summaries for people, and JSON for scripts (``table`` lives in
:mod:`datamachine.cli.tables`)."""

from __future__ import annotations

from typing import Any

import click

from agents_api.jsontext import compact_json, pretty_json
from agents_api.usage import USAGE_COUNTS
from datamachine.budgets_builtin import CONVERSATION_TURNS
from datamachine.cli.tables import table
from datamachine.conversation.result import ConversationResult
from datamachine.registry import CLAMPED, MISNAMED
from datamachine.tools.results import is_rejected

__all__ = ["emit_json", "explain_stop", "print_answer", "print_run_summary", "table",
           "tokens_text", "tool_lines"]


def tokens_text(usage: dict[str, Any]) -> str:
    """A run's token counts for people: ``31 (prompt 23, completion 8)``; a count no request
    reported (``None``: llama-cpp-python's streams send none) says so instead of 0."""

    def count(key: str) -> str:
        value = usage.get(key, 0)
        return "not reported" if value is None else str(value)

    if usage and all(usage.get(key) is None for key in USAGE_COUNTS):
        return "not reported by the provider"
    return (f"{count('total_tokens')} (prompt {count('prompt_tokens')}, "
            f"completion {count('completion_tokens')})")


def emit_json(value: Any) -> None:
    """``value`` as indented JSON on stdout."""
    click.echo(pretty_json(value))


def explain_stop(result: ConversationResult) -> str:
    """One sentence: why the run stopped."""
    if result.status == "completed":
        return "the model gave its final answer."
    ran_out = ""
    if result.budget is not None:  # every stop on a budget names it the same way
        budget = result.budgets.get(result.budget, {})
        ran_out = (f"budget {result.budget!r} ran out ({budget.get('current')}/"
                   f"{budget.get('ceiling')})")
    if result.status == "budget_exceeded":
        return f"{ran_out}. {result.warning or ''}".strip()
    if result.status == "error":
        said = f"error: {result.error} [{result.error_code}]"
        return f"{ran_out}; {said}" if ran_out else said
    if result.status == "transcript_lock_contention":
        return "another run holds this transcript's lock; nothing ran."
    if result.status == "incomplete":
        said = f"incomplete: {result.blocker or result.warning or 'assertions not satisfied'}"
        return f"{ran_out}; {said}" if ran_out else said
    if result.status == "awaiting_confirmation":
        session = result.transcript_session_id or "SESSION"
        return (f"{result.warning or 'paused.'} From here: `datamachine resume {session} "
                "--approve` (or --decline).")
    return result.status


def tool_lines(result: ConversationResult) -> list[str]:
    """One line per tool call in the transcript, with its outcome (rejections included)."""
    lines = []
    calls: dict[str, str] = {}
    for message in result.messages:
        call_id = str(message.metadata.get("tool_call_id", ""))
        if message.type == "tool_call":
            params = compact_json(message.payload.get("parameters", {}))
            name = message.payload.get("tool_name")
            calls[call_id] = f"turn {message.payload.get('turn')}: {name}({params})"
        elif message.type == "tool_result":
            payload = message.payload
            if payload.get("success"):
                outcome = "ok"
            elif is_rejected(payload):
                outcome = "REJECTED: " + str(payload.get("error", ""))[:70] + "..."
            else:
                outcome = "failed: " + str(payload.get("error", ""))[:70]
            lines.append(f"{calls.pop(call_id, '?')} -> {outcome}")
    return lines


def print_run_summary(title: str, result: ConversationResult, host: Any = None, *,
                      err: bool = False) -> None:
    """A short report: status, why it stopped, turns, tools, budgets, usage, transcript (on
    stderr with ``err``: ``run -v`` when stdout is piped)."""
    turns = result.budgets.get(CONVERSATION_TURNS, {})

    def echo(line: str) -> None:
        click.echo(line, err=err)

    echo(click.style(title, bold=True))
    echo(f"  status:      {result.status} (completed={result.completed})")
    echo(f"  stopped:     {explain_stop(result)}")
    echo(f"  turns:       {result.turn_count}/{turns.get('ceiling', '?')}")
    lines = tool_lines(result)
    echo(f"  tool calls:  {len(lines)}")
    for line in lines:
        echo(f"    - {line}")
    used = ", ".join(f"{name} {snap.get('current')}/{snap.get('ceiling')}"
                     for name, snap in result.budgets.items())
    echo(f"  budgets:     {used}")
    usage = result.usage
    echo(f"  tokens:      {tokens_text(usage)}")
    if isinstance(usage.get("cost_usd"), int | float):
        from datamachine.conversation.metering import format_usd

        echo(f"  cost:        {format_usd(usage['cost_usd'] * 1_000_000)}")
    if result.flags:
        echo(f"  flags:       {', '.join(result.flags)}")
    for notice in result.warnings:
        echo(f"  notice:      {notice}")
    final = result.final_content or "(no final answer)"
    echo(f"  final:       {final}")
    if result.transcript_session_id:
        echo(f"  transcript:  {result.transcript_session_id}")


def print_answer(result: ConversationResult, host: Any = None, *, verbose: bool = False) -> None:
    """``run`` with stdout piped: only the answer on stdout, as ``llm`` prints only the
    response, so ``datamachine run "review" > out.md`` saves the review. ``verbose``: the
    report goes to stderr; without it a run that did not complete still says why there, in one
    line (the exit code says it to scripts)."""
    if result.final_content:
        click.echo(result.final_content)
    if verbose:
        print_run_summary("Run", result, host, err=True)
        return
    for notice in result.warnings:
        if CLAMPED in notice or MISNAMED in notice:  # a ceiling asked for is not the one
            # used, or limits nothing: always said
            click.echo(f"notice: {notice}", err=True)
    if result.status != "completed":
        why = explain_stop(result)
        session = result.transcript_session_id
        where = f" (transcript {session})" if session and session not in why else ""
        click.echo(f"Stopped ({result.status}): {why}{where}", err=True)
