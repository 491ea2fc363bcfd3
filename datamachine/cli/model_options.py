"""``-o KEY VALUE``: model options on the command line (``run`` and ``chat``)."""

from __future__ import annotations

from typing import Any

import click

from datamachine.errors import UsageError
from datamachine.providers.options import validate_model_options
from datamachine.setting_spec import read_json

__all__ = ["model_option", "parse_model_options"]


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
