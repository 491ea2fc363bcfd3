"""``datamachine run [PROMPT]``: one conversation from the command line.

The prompt is read as ``llm`` reads it (:mod:`datamachine.cli.prompt_input`): the argument,
piped stdin, or stdin then the argument.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.model_options import model_option
from datamachine.cli.output import print_answer, print_run_summary
from datamachine.cli.progress import Progress, TextEcho
from datamachine.cli.prompt_input import read_prompt
from datamachine.cli.provider_notice import provider_for_script, warn_if_scripted_fallback
from datamachine.errors import InvalidBudgetValue, UsageError
from datamachine.registry import validate_budget_value

__all__ = ["parse_max_turns", "run"]


def parse_max_turns(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Refuse a ceiling that is not a positive integer <= 10,000 (exit code 2)."""
    if value is None:
        return None
    try:
        return validate_budget_value("--max-turns", value)
    except InvalidBudgetValue as exc:
        raise click.BadParameter(str(exc)) from None


def _streamed(host: Any, *args: Any) -> Any:
    """The run, its text printed as it arrives (tool calls noted on stderr)."""
    echo = TextEcho()
    result = None
    for event in host.stream_conversation(*args):
        if event.type == "text_delta" and event.text:
            echo(event.text)
        elif event.type == "tool_call" and event.tool_call is not None:
            echo.end()
            click.echo(f"[tool {event.tool_call['name']}]", err=True)
        elif event.type == "result":
            result = event.result
    echo.end()
    return result


@click.command()
@click.argument("prompt", required=False)
@click.option("-s", "--system", default=None,
              help="A system prompt, sent as the first message.")
@click.option("--mode", default="pipeline", show_default=True,
              help="pipeline, chat, system or an extension mode.")
@click.option("--provider", default=None,
              help="Provider name (default: setting default_provider; `datamachine models` "
                   "lists them).")
@click.option("-m", "--model", default=None, help="Model id (default: setting default_model).")
@click.option("--max-turns", type=int, default=None, callback=parse_max_turns,
              help="Turn ceiling (1 to 10,000; clamped to the conversation_turns budget).")
@click.option("--single-turn", is_flag=True, help="Stop after exactly one provider turn.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON or YAML script for the scripted provider.")
@click.option("--tools", "tool_names", default="",
              help="Comma-separated names of registered tools to offer.")
@model_option
@click.option("--confirmation", type=click.Choice(["ask", "pause"]), default=None,
              help="pause: stop (exit 4) where the run would ask a person, to be answered "
                   "later with `datamachine resume` (default: setting confirmation, else ask).")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option("--no-stream", is_flag=True,
              help="On a terminal, print the answer when it is complete instead of as it "
                   "arrives.")
@click.option("-v", "--verbose", is_flag=True,
              help="With stdout piped (only the answer goes there): write the report (status, "
                   "why it stopped, budgets, transcript id) to stderr.")
@click.pass_obj
@handle_errors
def run(state: State, prompt: str | None, system: str | None, mode: str, provider: str | None,
        model: str | None, max_turns: int | None, single_turn: bool, script: Path | None,
        tool_names: str, model_options: dict[str, Any], confirmation: str | None,
        as_json: bool, no_stream: bool, verbose: bool) -> None:
    """Run one conversation with PROMPT as the user message.

    On a terminal the answer is followed by a report (status, why it stopped, budgets,
    transcript id); piped, stdout gets only the answer (-v: the report on stderr).

    PROMPT may come from stdin instead: '-' reads it, and so does a missing PROMPT when stdin
    is piped (echo hi | datamachine run). Given both, the prompt is stdin, a space, then
    PROMPT (cat notes.txt | datamachine run "Summarize this"), as llm joins them.
    """
    text = read_prompt(prompt)
    if system is not None and not system.strip():
        raise UsageError("-s/--system: the system prompt is empty.")
    host = state.host
    provider = provider_for_script(provider, script)
    warn_if_scripted_fallback(host, provider, scripted_on_purpose=script is not None,
                              asked_for_model=model is not None or bool(model_options))
    tools = []
    for name in [n.strip() for n in tool_names.split(",") if n.strip()]:
        found = host.tools.get(name)
        if found is None:
            known = ", ".join(host.tools.names()) or "none"
            raise UsageError(f"--tools: no registered tool named {name!r} (registered: {known}).")
        tools.append(found)
    payload: dict[str, Any] = {}
    if model_options:
        payload["model_options"] = model_options
    if script is not None:
        payload["script"] = str(script)
    if confirmation is not None:
        payload["confirmation"] = confirmation
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if sys.stdout.isatty() and not as_json and not no_stream:
        result = _streamed(host, messages, tools, provider, model, mode, payload, max_turns,
                           single_turn)
    else:
        with Progress(enabled=None if not as_json else False) as progress:
            payload["event_sink"] = progress
            result = host.run_conversation(messages, tools, provider, model, mode, payload,
                                           max_turns, single_turn)
    if as_json:
        click.echo(pretty_json(result.model_dump(mode="json")))
    elif sys.stdout.isatty():
        print_run_summary("Run", result, host)  # a person reads it: the whole report
    else:
        print_answer(result, host, verbose=verbose)
    raise SystemExit(exit_code_for(result.status))
