"""``datamachine settings``: list, read, describe, write and remove site settings.

Every command works whatever the database holds: a stored value that is not JSON, or one a run
would refuse (a bad ``site_id``), is reported, never fatal, so ``settings set`` can fix it.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

import click

from agents_api.jsontext import compact_json
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json, table
from datamachine.errors import InvalidSetting, UsageError
from datamachine.setting_spec import (
    FREE_FORM_PREFIX,
    hide_url_passwords,
    read_json,
    unknown_setting,
)
from datamachine.settings import SettingEntry

__all__ = ["settings", "unread_variables", "warn_unread_variables"]

_CELL = 60  # widest value shown in the table; `settings get KEY` prints all of it


def _parse_value(raw: str, key: str) -> Any:
    # A key nobody declares (x_...): JSON when it is JSON, else the text itself.
    try:
        return read_json(raw, f"Setting {key!r}")
    except UsageError as exc:  # nested too deep
        raise InvalidSetting(str(exc)) from None
    except ValueError:
        return raw


def _cell(value: Any) -> str:
    # On a terminal a long value is cut (`settings get KEY` prints it whole); piped, every cell
    # is whole, as in every other table.
    text = compact_json(value)
    if len(text) <= _CELL or not sys.stdout.isatty():
        return text
    return text[:_CELL - 3] + "..."


def _clamp_note(state: State, key: str) -> str | None:
    """For a budget's setting whose value is outside the budget's clamp: what runs use."""
    budgets = state.host.budgets
    for name in budgets.registered_names():
        spec = budgets.get_spec(name)
        if spec.setting != key:
            continue
        resolved = budgets.resolve(name)
        if resolved.clamped and resolved.source == "setting":
            return (f"{key} {resolved.requested} is outside the clamp [{spec.min}, {spec.max}] "
                    f"of budget {name!r}: runs use {resolved.ceiling}.")
    return None


def _env_note(state: State, key: str) -> None:
    """Say so when the environment overrides the value just stored or removed."""
    try:
        overridden = state.host.settings.source(key) == "env"
    except InvalidSetting:  # a hand-stored key ("Bad Key") that no variable can name
        return
    if overridden:
        effective = state.host.settings.entry(key)
        click.echo(f"note: DATAMACHINE_{key.upper()} is set and overrides the stored value "
                   f"(in effect: {compact_json(effective.value)}).", err=True)


def _known_entry(state: State, key: str, reveal: bool) -> SettingEntry:
    """The row of ``key`` for ``get`` and ``show``. A key nobody declares and nothing sets (a
    typo: ``max_trns``) is refused naming the closest declared key; a free-form ``x_`` key and
    a stored or environment key nobody declares are shown."""
    host_settings = state.host.settings
    entry: SettingEntry = host_settings.entry(key, reveal=reveal)
    if not entry.declared and entry.source == "default" and not key.startswith(FREE_FORM_PREFIX):
        raise unknown_setting(key, [spec.name for spec in host_settings.declared()])
    return entry


reveal_option = click.option("--reveal", is_flag=True,
                             help="Show secret values (tokens, keys) instead of masking them.")


@click.group()
def settings() -> None:
    """List, read and write site settings (stored as JSON in SQLite; DATAMACHINE_<KEY> in the
    environment overrides one)."""


@settings.command("list")
@click.option("--json", "as_json", is_flag=True, help="Every field of every setting, as JSON.")
@reveal_option
@click.pass_obj
@handle_errors
def settings_list(state: State, as_json: bool, reveal: bool) -> None:
    """Every declared setting with its value, default, source (env, db or default) and owner;
    stored keys nobody declares are listed too. Secrets are masked."""
    entries = state.host.settings.entries(reveal=reveal)
    if as_json:
        emit_json([entry.model_dump() for entry in entries])
    else:
        # The key is what the next command takes (`settings get KEY`): never cut.
        table(["key", "value", "default", "source", "owner"],
              [[e.key, _cell(e.value), _cell(e.default), e.source,
                e.owner if e.declared else "(undeclared)"] for e in entries], whole=("key",))
    problems = [entry for entry in entries if entry.problem]
    if problems:
        click.echo("\nProblems (a run or `datamachine serve` would refuse these):", err=True)
        for entry in problems:
            click.echo(f"  {entry.key}: {entry.problem}", err=True)
    stale = [entry.key for entry in entries if not entry.declared and entry.source == "db"
             and not entry.key.startswith(FREE_FORM_PREFIX)]
    if stale:
        click.echo(f"\nStored but declared by nobody here (a removed plugin?): {', '.join(stale)}"
                   f"; `datamachine settings unset KEY` removes one.", err=True)
    for notice in unread_variables(entries):
        click.echo(f"\n{notice}", err=True)


def unread_variables(entries: list[SettingEntry]) -> list[str]:
    """One notice per ``DATAMACHINE_*`` variable that names no declared setting: a misspelt
    one (``DATAMACHINE_MAX_TRUNS``) is read by nobody, and runs would silently ignore it."""
    declared = [entry.key for entry in entries if entry.declared]
    notices = []
    for entry in entries:
        if not entry.declared and entry.source == "env" \
                and not entry.key.startswith(FREE_FORM_PREFIX):
            close = difflib.get_close_matches(entry.key, declared, n=1, cutoff=0.6)
            hint = f" (did you mean DATAMACHINE_{close[0].upper()}?)" if close else ""
            notices.append(f"DATAMACHINE_{entry.key.upper()} is set, but no setting "
                           f"{entry.key!r} is declared, so nothing reads it{hint}.")
    return notices


def warn_unread_variables(host: Any) -> None:
    """``Warning:`` on stderr for each variable :func:`unread_variables` finds (``run``,
    ``chat``: before the run that would ignore it)."""
    for notice in unread_variables(host.settings.entries()):
        click.echo(f"Warning: {notice}", err=True)


@settings.command("get")
@click.argument("key")
@reveal_option
@click.pass_obj
@handle_errors
def settings_get(state: State, key: str, reveal: bool) -> None:
    """Print the value in effect as JSON: the environment's, else the stored one, else the
    declared default. Secrets are masked unless --reveal."""
    entry = _known_entry(state, key, reveal)
    if entry.problem is not None and entry.value is None and entry.source != "default":
        from datamachine.errors import SiteMisconfigured

        raise SiteMisconfigured(entry.problem, setting=key)
    emit_json(entry.value)
    if entry.problem is not None:
        click.echo(f"warning: {entry.problem}", err=True)


@settings.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True)
@reveal_option
@click.pass_obj
@handle_errors
def settings_show(state: State, key: str, as_json: bool, reveal: bool) -> None:
    """Describe one setting: type, default, value, source, owner and what it does."""
    entry = _known_entry(state, key, reveal)
    if as_json:
        emit_json(entry.model_dump())
        return
    rows = [("key", entry.key), ("type", entry.type), ("default", compact_json(entry.default)),
            ("value", compact_json(entry.value)), ("source", entry.source),
            ("owner", entry.owner if entry.declared else "(undeclared)"),
            ("secret", "yes (masked; --reveal shows it)" if entry.secret and not reveal
             else "yes" if entry.secret else "no"),
            ("description", entry.description or "-"), ("problem", entry.problem or "-")]
    clamp = _clamp_note(state, key)
    if clamp is not None:
        rows.insert(4, ("clamped", clamp))
    for label, text in rows:
        click.echo(f"{label + ':':13}{text}")


@settings.command("set")
@click.argument("key")
@click.argument("value")
@click.pass_obj
@handle_errors
def settings_set(state: State, key: str, value: str) -> None:
    """Store VALUE under KEY, read by the setting's declared type (max_turns 40 is the number
    40, site_id 1234 the text "1234"; lists and objects as JSON). Unknown keys and bad values
    are refused, saying what fits."""
    host_settings = state.host.settings
    spec = host_settings.spec(key)
    if spec is not None and value.strip() == "null" and "null" not in spec.types:
        # Read as text it would store the word "null"; what was meant is "no value".
        raise InvalidSetting(f"Setting {key!r} cannot be null; `datamachine settings unset "
                             f"{key}` removes the stored value (the default applies again).")
    host_settings.set(key, spec.parse_text(value) if spec is not None else _parse_value(value, key))
    stored = host_settings.stored(key)
    shown = hide_url_passwords(spec.masked(stored) if spec is not None else stored)
    click.echo(f"{key} = {compact_json(shown)}")
    _env_note(state, key)
    clamp = _clamp_note(state, key)
    if clamp is not None:
        click.echo(f"note: {clamp}", err=True)


@settings.command("unset")
@click.argument("key")
@click.pass_obj
@handle_errors
def settings_unset(state: State, key: str) -> None:
    """Remove a stored setting, declared or not, whatever it holds (its default applies
    again). A key nobody declares and nothing stores is refused, as `settings get` refuses it."""
    host_settings = state.host.settings
    removed = host_settings.delete(key)
    if not removed and host_settings.spec(key) is None and not key.startswith(FREE_FORM_PREFIX):
        # Nothing stored under a key nobody declares: a typo (`settings unset max_trns`).
        raise unknown_setting(key, [spec.name for spec in host_settings.declared()])
    click.echo(f"{key} {'removed' if removed else 'was not set'}")
    _env_note(state, key)
