"""``-o KEY VALUE``: model options on the command line (``run`` and ``chat``).

Each value is type-checked when it is parsed (``-o temperature hot`` exits 2). Then, as ``llm``
refuses ``-o temprature 0``, a key the run's provider does not declare (its
``declared_options``) is refused with the closest declared one, exit 2, before anything is sent,
unless ``--option-passthrough`` says the key is meant (a server's own extension such as
``top_k``). A provider that declares nothing takes every key, as before.
"""

from __future__ import annotations

import difflib
from typing import Any

import click

from datamachine.errors import UsageError
from datamachine.providers.options import declared_options, validate_model_options
from datamachine.setting_spec import read_json

__all__ = ["check_declared_options", "model_option", "parse_model_options",
           "passthrough_option"]


def _value(key: str, text: str) -> Any:
    # JSON when it reads as JSON (0.2, 64, true, ["###"], {"type": "json_object"}), else the
    # text itself, so `-o tool_choice required` needs no quotes within quotes. JSON nested too
    # deep is a UsageError, not text.
    try:
        return read_json(text, f"-o {key}")
    except UsageError:
        raise
    except ValueError:
        return text


def parse_model_options(ctx: click.Context, param: click.Parameter,
                        value: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The ``-o`` pairs as checked model options (a bad one exits with code 2, naming it)."""
    try:
        options = {key: _value(key, text) for key, text in value}
        return validate_model_options(options, "-o")
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


model_option = click.option(
    "-o", "--option", "model_options", type=(str, str), multiple=True,
    callback=parse_model_options, metavar="KEY VALUE",
    help="A model option for the provider, repeatable: -o temperature 0.2 -o max_tokens 256 "
         "(VALUE is read as JSON when it is JSON, else as text). Over the model_options "
         "setting.")


passthrough_option = click.option(
    "--option-passthrough", is_flag=True,
    help="Send -o options the provider does not declare as they are (a server's own "
         "extensions, such as top_k or min_p), instead of refusing them.")


def check_declared_options(host: Any, provider: str | None, options: dict[str, Any], *,
                           passthrough: bool) -> None:
    """Refuse (UsageError, exit 2) an ``-o`` key ``provider`` (None: the default provider)
    does not declare, naming the closest declared one and ``--option-passthrough``."""
    if not options or passthrough:
        return
    name = host.default_provider(provider)
    declared = declared_options(host.providers.get(name))
    if declared is None:
        return
    for key in options:
        if key in declared:
            continue
        if not declared:
            default = "" if provider is not None else (
                ", or make one the default: `datamachine settings set default_provider "
                "openai`")
            raise UsageError(
                f"-o {key}: the {name} provider declares no model options (it asks no model, "
                "so none would be used). Name a provider with --provider (`datamachine models` "
                f"lists them){default}; --option-passthrough passes it on anyway.")
        close = difflib.get_close_matches(key, sorted(declared), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(
            f"-o {key}: the {name} provider has no option {key!r}{hint}; its options: "
            f"{', '.join(sorted(declared))}. To send it as it is (a server's own extension), "
            "add --option-passthrough.")
