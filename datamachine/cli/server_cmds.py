"""Agent-to-agent commands: ``datamachine tokens create|revoke|list`` and ``datamachine serve``.

The web stack is imported inside ``serve`` only, so the other commands start as fast as the rest
of the CLI.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import click

from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json, table
from datamachine.errors import UsageError

__all__ = ["COMMANDS", "register", "serve", "tokens"]


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group()
def tokens() -> None:
    """Bearer tokens for this site's /chat endpoint, and viewer logins to its /ui/ (only their
    hashes are stored)."""


def _tool_list(state: State, raw: str | None) -> list[str] | None:
    """``--tools a,b`` as names, each one a tool registered on this site (else UsageError)."""
    if raw is None:
        return None
    if raw.strip() and any(not part.strip() for part in raw.split(",")):
        # As `run --tools` refuses it: ",," is a slip, not the '' that means no tools.
        raise UsageError(f"--tools {raw!r} has an empty name: give registered tool names "
                         "separated by commas (`datamachine tools` lists them), or '' for none.")
    names = [part.strip() for part in raw.split(",") if part.strip()]
    known = state.host.tools.tools()
    unknown = [name for name in names if name not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise UsageError(f"--tools names tools this site does not have: {', '.join(unknown)} "
                         f"(registered: {listed}).")
    return names


@tokens.command("create")
@click.argument("name")
@click.option("--tools", "tools", metavar="A,B",
              help="The only tools callers with this token may use, comma-separated ('' for "
                   "none). Default: the setting chat_tools (every tool when unset).")
@click.option("--site", "site", metavar="SITE_ID",
              help="The site this token is for: the only X-Datamachine-Caller-Site its "
                   "requests may claim. Without it the token may claim no caller site.")
@click.option("--viewer", is_flag=True,
              help="A login to the run viewer (/ui/ of `datamachine serve`) for a person, "
                   "instead of a /chat token; /chat refuses it. Takes no --tools or --site.")
@click.pass_obj
@handle_errors
def tokens_create(state: State, name: str, tools: str | None, site: str | None,
                  viewer: bool) -> None:
    """Create a token called NAME and print it, once, on the last line."""
    if viewer and (tools is not None or site is not None):
        raise UsageError("--viewer makes a login to /ui/; it takes no --tools or --site "
                         "(those are claims of a /chat token).")
    rotated = not viewer and any(t.name == name and not t.active
                                 for t in state.host.tokens.list())
    token = state.host.tokens.create(name, tools=_tool_list(state, tools), site=site,
                                     scope="viewer" if viewer else "chat")
    if rotated:
        click.echo(f"Note: {name!r} was revoked before; this new token inherits its chat "
                   "sessions and spend windows. Choose a new name for a different caller.")
    how = ("Paste it once into the login page of /ui/ on `datamachine serve`." if viewer else
           "Callers send it as 'Authorization: Bearer <token>'.")
    click.echo(f"Created {'viewer' if viewer else 'API'} token {name!r}. Copy it now: it is not "
               f"stored and cannot be shown again. {how}")
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
    """Every token by name, its scope (chat or viewer), active and revoked (never the tokens
    themselves)."""
    items = state.host.tokens.list()
    if as_json:
        emit_json([item.model_dump() for item in items])
        return
    if not items:
        click.echo("No API tokens. Create one with `datamachine tokens create NAME`.")
        return
    table(["name", "scope", "status", "tools", "site", "created (UTC)", "revoked (UTC)"],
          [[t.name, t.scope, "active" if t.active else "revoked",
            "-" if t.scope == "viewer" else
            "(chat_tools)" if t.tools is None else (",".join(t.tools) or "(none)"),
            t.site or "-", _when(t.created_at), _when(t.revoked_at)] for t in items],
          whole=("name",))


@click.command()
@click.option("--host", "bind", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True,
              help="Port to listen on.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              help="What the server logs to stderr: requests, viewer logins and answers, "
                   "failures.")
@click.option("--ui-open", is_flag=True,
              help="The run viewer (/ui/) without a login: only with a loopback --host.")
@click.pass_obj
@handle_errors
def serve(state: State, bind: str, port: int, log_level: str, ui_open: bool) -> None:
    """Serve POST /chat and GET /health for other agents, and the run viewer at /ui/, until
    interrupted."""
    from datamachine.server.app import serve as run_server
    from datamachine.server.site import check_site, ensure_site_id
    from datamachine.server.ui.session import is_loopback_host

    bind = bind.strip().removeprefix("[").removesuffix("]")  # "[::1]" is the address ::1
    if ui_open and not is_loopback_host(bind):
        raise UsageError(f"--ui-open serves the run viewer without a login, so only on a "
                         f"loopback --host (127.0.0.1, ::1, localhost), not {bind!r}; make a "
                         "viewer token instead: `datamachine tokens create NAME --viewer`.")
    host = state.host
    site_id = ensure_site_id(host)
    check_site(host)  # a misconfigured site says so before claiming to serve
    from datamachine.server.telemetry import export_from_environment

    shutdown, notice = export_from_environment()
    if notice is not None:
        click.echo(notice, err=True)
    base = f"http://{f'[{bind}]' if ':' in bind else bind}:{port}"
    click.echo(f"datamachine site {site_id}: POST /chat on {base} (Ctrl+C to stop)")
    login = ("no login: --ui-open, loopback only" if ui_open else
             "log in with a token from `datamachine tokens create NAME --viewer`")
    click.echo(f"Run viewer: {base}/ui/ ({login})")
    handler = _log_to_stderr(log_level)
    try:
        # At the server's shutdown, the spans still batched are sent.
        run_server(host, bind=bind, port=port, log_level=log_level, on_stop=shutdown,
                   ui_open=ui_open)
    finally:
        for name in _OWN_LOGGERS:
            logging.getLogger(name).removeHandler(handler)


_OWN_LOGGERS = ("datamachine", "agents_api")


class _UvicornStyle(logging.Formatter):
    """``INFO:     message``, as uvicorn prints its own lines."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname + ':':<9} {super().format(record)}"


def _log_to_stderr(level: str) -> logging.Handler:
    """datamachine's own log lines (viewer logins and answers, failures) beside uvicorn's:
    nothing else gives its loggers a handler in a served process. Returns the handler, which
    the caller removes when the server stops."""
    handler = logging.StreamHandler()
    handler.setFormatter(_UvicornStyle("%(message)s"))
    for name in _OWN_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level.upper())
    return handler


COMMANDS = [tokens, serve]


def register(cli: click.Group) -> None:
    """Add these commands to the root group."""
    for command in COMMANDS:
        cli.add_command(command)
