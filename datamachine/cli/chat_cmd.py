"""``datamachine chat``: an interactive REPL on a stored chat session.

Each line you type is one chat-mode run on the session (its stored messages plus yours). The
session's turn limit is enforced: at the limit you are asked "continue?" through the
``confirm_continuation`` hook (answered here, on the terminal); declining aborts the session.
Ctrl-D ends the chat; Ctrl-C interrupts a run (the transcript keeps every finished turn).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from datamachine.budgets_builtin import CHAT_TURNS
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.model_options import (
    check_declared_options,
    model_option,
    passthrough_option,
)
from datamachine.cli.progress import Progress, TextEcho
from datamachine.cli.provider_notice import (
    provider_for_script,
    read_script,
    warn_if_scripted_fallback,
)
from datamachine.cli.settings_cmd import warn_unread_variables
from datamachine.errors import SessionAborted, UsageError
from datamachine.hookspecs import hookimpl

__all__ = ["TerminalConfirm", "chat"]


class TerminalConfirm:
    """Answers ``confirm_continuation`` by asking the person at the terminal, during one
    message's run: the question takes its own line (``echo``: the answer streamed so far) and
    the status line (``progress``) steps aside for it."""

    def __init__(self, progress: Progress | None = None, echo: TextEcho | None = None) -> None:
        self.progress = progress
        self.echo = echo

    @hookimpl(trylast=True)
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        if not sys.stdin.isatty():
            return None  # nobody to ask: the headless default applies
        if context.get("kind") == "chat_turn_limit":
            question = (f"Turn limit reached ({budget.current()}/{budget.ceiling()}). "
                        "Continue this session?")
        else:
            question = (f"Budget {budget.name()!r} is spent ({budget.current()}/"
                        f"{budget.ceiling()}). Grant more?")
        if self.echo is not None:
            self.echo.end()  # the answer streamed so far keeps its own line
        if self.progress is not None:
            self.progress.pause()
        try:
            return click.confirm(question, default=False)
        finally:
            if self.progress is not None:
                self.progress.resume()


@contextmanager
def _asking(host: Any, progress: Progress, stream: bool) -> Iterator[TextEcho | None]:
    """One message's run: its streamed text (the status line gives way once the text itself
    shows progress) and the person at the terminal answering ``confirm_continuation``."""
    streamed = TextEcho("assistant> ", on_first=progress.pause) if stream else None
    confirm = TerminalConfirm(progress, streamed)
    host.pm.register(confirm, name="datamachine.cli.terminal_confirm")
    try:
        yield streamed
    finally:
        host.pm.unregister(confirm)


def _limit_flag(host: Any, max_turns: str | None) -> int | str | None:
    """``--max-turns`` as the budget ``chat_turns`` takes it: read as a number, else as it is
    (``unlimited``); whether the budget takes it is for the host's registry to say (a
    UsageError naming the flag: exit 2)."""
    if max_turns is None:
        return None
    limit: int | str = max_turns
    if max_turns.strip().lstrip("+-").isdigit():
        limit = int(max_turns)
    host.budgets.check_ceiling(CHAT_TURNS, "--max-turns", limit)
    return limit


def _new_session(host: Any, limit: int | str | None) -> Any:
    """A new session whose limit is the budget ``chat_turns`` resolved by the host's registry
    (``--max-turns``, else the setting, else the default; then the registered clamp, reported
    on stderr)."""
    session = host.chat_sessions.create(max_turns=limit)
    for notice in session.warnings:
        click.echo(f"Warning: {notice}", err=True)
    return session


def _stop_line(result: Any) -> str:
    """What ``chat`` prints when the session's limit stopped it: the budget and its flag, as
    every budget stop is reported."""
    named = f" (budget {result.budget}: {', '.join(result.flags)})" if result.budget else ""
    return (f"The session reached its turn limit{named} and was not continued; it is now "
            "closed.")


@click.command()
@click.option("--session", "session_id", default=None,
              help="Continue this chat session (its id or a unique prefix).")
@click.option("-s", "--system", default=None,
              help="A system prompt, sent before the first message you type.")
@click.option("--max-turns", default=None,
              help="Turn limit of a new session (the budget chat_turns: 1 to 10,000, or "
                   "'unlimited'; default: setting chat_max_turns, 25; clamped to the "
                   "budget's range, with a warning).")
@click.option("--provider", default=None,
              help="Provider name (default: setting default_provider; `datamachine models` "
                   "lists them).")
@click.option("-m", "--model", default=None, help="Model id (default: setting default_model).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON or YAML script for the scripted provider (replayed for each message).")
@model_option
@passthrough_option
@click.option("--no-stream", is_flag=True,
              help="Print each answer when it is complete instead of as it arrives.")
@click.pass_obj
@handle_errors
def chat(state: State, session_id: str | None, system: str | None, max_turns: str | None,
         provider: str | None, model: str | None, script: Path | None,
         model_options: dict[str, Any], option_passthrough: bool, no_stream: bool) -> None:
    """Chat with an agent on a stored session, with its turn limit enforced."""
    from datamachine.conversation.chat import chat_turns_on  # what host.chat runs

    if system is not None and not system.strip():
        raise UsageError("-s/--system: the system prompt is empty.")
    stream = sys.stdout.isatty() and not no_stream
    host = state.host
    limit = _limit_flag(host, max_turns)
    warn_unread_variables(host)
    provider = provider_for_script(provider, script)
    check_declared_options(host, provider, model_options, passthrough=option_passthrough)
    if script is not None:
        read_script(script)  # a bad file is refused before a session is made for it
    if session_id is None:
        session = _new_session(host, limit)
    else:
        session = host.chat_sessions.require_active(host.chat_sessions.resolve(session_id))
        if limit is not None:
            click.echo(f"Warning: --max-turns sets the limit of a new session; session "
                       f"{session.id} keeps its limit ({session.max_turns}).", err=True)
    warn_if_scripted_fallback(host, provider, scripted_on_purpose=script is not None,
                              asked_for_model=model is not None or bool(model_options))
    click.echo(f"Chat session {session.id} (limit: {session.max_turns} turns). "
               "Ctrl-D to quit, Ctrl-C to interrupt.")
    status = "completed"
    while True:
        try:
            text = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
        except (EOFError, click.exceptions.Abort):
            click.echo("\nBye.")
            break
        if not text.strip():
            continue
        streamed: TextEcho | None = None
        try:
            with Progress() as progress, _asking(host, progress, stream) as streamed:
                payload: dict[str, Any] = {"event_sink": progress}
                if model_options:
                    payload["model_options"] = model_options
                if script is not None:
                    payload["script"] = read_script(script)
                # As llm's chat does, the system prompt goes with the first message only.
                messages = [{"role": "user", "content": text}]
                if system is not None:
                    messages.insert(0, {"role": "system", "content": system})
                    system = None
                result = chat_turns_on(host, session.id, messages, None, provider, model,
                                       payload, on_text=streamed)
        except KeyboardInterrupt:
            click.echo("\nInterrupted; finished turns are saved.", err=True)
            raise SystemExit(130) from None
        except SessionAborted as exc:
            click.echo(f"Error: {exc}", err=True)
            status = "aborted"
            break
        current = host.chat_sessions.get(session.id)
        if streamed is not None and streamed.printed:
            streamed.end()
        else:
            click.echo(f"assistant> {result.final_content}")
        click.echo(f"[turns used: {current.turn_count}/{current.max_turns}, "
                   f"this run: {result.turn_count}, status: {result.status}]")
        status = result.status
        if result.status == "aborted":
            click.echo(_stop_line(result))
            break
    raise SystemExit(exit_code_for(status) if status != "completed" else 0)
