"""``datamachine models``: the providers a run can name, where each comes from, and the default.

Lists every provider of the host: those plugins register (``scripted`` and ``openai`` built in,
``anthropic`` with its plugin) and the named endpoints of the ``providers`` setting, each with
its base URL, the variable its API key is read from and whether that variable is set (a key is
never printed), the model's context window an endpoint declares, and whether it can be used
now. Nothing goes over the network unless
``--remote`` asks the OpenAI-compatible ones for their models (``GET {base_url}/models``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json
from datamachine.cli.tables import table
from datamachine.errors import DataMachineError
from datamachine.providers.endpoints import PROVIDERS_SETTING, parse_endpoints
from datamachine.providers.options import declared_options
from datamachine.setting_spec import hide_url_password, hide_url_passwords

__all__ = ["ProviderListing", "models"]

# How long ``--remote`` waits for one server's model list (seconds).
REMOTE_TIMEOUT = 10.0


@dataclass
class ProviderListing:
    """One provider as ``datamachine models`` shows it.

    ``source`` is ``"plugin"`` (registered by ``plugin``) or ``"setting"`` (an endpoint of the
    ``providers`` setting, of ``type``); ``api_key_set`` says whether ``api_key_env`` is set
    (None: the provider reads no key); ``available`` is True or the reason it cannot be used;
    ``models`` is what ``--remote`` listed (None: not asked) and ``error`` why it could not;
    ``options`` are the model options it declares (None: not declared, every key is taken).
    """

    name: str
    source: str
    plugin: str | None = None
    type: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_set: bool | None = None
    available: bool | str = True
    default: bool = False
    models: list[str] | None = None
    error: str | None = None
    options: list[str] | None = None
    # The model's context window in tokens (DESIGN.md 21) an endpoint declares, "auto" when
    # its server is asked (``--remote`` asks it now), None when unknown.
    context_window: int | str | None = None


@dataclass
class ModelsListing:
    """The whole answer of ``datamachine models --json``."""

    default_provider: str
    default_provider_from: str
    default_model: str
    default_model_from: str
    providers: list[ProviderListing] = field(default_factory=list)
    keys: dict[str, bool] = field(default_factory=dict)
    # The setting context_windows: model name or pattern -> tokens.
    context_windows: dict[str, int] = field(default_factory=dict)


def _source(settings: Any, key: str) -> str:
    where = settings.source(key)
    if where == "env":
        return f"environment DATAMACHINE_{key.upper()}"
    return "setting" if where == "db" else "default"


def _endpoints(host: Any) -> dict[str, Any]:
    value = host.settings.get(PROVIDERS_SETTING)
    if not value:
        return {}
    try:
        return dict(parse_endpoints(value))
    except DataMachineError as exc:
        click.echo(f"Warning: {exc}", err=True)
        return {}


def _context_windows(host: Any) -> dict[str, int]:
    from datamachine.context.window import parse_context_windows

    try:
        return parse_context_windows(host.settings.get("context_windows"))
    except DataMachineError as exc:
        click.echo(f"Warning: {exc}", err=True)
        return {}


def _listing(host: Any, name: str, endpoints: dict[str, Any], default: str) -> ProviderListing:
    registry = host.providers
    endpoint = endpoints.get(name)
    row = ProviderListing(name=name, source="setting" if endpoint is not None else "plugin",
                          plugin=registry.owner(name) if endpoint is None else None,
                          type=endpoint.type if endpoint is not None else None,
                          default=name == default,
                          context_window=(endpoint.context_window if endpoint is not None
                                          else None))
    try:
        provider = registry.get(name)
        row.available = registry.availability(name)
    except DataMachineError as exc:  # an endpoint of a type no plugin offers
        row.available = str(exc)
        return row
    declared = declared_options(provider)
    row.options = sorted(declared) if declared is not None else None
    resolve = getattr(provider, "resolved_base_url", None)
    row.base_url = resolve() if callable(resolve) else None
    variable = getattr(provider, "api_key_env", None)
    if isinstance(variable, str) and variable:
        row.api_key_env = variable
        row.api_key_set = bool(os.environ.get(variable, "").strip())
    return row


def _remote_models(provider: Any, base_url: str) -> list[str]:
    import httpx

    key = provider.resolved_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=REMOTE_TIMEOUT)
    answer.raise_for_status()
    data = answer.json().get("data")
    if not isinstance(data, list):
        raise ValueError("the answer has no 'data' list")
    return sorted(str(item["id"]) for item in data if isinstance(item, dict) and "id" in item)


def _ask_remote(host: Any, row: ProviderListing) -> None:
    from datamachine.providers.openai import OpenAIProvider

    if row.base_url is None or row.available is not True:
        return
    provider = host.providers.get(row.name)
    if not isinstance(provider, OpenAIProvider):
        row.error = "only OpenAI-compatible providers list their models"
        return
    try:
        row.models = _remote_models(provider, row.base_url)
    except Exception as exc:  # any failure is this one server's, reported on its row
        row.error = f"{type(exc).__name__}: {exc}"
    if row.context_window == "auto":  # llama.cpp's /props says it
        reported = provider.reported_context_window(host.default_model(None) or "")
        row.context_window = reported if reported is not None else "auto (not reported)"


def _describe(row: ProviderListing) -> list[str]:
    if row.source == "setting":
        origin = f"setting ({row.type})"
    elif (row.plugin or "").startswith("datamachine.default_plugins."):
        origin = "built in"
    else:
        origin = f"plugin {row.plugin}" if row.plugin else "-"
    if row.api_key_env is None:
        key = "-"
    else:
        key = f"{row.api_key_env} ({'set' if row.api_key_set else 'not set'})"
    usable = "yes" if row.available is True else f"no: {row.available}"
    shown_url = hide_url_password(row.base_url) if row.base_url else "-"
    window = (f"{row.context_window:,}" if isinstance(row.context_window, int)
              else row.context_window or "-")
    return [row.name + (" *" if row.default else ""), origin, shown_url, key, window, usable]


@click.command()
@click.option("--remote", is_flag=True,
              help="Also ask each usable OpenAI-compatible provider for its models "
                   "(GET {base_url}/models; a network request per provider).")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
@click.pass_obj
@handle_errors
def models(state: State, remote: bool, as_json: bool) -> None:
    """Providers a run can name (--provider), where each comes from, its base URL, whether its
    API key's variable is set (keys are never shown), and the default provider and model."""
    host = state.host
    endpoints = _endpoints(host)
    default = host.default_provider(None)
    listing = ModelsListing(
        default_provider=default, default_provider_from=_source(host.settings,
                                                                "default_provider"),
        default_model=host.default_model(None) or "",
        default_model_from=_source(host.settings, "default_model"),
        context_windows=_context_windows(host))
    for name in host.providers.names():
        row = _listing(host, name, endpoints, default)
        if remote:
            _ask_remote(host, row)
        listing.providers.append(row)
        if row.api_key_env is not None:
            listing.keys[row.api_key_env] = bool(row.api_key_set)
    if as_json:
        emit_json(hide_url_passwords(asdict(listing)))
        return
    click.echo(f"default provider: {listing.default_provider} "
               f"({listing.default_provider_from}); default model: "
               f"{listing.default_model or '(none)'} ({listing.default_model_from})")
    table(["provider", "from", "base URL", "API key", "window", "usable"],
          [_describe(row) for row in listing.providers],
          whole=("provider", "base URL"), clip=("usable",))
    if listing.context_windows:
        click.echo("context windows by model: " + ", ".join(
            f"{pattern}: {tokens:,}" for pattern, tokens in listing.context_windows.items()))
    for row in listing.providers:
        if row.models is not None:
            click.echo(f"{row.name} models: {', '.join(row.models) or '(none)'}")
        elif row.error is not None:
            click.echo(f"{row.name} models: not listed ({row.error})")
    click.echo("* the default. Choose with --provider NAME -m MODEL, or set default_provider "
               "and default_model; add endpoints with the 'providers' setting "
               "(`datamachine docs providers`).")
