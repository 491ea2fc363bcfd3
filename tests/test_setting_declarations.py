"""Every setting the product and its plugins read is declared, with the default its code uses;
unknown keys are refused, and a bad stored value never stops a boot."""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import bootstrap
from datamachine import BudgetSpec, InvalidSetting, SettingSpec, hookimpl
from datamachine.errors import DuplicateSettingError, UsageError
from datamachine.host import Host

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [path for base in (ROOT / "datamachine", ROOT / "plugins")
           for path in sorted(base.rglob("*.py"))
           if "tests" not in path.relative_to(base).parts]


def _string_constants(trees: dict[Path, ast.Module]) -> dict[str, set[str]]:
    """Module-level ``NAME = "text"`` assignments of every scanned module, by name."""
    found: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(node.value.value)
    return found


def _reads_a_setting(call: ast.Call) -> bool:
    """``<...>settings.get(KEY, ...)`` or ``<...>lookup(KEY)`` (a bound ``settings.get``)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("get", "effective", "stored"):
        owner = func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return name in ("settings", "_settings")
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name.endswith("lookup")


def setting_keys_read(sources: list[Path] = SOURCES, root: Path = ROOT) -> dict[str, list[str]]:
    """Every setting key the code reads by a literal or a module constant -> where."""
    trees = {path: ast.parse(path.read_text()) for path in sources}
    constants = _string_constants(trees)
    found: dict[str, list[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args and _reads_a_setting(node)):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                keys = {arg.value}
            elif isinstance(arg, ast.Name) and arg.id in constants:
                keys = constants[arg.id]
            else:
                continue  # a computed key (a budget's spec.setting): declared by its budget
            for key in keys:
                found.setdefault(key, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_setting_the_code_reads_is_declared() -> None:
    read = setting_keys_read()
    # The scan itself must see reads of every kind, or it would pass by seeing nothing.
    # (The settings of bounded loops are read through their budgets: computed keys.)
    assert {"default_provider", "confirmation",
            "openai_base_url", "providers", "remote_sites",
            "fetch_allow_private", "mcp_servers", "mcp_call_timeout", "site_id",
            "chat_rate_limit", "spend_limits"} <= set(read)
    with bootstrap.boot(":memory:") as host:  # the installed plugins too
        declared = {spec.name for spec in host.settings.declared()}
    missing = {key: where for key, where in read.items() if key not in declared}
    assert not missing, f"settings read but never declared: {missing}"


def test_the_scan_finds_literal_and_constant_keys_and_skips_other_gets(tmp_path: Path) -> None:
    module = tmp_path / "reader.py"
    module.write_text('KEY = "from_a_constant"\n'
                      'a = host.settings.get("from_a_literal", 3)\n'
                      'b = self._settings_lookup(KEY)\n'
                      'c = payload.get("not_a_setting")\n'
                      'd = host.settings.get(spec.setting)\n')
    assert setting_keys_read([module], tmp_path) == {"from_a_literal": ["reader.py:2"],
                                                     "from_a_constant": ["reader.py:3"]}


def test_declared_defaults_are_what_the_code_uses_when_unset() -> None:
    from datamachine_mcp.servers import DEFAULT_CALL_TIMEOUT

    from datamachine.conversation.provider_turn import (
        DEFAULT_CONNECT_TIMEOUT,
        DEFAULT_REQUEST_TIMEOUT,
    )
    from datamachine.default_plugins.remote_agent import DEFAULT_TIMEOUT_SECONDS
    from datamachine.providers.retry import DEFAULT_MAX_RETRIES
    from datamachine.server.site import DEFAULT_MAX_REQUEST_BYTES
    from datamachine.server.throttle import DEFAULT_CHAT_MAX_CONCURRENT, DEFAULT_CHAT_RATE_LIMIT

    expected = {
        "request_timeout": DEFAULT_REQUEST_TIMEOUT, "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
        "remote_agent_timeout": DEFAULT_TIMEOUT_SECONDS,
        "provider_max_retries": DEFAULT_MAX_RETRIES,
        "max_request_bytes": DEFAULT_MAX_REQUEST_BYTES,
        "chat_rate_limit": DEFAULT_CHAT_RATE_LIMIT,
        "chat_max_concurrent": DEFAULT_CHAT_MAX_CONCURRENT,
        "chat_max_turns": 25, "mcp_call_timeout": DEFAULT_CALL_TIMEOUT,
        "max_turns": 25, "max_tool_calls": 100, "max_chain_depth": 3,
        "default_provider": "scripted", "default_model": "", "confirmation": "ask",
        "budget_pressure": False, "allow_model_requests": True, "fetch_allow_private": False,
        "remote_sites": {}, "site_id": None, "max_run_seconds": None, "chat_tools": None,
        "max_total_tokens": None, "max_cost_usd": None,
    }
    with bootstrap.boot(":memory:") as host:
        defaults = {key: (spec.default if (spec := host.settings.spec(key)) else "undeclared")
                    for key in expected}
    assert defaults == expected


def test_the_run_path_s_defaults_agree_with_the_declarations(host: Host) -> None:
    # What a run actually uses on a fresh host, against what `settings get` would print.
    assert host.default_provider(None) == host.settings.effective("default_provider")
    assert host.default_model(None) == host.settings.effective("default_model")
    assert host.chat_sessions.new_limit() == host.settings.effective("chat_max_turns")
    assert host.budgets.create("conversation_turns").ceiling() == host.settings.effective(
        "max_turns")


class SiteBudget:
    @hookimpl
    def register_budgets(self) -> list[BudgetSpec]:
        return [BudgetSpec(name="sites_visited", default=2, max=5, setting="site_id")]


class MaxTurnsAgain:
    @hookimpl
    def register_settings(self) -> list[SettingSpec]:
        return [SettingSpec(name="max_turns", type="integer")]


def test_a_budget_setting_that_a_declaration_claims_stops_the_boot_naming_both() -> None:
    with pytest.raises(DuplicateSettingError, match=r"'site_id' is declared by 'core' and is "
                                                    r"also the setting of the budget "
                                                    r"'sites_visited' \(registered by '.+'\)"):
        bootstrap.boot(":memory:", plugins=[SiteBudget()], load_entrypoints=False)
    with pytest.raises(DuplicateSettingError, match="'max_turns' is declared by both 'core' and"):
        bootstrap.boot(":memory:", plugins=[MaxTurnsAgain()], load_entrypoints=False)


# -- writing ------------------------------------------------------------------------------------


def test_an_unknown_key_is_refused_naming_the_closest_declared_key(host: Host) -> None:
    with pytest.raises(InvalidSetting, match=r"Unknown setting 'max_trns'; did you mean "
                                             r"'max_turns'\? `datamachine settings list`"):
        host.settings.set("max_trns", 40)
    with pytest.raises(InvalidSetting, match=r"Unknown setting 'zzzz'\. "):
        host.settings.set("zzzz", 1)
    assert host.settings.stored("max_trns") is None


def test_free_form_keys_and_runtime_declarations_are_the_application_s_own(host: Host) -> None:
    host.settings.set("x_theme", {"dark": True})
    assert host.settings.get("x_theme") == {"dark": True}
    host.settings.declare(SettingSpec(name="myapp_limit", type="integer", default=5))
    assert host.settings.owner("myapp_limit") == "app"
    assert host.settings.effective("myapp_limit") == 5
    host.settings.set("myapp_limit", 7)
    with pytest.raises(InvalidSetting, match="must be an integer"):
        host.settings.set("myapp_limit", "seven")
    assert host.settings.problems() == []
    # Declared again, stricter: the stored value is now a problem, named at once.
    host.settings.declare(SettingSpec(name="myapp_limit", type="string"))
    assert [key for key, _ in host.settings.problems()] == ["myapp_limit"]


@pytest.mark.parametrize(("key", "owner"), [
    ("max_turns", "core"),  # a budget's setting
    ("request_timeout", "core"),
    ("remote_agent_timeout", "datamachine.default_plugins.remote_agent"),
])
def test_a_runtime_declaration_of_another_owner_s_setting_is_refused_naming_both(
        host: Host, key: str, owner: str) -> None:
    # Declared again with type "any", max_turns took 99999999, past its budget's check.
    with pytest.raises(DuplicateSettingError, match=rf"'{key}' is declared by both "
                                                    rf"'{re.escape(owner)}' and 'app'"):
        host.settings.declare(SettingSpec(name=key, type="any"))
    with pytest.raises(UsageError):  # InvalidBudgetValue for max_turns
        host.settings.set(key, 99999999 if key == "max_turns" else "soon")
    assert host.settings.owner(key) == owner
    host.settings.declare(SettingSpec(name="myapp_mode", type="string"), owner="myapp")
    host.settings.declare(SettingSpec(name="myapp_mode", type="integer"), owner="myapp")
    with pytest.raises(DuplicateSettingError, match="'myapp' and 'other'"):
        host.settings.declare(SettingSpec(name="myapp_mode"), owner="other")


@pytest.mark.parametrize(("key", "value"), [
    ("request_timeout", float("nan")),
    ("default_model", 3), ("budget_pressure", "yes"), ("site_id", "my site"),
    ("site_id", 1234), ("remote_sites", {"b": {"url": "ftp://x", "token": "t"}}),
    ("allow_model_requests", 0),
])
def test_bad_values_are_refused_saying_what_fits(host: Host, key: str, value: Any) -> None:
    with pytest.raises(InvalidSetting, match=key):
        host.settings.set(key, value)


def test_effective_reads_env_then_stored_then_the_declared_default(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert host.settings.get("max_turns") is None  # the run path's read is unchanged
    assert host.settings.effective("max_turns") == 25
    host.settings.set("max_turns", 40)
    assert host.settings.effective("max_turns") == 40
    monkeypatch.setenv("DATAMACHINE_MAX_TURNS", "30")
    assert host.settings.effective("max_turns") == 30
    assert host.settings.effective("nobody_declares_this") is None
    remote = host.settings.effective("remote_sites")
    remote["mine"] = 1  # a copy: the declaration's default is not changed
    assert host.settings.effective("remote_sites") == {}


def test_environment_text_is_read_by_the_declared_type(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMACHINE_SITE_ID", "1234")
    monkeypatch.setenv("DATAMACHINE_DEFAULT_MODEL", "4o")
    monkeypatch.setenv("DATAMACHINE_MAX_TURNS", "30")
    monkeypatch.setenv("DATAMACHINE_NOBODY_DECLARES_THIS", "[1, 2]")
    assert host.settings.get("site_id") == "1234"
    assert host.settings.get("default_model") == "4o"
    assert host.settings.get("max_turns") == 30
    assert host.settings.get("nobody_declares_this") == [1, 2]
    assert host.settings.problems() == []  # an unknown variable breaks nothing


def test_a_bare_number_is_no_model_id_and_the_problem_names_the_variable(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    # DATAMACHINE_DEFAULT_MODEL=123 was read as the model "123" and `serve` started on it.
    monkeypatch.setenv("DATAMACHINE_DEFAULT_MODEL", "123")
    [(key, why)] = host.settings.problems()
    assert key == "default_model"
    assert "must be a model id such as 'gpt-4o-mini'" in why
    assert "DATAMACHINE_DEFAULT_MODEL" in why
    assert "unset it" in why


# -- listing ------------------------------------------------------------------------------------


def test_entries_list_every_declared_setting_with_source_and_owner(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.settings.set("max_turns", 40)
    monkeypatch.setenv("DATAMACHINE_DEFAULT_MODEL", "from-env")
    rows = {entry.key: entry for entry in host.settings.entries()}
    assert {spec.name for spec in host.settings.declared()} <= set(rows)
    assert (rows["max_turns"].value, rows["max_turns"].default, rows["max_turns"].source,
            rows["max_turns"].owner) == (40, 25, "db", "core")
    assert (rows["default_model"].value, rows["default_model"].source) == ("from-env", "env")
    assert (rows["request_timeout"].value, rows["request_timeout"].source) == (300.0, "default")
    assert rows["remote_sites"].owner == "datamachine.default_plugins.remote_agent"


def test_secrets_are_masked_in_entries_unless_revealed(host: Host) -> None:
    token = "dm_abcdefghijklmnopqrstuvwxyz0123"
    host.settings.set("remote_sites", {"b": {"url": "http://127.0.0.1:1", "token": token}})
    shown = host.settings.entry("remote_sites")
    assert shown.secret
    assert shown.value == {"b": {"url": "http://127.0.0.1:1", "token": "****0123"}}
    assert token not in repr(host.settings.entries())
    assert host.settings.entry("remote_sites", reveal=True).value["b"]["token"] == token


def _store_raw(path: Path, key: str, text: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) VALUES (?, ?, 0)",
                     [key, text])
    conn.close()


def test_undeclared_and_unreadable_stored_values_are_listed_with_their_problem(
        tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    bootstrap.boot(path, load_entrypoints=False).close()
    _store_raw(path, "left_by_a_removed_plugin", '"x"')
    _store_raw(path, "default_model", "{oops")
    with bootstrap.boot(path, load_entrypoints=False) as host:
        rows = {entry.key: entry for entry in host.settings.entries()}
        gone = rows["left_by_a_removed_plugin"]
        assert (gone.declared, gone.value, gone.source, gone.owner) == (False, "x", "db", None)
        assert rows["default_model"].value is None
        assert "not JSON" in str(rows["default_model"].problem)
        assert host.settings.delete("left_by_a_removed_plugin")
        assert host.settings.delete("default_model")


def test_a_secret_s_problem_does_not_show_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    bootstrap.boot(path, load_entrypoints=False).close()
    _store_raw(path, "remote_sites", '{"b": {"url": "ftp://nope", "token": "dm_sekrit_value"}}')
    with bootstrap.boot(path, load_entrypoints=False) as host:
        problem = host.settings.entry("remote_sites").problem
        assert problem is not None
        assert "remote_sites" in problem
        assert "dm_sekrit_value" not in problem
        assert "dm_sekrit_value" not in str(host.settings.problems())


# -- a bad stored value never stops a boot ----------------------------------------------------


@pytest.mark.parametrize("text", ['"my site"', "{oops", "1234"])
def test_a_bad_stored_site_id_does_not_stop_the_boot_and_set_fixes_it(tmp_path: Path,
                                                                      text: str) -> None:
    path = tmp_path / "s.db"
    bootstrap.boot(path, load_entrypoints=False).close()
    _store_raw(path, "site_id", text)
    with bootstrap.boot(path, load_entrypoints=False) as host:
        assert [key for key, _ in host.settings.problems()] == ["site_id"]
        host.settings.set("site_id", "good-id")
        assert host.settings.problems() == []
    with bootstrap.boot(path, load_entrypoints=False) as host:
        assert host.settings.get("site_id") == "good-id"


def test_a_bad_stored_mcp_servers_does_not_stop_the_boot(tmp_path: Path) -> None:
    import datamachine_mcp

    path = tmp_path / "s.db"
    bootstrap.boot(path, load_entrypoints=False).close()
    _store_raw(path, "mcp_servers", '{"t": {"command": []}}')
    with bootstrap.boot(path, plugins=[datamachine_mcp], load_entrypoints=False) as host:
        assert [key for key, _ in host.settings.problems()] == ["mcp_servers"]
        host.settings.set("mcp_servers", {})
