"""A person's answer from the command line: ``datamachine resume SESSION --approve|--decline``
answers a paused run (DESIGN.md 16); ``datamachine resolve SESSION CALL RESULT`` says what a
call in doubt did (DESIGN.md 24)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.output import print_run_summary
from datamachine.cli.provider_notice import read_script
from datamachine.cli.run_cmd import parse_max_turns
from datamachine.errors import UsageError

__all__ = ["resolve", "resume"]


@click.command()
@click.argument("session")
@click.option("--approve/--decline", required=True,
              help="Go on (extend the budget, reset the chat count, run the tool) or stop.")
@click.option("--extend-by", type=int, default=None, callback=parse_max_turns,
              help="With --approve at a spent budget: how much more (default: what the run "
                   "would have added).")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON or YAML script for the scripted provider's resumed run.")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.pass_obj
@handle_errors
def resume(state: State, session: str, approve: bool, extend_by: int | None,
           script: Path | None, as_json: bool) -> None:
    """Answer the paused run SESSION (status awaiting_confirmation; an id or its first
    characters) and continue it with the tools it had (registered tools, by name)."""
    if not approve and extend_by is not None:
        raise UsageError("--extend-by goes with --approve: a decline extends nothing.")
    host = state.host
    session_id = host.transcripts.resolve(session)
    payload: dict[str, Any] = {"script": read_script(script)} if script is not None else {}
    result = host.resume(session_id, approve, extend_by, payload=payload)
    if as_json:
        click.echo(pretty_json(result.model_dump(mode="json")))
    else:
        print_run_summary("Resumed", result, host)
    raise SystemExit(exit_code_for(result.status, result.budget))


@click.command()
@click.argument("session")
@click.argument("call_id")
@click.argument("result")
@click.option("--script", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON or YAML script for the scripted provider's run that goes on.")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.pass_obj
@handle_errors
def resolve(state: State, session: str, call_id: str, result: str, script: Path | None,
            as_json: bool) -> None:
    """Say what the in-doubt call CALL_ID of SESSION did (RESULT: what the tool would have
    returned; a JSON object or list is read as JSON, anything else is text), settle it without
    running it again, and go on like resume."""
    host = state.host
    session_id = host.transcripts.resolve(session)
    payload: dict[str, Any] = {"script": read_script(script)} if script is not None else {}
    answered = host.resolve(session_id, call_id, _result_value(result), payload=payload)
    if as_json:
        click.echo(pretty_json(answered.model_dump(mode="json")))
    else:
        print_run_summary("Resolved", answered, host)
    raise SystemExit(exit_code_for(answered.status, answered.budget))


def _result_value(text: str) -> Any:
    """RESULT as the tool would have returned it: JSON for an object or a list, else text."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise click.BadParameter(f"RESULT looks like JSON but is not: {exc}.",
                                     param_hint="RESULT") from None
    return text
