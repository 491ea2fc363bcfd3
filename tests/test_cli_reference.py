"""docs/cli.md must match the command line: a section for every built-in command, naming each of
its arguments and options, and no section for a command that does not exist."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from datamachine.cli import cli

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def builtin_commands(group: click.Group = cli,
                     path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """``("run", command)``, ``("transcripts list", command)``...: the commands datamachine
    itself defines (plugins' commands are documented by their plugins)."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from builtin_commands(command, (*path, name))
        elif command.callback is not None and \
                command.callback.__module__.startswith("datamachine.cli."):
            yield " ".join((*path, name)), command


def documented_sections() -> dict[str, str]:
    parts = re.split(r"^## `datamachine ?([a-z -]*)`\s*$", CLI_DOC.read_text(), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def names_of(command: click.Command) -> list[str]:
    names = []
    for param in command.params:
        if isinstance(param, click.Argument):
            names.append(param.human_readable_name)
        elif isinstance(param, click.Option):
            names.extend([*param.opts, *param.secondary_opts])
    return [name for name in names if name != "--help"]


def test_every_command_has_a_section_naming_each_argument_and_option() -> None:
    sections = documented_sections()
    for path, command in builtin_commands():
        assert path in sections, f"docs/cli.md has no '## `datamachine {path}`' section"
        for name in names_of(command):
            assert f"`{name}" in sections[path], (
                f"docs/cli.md section 'datamachine {path}' does not name {name}")


def test_the_root_options_are_documented() -> None:
    root = documented_sections()[""]
    for name in names_of(cli):
        assert f"`{name}" in root, name


def test_docs_describe_no_command_that_does_not_exist() -> None:
    assert set(documented_sections()) == {""} | {path for path, _ in builtin_commands()}
