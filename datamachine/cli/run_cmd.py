"""``datamachine run [PROMPT]``: one conversation from the command line.

The prompt is read as ``llm`` reads it (:mod:`datamachine.cli.prompt_input`): the argument,
piped stdin, or stdin then the argument.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.conversations import continued, find_transcript, started_here
from datamachine.cli.model_options import (
    check_declared_options,
    model_option,
    passthrough_option,
)
from datamachine.cli.output import print_answer, print_run_summary
from datamachine.cli.progress import Progress, TextEcho
from datamachine.cli.prompt_input import read_prompt
from datamachine.cli.provider_notice import (
    provider_for_script,
    read_script,
    warn_if_scripted_fallback,
)
from datamachine.cli.settings_cmd import warn_unread_variables
from datamachine.errors import InvalidBudgetValue, UsageError
from datamachine.registry import validate_budget_value

__all__ = ["check_run_flags", "parse_max_turns", "run"]


def parse_max_turns(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Refuse a ceiling that is not a positive integer <= 10,000 (exit code 2)."""
    if value is None:
        return None
    try:
        flag = max(param.opts, key=len) if param.opts else "--max-turns"  # --extend-by too
        return validate_budget_value(flag, value)
    except InvalidBudgetValue as exc:
        raise click.BadParameter(str(exc)) from None


def parse_budgets(ctx: click.Context, param: click.Parameter,
                  value: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """``--budget NAME CEILING`` pairs as payload ``budget_ceilings`` (each checked against
    its budget when the run starts); a ceiling that is not a whole number is exit code 2."""
    ceilings: dict[str, int] = {}
    for name, text in value:
        try:
            ceilings[name] = int(text)
        except ValueError:
            raise click.BadParameter(f"--budget {name} needs a whole number as its ceiling, "
                                     f"got {text!r}.") from None
        if ceilings[name] < 0:  # said here, in the flag's words, not the payload's
            raise click.BadParameter(f"--budget {name} needs a ceiling of 0 or more (1 or more "
                                     f"but for a repeat counter), got {text}.")
    return ceilings


def _streamed(host: Any, progress: Progress, *args: Any) -> Any:
    """The run, its text printed as it arrives. The progress line (fed by the run's event
    sink as events happen) gives way while text is written and comes back at the next turn;
    each tool call is noted on stderr."""
    echo = TextEcho(on_first=progress.pause)
    result = None
    for event in host.stream_conversation(*args):
        if event.type == "text_delta" and event.text:
            echo(event.text)
        elif event.type == "tool_call" and event.tool_call is not None:
            echo.end()
            progress.pause()
            click.echo(f"[tool {event.tool_call['name']}]", err=True)
            progress.resume()
        elif event.type == "event" and event.event == "turn_started":
            echo.end()
            progress.resume()
        elif event.type == "result":
            result = event.result
    echo.end()
    return result


@click.command()
@click.argument("prompt", required=False)
@click.option("-s", "--system", default=None,
              help="A system prompt, sent as the first message.")
@click.option("--mode", default=None,
              help="pipeline (default), chat, system or an extension mode (a continued run: "
                   "the mode it recorded).")
@click.option("--provider", default=None,
              help="Provider name (default: setting default_provider; `datamachine models` "
                   "lists them).")
@click.option("-m", "--model", default=None, help="Model id (default: setting default_model).")
@click.option("--max-turns", type=int, default=None, callback=parse_max_turns,
              help="Turn ceiling (1 to 10,000; clamped to the conversation_turns budget).")
@click.option("-b", "--budget", "budgets", type=(str, str), multiple=True,
              callback=parse_budgets, metavar="NAME CEILING",
              help="The ceiling of a budget for this run, e.g. -b provider_retries 0 or "
                   "-b tool_calls 20 (repeatable; `datamachine budgets list` names them).")
@click.option("--single-turn", is_flag=True, help="Stop after exactly one provider turn.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON or YAML script for the scripted provider.")
@click.option("--tools", "tool_names", default=None,
              help="Comma-separated names of registered tools to offer.")
@model_option
@passthrough_option
@click.option("--confirmation", type=click.Choice(["ask", "pause"]), default=None,
              help="pause: stop (exit 4) where the run would ask a person, to be answered "
                   "later with `datamachine resume` (default: setting confirmation, else ask).")
@click.option("-c", "--continue", "continue_", is_flag=True,
              help="Continue the conversation of the most recent `run` started here, with its "
                   "provider and model unless given.")
@click.option("--cid", default=None, metavar="ID",
              help="Continue the transcript ID (or a unique prefix of it).")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option("--no-stream", is_flag=True,
              help="On a terminal, print the answer when it is complete instead of as it "
                   "arrives.")
@click.option("-v", "--verbose", is_flag=True,
              help="With stdout piped (only the answer goes there): write the report (status, "
                   "why it stopped, budgets, transcript id) to stderr.")
@click.pass_obj
@handle_errors
def run(state: State, prompt: str | None, system: str | None, mode: str | None,
        provider: str | None, model: str | None, max_turns: int | None,
        budgets: dict[str, int], single_turn: bool,
        script: Path | None, tool_names: str | None, model_options: dict[str, Any],
        option_passthrough: bool, confirmation: str | None, continue_: bool, cid: str | None,
        as_json: bool, no_stream: bool, verbose: bool) -> None:
    """Run one conversation with PROMPT as the user message.

    On a terminal the answer is followed by a report (status, why it stopped, budgets,
    transcript id); piped, stdout gets only the answer (-v: the report on stderr).

    PROMPT may come from stdin instead: '-' reads it, and so does a missing PROMPT when stdin
    is piped (echo hi | datamachine run). Given both, the prompt is stdin, a space, then
    PROMPT (cat notes.txt | datamachine run "Summarize this"), as llm joins them.
    -c continues the conversation of the most recent run started here, --cid ID a given one.
    """
    check_run_flags(system=system, single_turn=single_turn, max_turns=max_turns,
                    continuing=continue_ or cid is not None, tool_names=tool_names)
    text = read_prompt(prompt)
    host = state.host
    warn_unread_variables(host)
    payload: dict[str, Any] = {}
    if model_options:
        payload["model_options"] = model_options
    if budgets:
        payload["budget_ceilings"] = budgets
    if script is not None:
        payload["script"] = read_script(script)
    if confirmation is not None:
        payload["confirmation"] = confirmation
    ask = _Ask(host=host, tools=_tools(host, tool_names), provider=provider, model=model,
               mode=mode, payload=payload, max_turns=max_turns, single_turn=single_turn,
               script=script, passthrough=option_passthrough,
               stream=sys.stdout.isatty() and not as_json and not no_stream, quiet=as_json)
    target = find_transcript(host, cid) if continue_ or cid is not None else None
    if target is not None:
        result = _continue_run(ask, target, text)
    else:
        if continue_:
            click.echo("Note: no conversation started by `datamachine run` to continue; this "
                       "one starts a new one.", err=True)
        messages = [started_here({"role": "user", "content": text})]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        ask.provider = provider_for_script(provider, script)
        check_declared_options(host, ask.provider, model_options, passthrough=option_passthrough)
        warn_if_scripted_fallback(host, ask.provider, scripted_on_purpose=script is not None,
                                  asked_for_model=model is not None or bool(model_options))
        result = ask.run(messages)
    if as_json:
        click.echo(pretty_json(result.model_dump(mode="json")))
    elif sys.stdout.isatty():
        print_run_summary("Run", result, host)  # a person reads it: the whole report
    else:
        print_answer(result, host, verbose=verbose)
    raise SystemExit(exit_code_for(result.status, result.budget))


@dataclass
class _Ask:
    """What one ``run`` asks for, its provider, model and mode still to be settled when it
    continues a transcript."""

    host: Any
    tools: list[Any]
    provider: str | None
    model: str | None
    mode: Any
    payload: dict[str, Any]
    max_turns: int | None
    single_turn: bool
    script: Path | None
    passthrough: bool
    stream: bool  # print text as it arrives (a terminal, not --json or --no-stream)
    quiet: bool  # --json: no progress line either

    def run(self, messages: list[dict[str, Any]]) -> Any:
        """The run: streamed, else run whole; either way with the progress line on stderr
        when stderr is a terminal (never with --json)."""
        arguments = (messages, self.tools, self.provider, self.model, self.mode or "pipeline",
                     self.payload, self.max_turns, self.single_turn)
        # The events carry the turn budget; the tool budget's ceiling is read here.
        ceilings = {"tool_calls": self.host.budgets.create("tool_calls").ceiling()}
        with Progress(enabled=False if self.quiet else None, ceilings=ceilings) as progress:
            # Called as each event happens (a streamed run's own items can wait behind a
            # provider call that holds its event loop).
            self.payload["event_sink"] = progress
            if self.stream:
                return _streamed(self.host, progress, *arguments)
            return self.host.run_conversation(*arguments)


def _continue_run(ask: _Ask, session_id: str, text: str) -> Any:
    """``text`` added to the stored transcript ``session_id`` (read under its lock), with the
    provider, model and mode it recorded unless given."""
    host = ask.host
    with continued(host, session_id) as start:
        ask.provider = provider_for_script(ask.provider or start.provider, ask.script)
        check_declared_options(host, ask.provider, ask.payload.get("model_options", {}),
                               passthrough=ask.passthrough)
        if ask.model is None:
            ask.model = start.model
        if ask.mode is None and start.mode:
            ask.mode = start.mode.split(",") if "," in start.mode else start.mode
        ask.payload.update(transcript_session_id=start.session_id, transcript_lock=start.lock)
        return ask.run([*start.messages, {"role": "user", "content": text}])


def check_run_flags(*, system: str | None, single_turn: bool, max_turns: int | None,
                    continuing: bool, tool_names: str | None = None) -> None:
    """Flags that contradict each other or say nothing: a usage error (exit 2) before anything
    runs."""
    if system is not None and not system.strip():
        raise UsageError("-s/--system: the system prompt is empty.")
    if single_turn and max_turns is not None:
        raise UsageError("--single-turn stops after one provider turn and --max-turns "
                         f"{max_turns} sets a turn ceiling: give one of them.")
    if tool_names is not None and tool_names.strip() and any(
            not name.strip() for name in tool_names.split(",")):
        raise UsageError(f"--tools {tool_names!r} has an empty name: give registered tool "
                         "names separated by commas, such as --tools fetch_url,write_note "
                         "(`datamachine tools` lists them), or leave --tools out.")
    if system is not None and continuing:
        raise UsageError("-s/--system starts a conversation; a continued one (-c, --cid) keeps "
                         "the system prompt it started with. Leave -s out, or start a new "
                         "conversation.")


def _tools(host: Any, tool_names: str | None) -> list[Any]:
    """The registered tools ``--tools A,B`` names."""
    tools = []
    for name in [n.strip() for n in (tool_names or "").split(",") if n.strip()]:
        found = host.tools.get(name)
        if found is None:
            known = ", ".join(host.tools.names()) or "none"
            raise UsageError(f"--tools: no registered tool named {name!r} (registered: {known}).")
        tools.append(found)
    return tools
