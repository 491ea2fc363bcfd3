"""``datamachine continue SESSION``: resume a stopped run from the command line."""

from __future__ import annotations

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.output import print_run_summary
from datamachine.cli.run_cmd import parse_max_turns

__all__ = ["continue_"]


@click.command("continue")
@click.argument("session")
@click.option("--extend-by", type=int, default=None, callback=parse_max_turns,
              help="At most this many more turns (default: the conversation_turns budget's "
                   "ceiling).")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.pass_obj
@handle_errors
def continue_(state: State, session: str, extend_by: int | None, as_json: bool) -> None:
    """Resume the stopped (or crash-interrupted) run SESSION (an id, or its first characters
    as `datamachine transcripts list` shows them) with the same provider, model and mode. A
    paused run (status awaiting_confirmation) is approved, as `datamachine resume --approve`
    would."""
    host = state.host
    session_id = host.transcripts.resolve(session)
    if host.transcripts.summary(session_id).status == "awaiting_confirmation":
        result = host.resume(session_id, True, extend_by)
    else:
        more = extend_by if extend_by is not None else host.budgets.create(
            "conversation_turns").ceiling()
        result = host.continue_conversation(session_id, more)
    if as_json:
        click.echo(pretty_json(result.model_dump(mode="json")))
    else:
        print_run_summary("Continued", result, host)
    raise SystemExit(exit_code_for(result.status, result.budget))
