"""bootstrap.boot(): isolated hosts, plugin loading, budget collection and boot errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pluggy
import pytest

import bootstrap
from datamachine import (
    DuplicateBudgetError,
    InvalidBudgetSpec,
    PluginLoadError,
    PluginLoadWarning,
    hookimpl,
)
from datamachine.api import get_default_host, reset_default_host
from datamachine.plugins import collect, first_result, fold_value, make_plugin_manager
from tests.plugins import (
    bad_budget_spec,
    claims_builtin,
    misspelled_hook,
    retry_budget,
    retry_budget_again,
)


def test_plugin_budget_resolves_through_setting_and_clamp() -> None:
    with bootstrap.boot(":memory:", plugins=[retry_budget], load_entrypoints=False) as host:
        assert host.budgets.owner("retries") == "tests.plugins.retry_budget"
        assert host.budgets.create("retries").ceiling() == 3
        host.settings.set("max_retries", 6)
        assert host.budgets.create("retries").ceiling() == 6
        host.settings.set("max_retries", 50)
        warnings: list[str] = []
        budget = host.budgets.create("retries", warnings=warnings)
        assert (budget.ceiling(), budget.hard_ceiling()) == (8, 8)
        assert "requested ceiling 50" in warnings[0]


def test_two_hosts_share_nothing() -> None:
    first = bootstrap.boot(":memory:", plugins=[retry_budget], load_entrypoints=False)
    second = bootstrap.boot(":memory:", load_entrypoints=False)
    try:
        first.settings.set("max_turns", 9)
        first.budgets.register("only_here", {"default": 2, "min": 1, "max": 3})
        assert second.settings.get("max_turns") is None
        assert not second.budgets.is_registered("only_here")
        assert not second.budgets.is_registered("retries")
        assert first.pm is not second.pm
    finally:
        first.close()
        second.close()


def test_duplicate_budget_between_two_plugins_names_both() -> None:
    with pytest.raises(DuplicateBudgetError) as caught:
        bootstrap.boot(":memory:", plugins=[retry_budget, retry_budget_again],
                       load_entrypoints=False)
    message = str(caught.value)
    assert "'tests.plugins.retry_budget'" in message
    assert "'tests.plugins.retry_budget_again'" in message


def test_plugin_claiming_a_builtin_budget_names_bootstrap_and_the_plugin() -> None:
    expected = r"'bootstrap' and 'tests\.plugins\.claims_builtin'"
    with pytest.raises(DuplicateBudgetError, match=expected):
        bootstrap.boot(":memory:", plugins=[claims_builtin], load_entrypoints=False)


def test_misspelled_hookimpl_fails_at_boot() -> None:
    with pytest.raises(PluginLoadError, match="register_budget"):
        bootstrap.boot(":memory:", plugins=[misspelled_hook], load_entrypoints=False)


def test_invalid_plugin_budget_spec_names_plugin_and_field() -> None:
    with pytest.raises(InvalidBudgetSpec, match=r"bad_budget_spec.*default=50 must not be above"):
        bootstrap.boot(":memory:", plugins=[bad_budget_spec], load_entrypoints=False)


def test_installed_first_party_plugin_loads_through_its_entry_point() -> None:
    with bootstrap.boot(":memory:") as host:
        assert "fetch" in host.plugins
        info = host.plugins["fetch"]
        assert (info.distribution, info.source) == ("datamachine-fetch", "entrypoint")
        assert host.budgets.owner("http_fetches") == "fetch"
        host.settings.set("max_http_fetches", 4)
        assert host.budgets.create("http_fetches").ceiling() == 4


def test_load_plugins_env_limits_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "")
    with bootstrap.boot(":memory:") as host:
        assert "fetch" not in host.plugins
        assert not host.budgets.is_registered("http_fetches")
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "datamachine-fetch, some-other-dist")
    with pytest.warns(PluginLoadWarning, match="'some-other-dist', which no installed plugin"):
        host = bootstrap.boot(":memory:")
    with host:
        assert host.budgets.is_registered("http_fetches")
        assert "example" not in host.plugins


def test_trace_hooks_env_writes_hook_calls_to_stderr(tmp_path: Path) -> None:
    script = (
        "import bootstrap\n"
        "host = bootstrap.boot(':memory:')\n"
        "host.pm.hook.on_loop_event(event='turn_started', payload={})\n"
    )
    env = {"DATAMACHINE_TRACE_HOOKS": "1", "PATH": "/usr/bin:/bin",
           "DATAMACHINE_DB": str(tmp_path / "t.db")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parent.parent, timeout=60, check=True)
    assert "on_loop_event" in done.stderr
    assert "register_budgets" in done.stderr


class _Filter:
    def __init__(self, delta: float | None, *, tryfirst: bool = False,
                 trylast: bool = False) -> None:
        self.delta = delta
        self.calls: list[float] = []
        # Each instance gets its own hookimpl so several can be registered.
        @hookimpl(tryfirst=tryfirst, trylast=trylast)
        def request_timeout(value: float, provider: str) -> float | None:
            self.calls.append(value)
            return None if self.delta is None else value + self.delta

        self.request_timeout = request_timeout


def test_fold_value_passes_value_through_every_impl_in_call_order() -> None:
    pm, _ = make_plugin_manager(load_entrypoints=False)
    early, none, late = _Filter(1, tryfirst=True), _Filter(None), _Filter(100, trylast=True)
    for plugin in (late, none, early):
        pm.register(plugin)
    value = fold_value(pm, "request_timeout", 10.0, mode="chat", provider="p", model="m",
                       payload={})
    assert value == 111.0
    assert early.calls == [10.0]
    assert none.calls == [11.0]
    assert late.calls == [11.0]


def test_fold_value_without_impls_returns_the_value() -> None:
    pm, _ = make_plugin_manager(load_entrypoints=False)
    assert fold_value(pm, "connect_timeout", 15.0, mode="chat", provider="p", model="m",
                      payload={}, request_timeout=300.0) == 15.0


def test_first_result_returns_first_non_none_answer() -> None:
    pm, _ = make_plugin_manager(load_entrypoints=False)

    class NoOpinion:
        @hookimpl
        def provider_availability(self, provider: str, model: str) -> None:
            return None

    class Unavailable:
        @hookimpl(trylast=True)
        def provider_availability(self, provider: str, model: str) -> str:
            return f"{provider} is down"

    assert first_result(pm, "provider_availability", provider="x", model="m") is None
    pm.register(Unavailable())
    pm.register(NoOpinion())
    assert first_result(pm, "provider_availability", provider="x", model="m") == "x is down"


def test_collect_tags_items_with_plugin_names() -> None:
    pm, _ = make_plugin_manager([retry_budget], load_entrypoints=False)
    collected = collect(pm, "register_budgets")
    assert [(name, spec.name) for name, spec in collected] == [
        ("tests.plugins.retry_budget", "retries")
    ]


def test_collect_refuses_a_non_list_answer() -> None:
    class Wrong:
        @hookimpl
        def register_budgets(self) -> object:
            return "retries"

    pm, _ = make_plugin_manager([Wrong()], load_entrypoints=False)
    with pytest.raises(PluginLoadError, match="must return a list"):
        collect(pm, "register_budgets")


def test_fresh_plugin_manager_has_every_hookspec() -> None:
    pm, _ = make_plugin_manager(load_entrypoints=False)
    assert isinstance(pm, pluggy.PluginManager)
    for name in ("register_budgets", "register_tools", "register_providers", "text_result",
                 "provider_availability", "request_timeout", "connect_timeout",
                 "confirm_continuation", "on_loop_event", "register_commands"):
        assert hasattr(pm.hook, name)


def test_default_host_boots_lazily_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMACHINE_DB", str(tmp_path / "lazy.db"))
    reset_default_host()
    try:
        assert not (tmp_path / "lazy.db").exists()
        first = get_default_host()
        assert get_default_host() is first
        assert (tmp_path / "lazy.db").exists()
    finally:
        reset_default_host()


def test_database_in_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    from datamachine import DatabaseError

    missing = tmp_path / "nope" / "dm.db"
    with pytest.raises(DatabaseError, match=str(tmp_path / "nope")):
        bootstrap.boot(missing, load_entrypoints=False)


def test_an_applications_own_bootstrap_module_does_not_shadow_ours(tmp_path: Path) -> None:
    # ``bootstrap.py`` is a common name for an app's start-up script; with it first on
    # sys.path (the working directory of ``python -c``), the library must still boot.
    (tmp_path / "bootstrap.py").write_text("raise SystemExit('the app bootstrap ran')\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "DATAMACHINE_DB": str(tmp_path / "app.db"), "DATAMACHINE_LOAD_PLUGINS": ""}
    code = ("import datamachine; "
            "print(datamachine.run_conversation([{'role': 'user', 'content': 'hi'}])"
            ".final_content)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "echo: hi"), done.stderr
    cli = subprocess.run([sys.executable, "-c", "from datamachine.cli import main; main()",
                          "run", "hello"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert cli.returncode == 0, cli.stderr
    assert "echo: hello" in cli.stdout


def test_reset_default_host_boots_the_next_one_from_the_environment_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import datamachine

    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "")
    used = []
    try:
        for name in ("first.db", "second.db"):
            monkeypatch.setenv("DATAMACHINE_DB", str(tmp_path / name))
            datamachine.reset_default_host()
            datamachine.run_conversation([{"role": "user", "content": name}])
            used.append(datamachine.get_default_host().db_path)
    finally:
        datamachine.reset_default_host()
    assert used == [tmp_path / "first.db", tmp_path / "second.db"]
