"""Agent-to-agent commands: ``datamachine tokens create|revoke|list`` and ``datamachine serve``.

The web stack is imported inside ``serve`` only, so the other commands start as fast as the rest
of the CLI.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, handle_errors

__all__ = ["COMMANDS", "register", "serve", "tokens"]


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group()
def tokens() -> None:
    """Bearer tokens for this site's /chat endpoint (only their hashes are stored)."""


@tokens.command("create")
@click.argument("name")
@click.pass_obj
@handle_errors
def tokens_create(state: State, name: str) -> None:
    """Create a token called NAME and print it, once, on the last line."""
    token = state.host.tokens.create(name)
    click.echo(f"Created API token {name!r}. Copy it now: it is not stored and cannot be shown "
               "again. Callers send it as 'Authorization: Bearer <token>'.")
    # Last line and nothing else on it, so scripts can take it with `tail -n 1`.
    click.echo(token)


@tokens.command("revoke")
@click.argument("name")
@click.pass_obj
@handle_errors
def tokens_revoke(state: State, name: str) -> None:
    """Revoke the active token called NAME; it stops working on the next request."""
    if not state.host.tokens.revoke(name):
        click.echo(f"Error: no active API token is named {name!r} "
                   "(see `datamachine tokens list`).", err=True)
        sys.exit(1)
    click.echo(f"Revoked API token {name!r}.")


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_obj
@handle_errors
def tokens_list(state: State, as_json: bool) -> None:
    """Every token by name, active and revoked (never the tokens themselves)."""
    items = state.host.tokens.list()
    if as_json:
        click.echo(pretty_json([item.model_dump() for item in items]))
        return
    if not items:
        click.echo("No API tokens. Create one with `datamachine tokens create NAME`.")
        return
    rows = [(t.name, "active" if t.active else "revoked", _when(t.created_at),
             _when(t.revoked_at)) for t in items]
    headers = ("name", "status", "created (UTC)", "revoked (UTC)")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@click.command()
@click.option("--host", "bind", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.pass_obj
@handle_errors
def serve(state: State, bind: str, port: int, log_level: str) -> None:
    """Serve POST /chat and GET /health for other agents until interrupted."""
    from datamachine.server.app import serve as run_server
    from datamachine.server.site import ensure_site_id

    host = state.host
    site_id = ensure_site_id(host)
    click.echo(f"datamachine site {site_id}: POST /chat on http://{bind}:{port} "
               "(Ctrl+C to stop)")
    run_server(host, bind=bind, port=port, log_level=log_level)


COMMANDS = [tokens, serve]


def register(cli: click.Group) -> None:
    """Add these commands to the root group."""
    for command in COMMANDS:
        cli.add_command(command)
