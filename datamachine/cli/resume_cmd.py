"""``datamachine resume SESSION --approve|--decline``: answer a paused run (DESIGN.md 16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.output import print_run_summary
from datamachine.cli.provider_notice import read_script
from datamachine.cli.run_cmd import parse_max_turns

__all__ = ["resume"]


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
    host = state.host
    session_id = host.transcripts.resolve(session)
    payload: dict[str, Any] = {"script": read_script(script)} if script is not None else {}
    result = host.resume(session_id, approve, extend_by, payload=payload)
    if as_json:
        click.echo(pretty_json(result.model_dump(mode="json")))
    else:
        print_run_summary("Resumed", result, host)
    raise SystemExit(exit_code_for(result.status, result.budget))
