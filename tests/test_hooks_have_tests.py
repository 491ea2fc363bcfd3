"""Every hook has a test that implements it, and the two that had none get theirs here.

The meta test reads ``datamachine/hookspecs.py`` and looks, in the test suite, for a hookimpl of
each hook: a ``def <hook>(`` in a test module or a test plugin under ``tests/``. A hook name in
a list (``test_boot`` checks every spec exists) or in the docs meta-tests does not count: only
code that implements the hook shows that some test exercised it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import bootstrap
from datamachine import SettingSpec, Tool, hookimpl, tool
from datamachine.cli import app as cli_app
from datamachine.plugins import make_plugin_manager
from tests.test_docs_reference import hookspec_functions

TESTS = Path(__file__).resolve().parent
# Tests about the docs mention every hook by construction; they prove nothing here.
DOC_META_TESTS = {"test_docs_examples.py", "test_docs_reference.py", "test_api_reference.py"}


def implemented_hooks() -> dict[str, list[str]]:
    """hook name -> the test files under tests/ that define a hookimpl for it."""
    found: dict[str, list[str]] = {}
    sources = {path: path.read_text() for path in sorted(TESTS.rglob("*.py"))
               if path.name not in DOC_META_TESTS}
    for name in hookspec_functions():
        pattern = re.compile(rf"^\s*(?:async\s+)?def {name}\(", re.MULTILINE)
        found[name] = [str(path.relative_to(TESTS)) for path, text in sources.items()
                       if pattern.search(text)]
    return found


def test_every_hook_has_a_test_that_implements_it() -> None:
    missing = sorted(name for name, files in implemented_hooks().items() if not files)
    assert not missing, (
        f"no test under tests/ implements these hooks: {', '.join(missing)}. Write a test with "
        "a plugin that implements each one and asserts on what it changes."
    )


def test_the_check_sees_hookimpls_and_ignores_mere_mentions() -> None:
    found = implemented_hooks()
    assert "test_hooks_have_tests.py" in found["register_commands"]
    # test_boot lists every hook name to check the specs exist; that is not a test of a hook.
    assert "test_boot.py" not in found["on_loop_event"]


# -- register_commands ------------------------------------------------------------------------


class Greeter:
    """A plugin that adds a ``greet`` command to the datamachine CLI."""

    @hookimpl
    def register_commands(self, cli: click.Group) -> None:
        @cli.command()
        @click.argument("name")
        @click.option("--shout", is_flag=True, help="Greet loudly.")
        def greet(name: str, shout: bool) -> None:
            """Greet NAME."""
            text = f"Hello, {name}!"
            click.echo(text.upper() if shout else text)


@pytest.fixture
def plugin_cli(monkeypatch: pytest.MonkeyPatch) -> click.Group:
    """The real root group, with its command table restored after the test.

    ``load_plugin_commands`` loads installed plugins once per process; here it builds its
    plugin manager with the Greeter registered instead of reading entry points.
    """
    cli = cli_app.cli
    monkeypatch.setattr(cli, "commands", dict(cli.commands))
    monkeypatch.setattr(cli_app, "_plugin_commands_loaded", False)

    def manager(*args: Any, **kwargs: Any) -> Any:
        return make_plugin_manager([Greeter()], load_entrypoints=False, environ={})

    monkeypatch.setattr("datamachine.plugins.make_plugin_manager", manager)
    return cli


def test_register_commands_adds_a_working_command_to_the_cli(plugin_cli: click.Group) -> None:
    assert "greet" not in plugin_cli.commands
    cli_app.load_plugin_commands()
    assert "greet" in plugin_cli.commands

    runner = CliRunner()
    result = runner.invoke(plugin_cli, ["greet", "Ada", "--shout"])
    assert (result.exit_code, result.output) == (0, "HELLO, ADA!\n")
    listing = runner.invoke(plugin_cli, ["--help"])
    assert "Greet NAME." in listing.output


def test_plugin_commands_are_added_once_per_process(plugin_cli: click.Group) -> None:
    cli_app.load_plugin_commands()
    first = plugin_cli.commands["greet"]
    cli_app.load_plugin_commands()
    assert plugin_cli.commands["greet"] is first


# -- register_tools ---------------------------------------------------------------------------


@tool
def roll_die(sides: int) -> int:
    """Roll a die.

    Args:
        sides: How many sides the die has.
    """
    return sides  # a loaded die keeps the test deterministic


class Dice:
    @hookimpl
    def register_tools(self) -> list[Tool]:
        return [roll_die]


class RollsOnce:
    """A scripted model: roll a d6 on the first turn, then report."""

    @hookimpl
    def text_result(self, request: Any) -> dict[str, Any]:
        if request.turn == 1:
            return {"tool_calls": [{"name": "roll_die", "parameters": {"sides": 6}}]}
        return {"content": "You rolled a 6."}


def test_register_tools_puts_the_tool_in_host_tools_ready_for_a_run() -> None:
    with bootstrap.boot(db_path=":memory:", plugins=[Dice(), RollsOnce()],
                        load_entrypoints=False) as host:
        registered = host.tools.get("roll_die")
        assert registered is not None
        assert host.tools.owner("roll_die") == registered.plugin
        assert registered.plugin in host.plugins

        result = host.run_conversation([{"role": "user", "content": "Roll a d6."}],
                                       [registered], "scripted", "test")
        assert result.status == "completed"
        assert [(r["tool_name"], r["result"]["result"]) for r in result.tool_execution_results] \
            == [("roll_die", 6)]
        assert result.final_content == "You rolled a 6."


# -- host_started / host_closing ----------------------------------------------------------------


class Lifecycle:
    """Adds a tool built from a setting once the host exists; records its closing."""

    def __init__(self) -> None:
        self.closed: list[Any] = []

    @hookimpl
    def host_started(self, host: Any) -> None:
        greeting = host.settings.get("greeting", "hello")

        @tool(name="greet")
        def greet() -> str:
            """Greet."""
            return str(greeting)

        host.tools.register(greet, plugin="lifecycle")

    @hookimpl
    def host_closing(self, host: Any) -> None:
        self.closed.append(host)


class BrokenCloser:
    @hookimpl
    def host_closing(self, host: Any) -> None:
        raise RuntimeError("cannot close")


def test_host_started_sees_settings_and_host_closing_runs_once_even_past_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATAMACHINE_GREETING", '"hi"')
    plugin = Lifecycle()
    host = bootstrap.boot(":memory:", plugins=[BrokenCloser(), plugin], load_entrypoints=False)
    greet = host.tools.get("greet")
    assert greet is not None
    assert greet.plugin == "lifecycle"
    result = host.run_conversation([{"role": "user", "content": "x"}], [greet], "scripted", "m",
                                   payload={"script": [
                                       {"tool_calls": [{"name": "greet", "parameters": {}}]},
                                       {"content": "done"}]})
    assert result.tool_execution_results[0]["result"]["result"] == "hi"
    host.close()
    host.close()
    assert plugin.closed == [host]


class FailsToStart:
    @hookimpl
    def host_started(self, host: Any) -> None:
        raise RuntimeError("no server")


def test_a_host_started_failure_fails_the_boot_and_closes_what_started() -> None:
    plugin = Lifecycle()
    with pytest.raises(RuntimeError, match="no server"):
        bootstrap.boot(":memory:", plugins=[plugin, FailsToStart()], load_entrypoints=False)
    assert len(plugin.closed) == 1


# -- register_settings ----------------------------------------------------------------------------


def _shade_rule(key: str, value: Any) -> None:
    if value not in ("light", "dark"):
        raise ValueError(f"must be 'light' or 'dark', got {value!r}")


class DeclaresShade:
    @hookimpl
    def register_settings(self) -> list[SettingSpec]:
        return [SettingSpec(name="shade", type="string", default="light", validator=_shade_rule,
                            description="The colour scheme."),
                SettingSpec(name="shade_key", type="string", secret=True)]


class AlsoDeclaresShade:
    @hookimpl
    def register_settings(self) -> list[SettingSpec]:
        return [SettingSpec(name="shade", type="string")]


def test_register_settings_declares_a_plugin_s_settings_with_default_check_and_owner() -> None:
    from datamachine.errors import InvalidSetting

    with bootstrap.boot(":memory:", plugins=[DeclaresShade()], load_entrypoints=False) as host:
        plugin = host.settings.owner("shade")
        assert plugin is not None
        assert plugin != "core"
        assert host.settings.get("shade") is None  # get() keeps the caller's default
        assert host.settings.effective("shade") == "light"
        with pytest.raises(InvalidSetting, match="Setting 'shade': must be 'light' or 'dark'"):
            host.settings.set("shade", "green")
        # A secret setting's refusal never repeats the value: it may be the secret.
        with pytest.raises(InvalidSetting, match=r"'shade_key' must be a string, got an integer "
                                                 r"\(not shown: it may hold a secret\)"):
            host.settings.set("shade_key", 3)
        host.settings.set("shade", "dark")
        host.settings.set("shade_key", "sk-0123456789abcdef")
        rows = {entry.key: entry for entry in host.settings.entries()}
        assert (rows["shade"].value, rows["shade"].default, rows["shade"].source) == (
            "dark", "light", "db")
        assert rows["shade_key"].value == "****cdef"
        assert rows["shade_key"].owner == plugin


def test_two_plugins_declaring_one_setting_stop_the_boot_naming_both() -> None:
    from datamachine.errors import DuplicateSettingError

    with pytest.raises(DuplicateSettingError, match=r"'shade' is declared by both '.+' and '.+'"):
        bootstrap.boot(":memory:", plugins=[DeclaresShade(), AlsoDeclaresShade()],
                       load_entrypoints=False)


# -- validate_setting (the older way) -------------------------------------------------------------


class OwnsColour:
    @hookimpl
    def validate_setting(self, key: str, value: Any) -> None:
        if key == "x_colour" and value not in ("red", "blue"):
            raise ValueError(f"must be 'red' or 'blue', got {value!r}")


def test_validate_setting_refuses_a_plugin_s_own_key_and_ignores_others() -> None:
    from datamachine.errors import InvalidSetting

    with bootstrap.boot(":memory:", plugins=[OwnsColour()], load_entrypoints=False) as host:
        host.settings.set("x_colour", "red")
        with pytest.raises(InvalidSetting, match="Setting 'x_colour': must be 'red' or 'blue'"):
            host.settings.set("x_colour", "green")
        assert host.settings.get("x_colour") == "red"
        host.settings.set("x_shade", "green")  # not its key
        # A key must still be declared (or free-form, x_...) to be written at all.
        with pytest.raises(InvalidSetting, match="Unknown setting 'colour'"):
            host.settings.set("colour", "red")
