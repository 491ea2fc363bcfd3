"""Settings: JSON values in SQLite, environment overrides, validation."""

from __future__ import annotations

import pytest

import bootstrap
from datamachine import InvalidBudgetValue, InvalidSetting
from datamachine.host import Host


@pytest.fixture
def host(backend_host: Host) -> Host:
    """Settings behave the same on both storage backends."""
    return backend_host


def test_set_get_delete_all_roundtrip_json_values(host: Host) -> None:
    host.settings.set("remote_sites", {"b": {"url": "http://127.0.0.1:1", "token": "dm_x"}})
    host.settings.set("default_provider", "scripted")
    host.settings.set("budget_pressure", True)
    assert host.settings.get("remote_sites") == {
        "b": {"url": "http://127.0.0.1:1", "token": "dm_x"}}
    everything = host.settings.all()
    assert everything.pop("site_id")  # generated at boot
    assert everything == {"budget_pressure": True, "default_provider": "scripted",
                          "remote_sites": {"b": {"url": "http://127.0.0.1:1", "token": "dm_x"}}}
    assert host.settings.delete("default_provider") is True
    assert host.settings.delete("default_provider") is False
    assert host.settings.get("default_provider", "fallback") == "fallback"


def test_environment_overrides_stored_value(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.settings.set("max_turns", 10)
    monkeypatch.setenv("DATAMACHINE_MAX_TURNS", "30")
    assert host.settings.get("max_turns") == 30
    assert host.settings.source("max_turns") == "env"
    assert host.settings.stored("max_turns") == 10
    assert host.settings.all()["max_turns"] == 30
    assert host.budgets.create("conversation_turns").ceiling() == 30
    monkeypatch.setenv("DATAMACHINE_DEFAULT_MODEL", "gpt-test")
    assert host.settings.get("default_model") == "gpt-test"


def test_reserved_environment_variables_are_not_settings(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "")
    monkeypatch.setenv("DATAMACHINE_TRACE_HOOKS", "0")
    assert host.settings.get("load_plugins") is None
    assert host.settings.get("trace_hooks") is None
    assert "db" not in host.settings.all()


@pytest.mark.parametrize("key", ["Max_Turns", "", "max-turns", "1abc", None])
def test_bad_keys_are_refused(host: Host, key: object) -> None:
    with pytest.raises(InvalidSetting, match="lowercase"):
        host.settings.set(key, 1)  # type: ignore[arg-type]


def test_non_json_value_is_refused(host: Host) -> None:
    with pytest.raises(InvalidSetting, match="JSON"):
        host.settings.set("x_thing", object())


def test_settings_persist_across_boots(db_target: str) -> None:
    path = db_target
    with bootstrap.boot(path, load_entrypoints=False) as first:
        first.settings.set("max_turns", 42)
    with bootstrap.boot(path, load_entrypoints=False) as second:
        assert second.settings.get("max_turns") == 42
        assert second.budgets.create("conversation_turns").ceiling() == 42


def test_updated_at_comes_from_the_project_clock(host: Host) -> None:
    from freezegun import freeze_time

    with freeze_time("2030-05-01 12:00:00"):
        host.settings.set("default_model", "m")
    row = host.handle.conn.execute(
        "SELECT updated_at FROM settings WHERE key='default_model'").fetchone()
    assert row[0] == pytest.approx(1903867200.0)


def test_a_write_from_another_process_is_seen_at_once(db_target: str) -> None:
    # Settings are cached per host; another connection's commit must invalidate the cache.
    path = db_target
    with bootstrap.boot(path, load_entrypoints=False) as first, \
            bootstrap.boot(path, load_entrypoints=False) as second:
        assert first.settings.get("max_turns") is None
        second.settings.set("max_turns", 12)
        assert first.settings.get("max_turns") == 12
        second.settings.delete("max_turns")
        assert first.settings.get("max_turns") is None
        first.settings.set("default_model", "m1")
        assert first.settings.get("default_model") == "m1"
        assert second.settings.get("default_model") == "m1"


def test_batch_reads_a_consistent_snapshot_and_sees_own_writes(db_target: str) -> None:
    path = db_target
    with bootstrap.boot(path, load_entrypoints=False) as first, \
            bootstrap.boot(path, load_entrypoints=False) as second:
        with first.settings.batch():
            assert first.settings.get("max_turns") is None
            first.settings.set("max_turns", 7)  # its own write drops the cache
            assert first.settings.get("max_turns") == 7
        second.settings.set("max_turns", 9)
        assert first.settings.get("max_turns") == 9  # outside the batch: checked again


def _store_raw(host: Host, key: str, text: str) -> None:
    """Write a setting's text around ``set`` (a hand edit, an older version, another tool),
    through a connection of its own."""
    from datamachine.storage.database import open_handle

    url = getattr(host.handle, "url", None)
    other = open_handle(url if url is not None else host.db_path)
    try:
        other.conn.execute(
            "INSERT INTO settings (key, value, updated_at) VALUES (?, ?, 0) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value", [key, text])
        if hasattr(other.conn, "commit"):
            other.conn.commit()
    finally:
        other.conn.close()


def test_a_stored_value_that_is_not_json_is_the_sites_fault(db_target: str) -> None:
    from datamachine.errors import SiteMisconfigured

    with bootstrap.boot(db_path=db_target, load_entrypoints=False) as host:
        _store_raw(host, "default_model", "{oops")
        with pytest.raises(SiteMisconfigured, match="default_model") as raised:
            host.settings.get("default_model")
        assert raised.value.setting == "default_model"
        with pytest.raises(SiteMisconfigured):
            host.settings.all()
        assert [key for key, _ in host.settings.problems()] == ["default_model"]


def test_problems_names_every_value_a_run_would_fail_on(
    db_target: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with bootstrap.boot(db_path=db_target, load_entrypoints=False) as host:
        assert host.settings.problems() == []
        _store_raw(host, "max_turns", "0")
        monkeypatch.setenv("DATAMACHINE_MAX_RUN_SECONDS", "NaN")
        monkeypatch.setenv("DATAMACHINE_CHAT_RATE_LIMIT", "-1")
        found = dict(host.settings.problems())
        assert sorted(found) == ["chat_rate_limit", "max_run_seconds", "max_turns"]
        assert "DATAMACHINE_MAX_RUN_SECONDS" in found["max_run_seconds"]
        assert "finite" in found["max_run_seconds"]
        monkeypatch.delenv("DATAMACHINE_MAX_RUN_SECONDS")
        monkeypatch.delenv("DATAMACHINE_CHAT_RATE_LIMIT")
        host.settings.set("max_turns", 5)  # the fix, through set, drops the cached answer
        assert host.settings.problems() == []


@pytest.mark.parametrize(("key", "value"), [
    ("request_timeout", float("nan")),
    ("chat_tools", "fetch_url"), ("chat_tools", ["a", "a"]), ("chat_rate_limit", True),
    ("chat_max_concurrent", 1.5),
])
def test_new_setting_rules_refuse_bad_values(host: Host, key: str, value: object) -> None:
    with pytest.raises(InvalidSetting, match=key):
        host.settings.set(key, value)


@pytest.mark.parametrize(("key", "value"), [
    ("max_run_seconds", float("inf")), ("max_run_seconds", 0), ("provider_max_retries", -1),
    ("provider_max_retries", 1.5), ("job_max_attempts", "5"), ("chat_max_turns", "forever"),
])
def test_settings_of_bounded_loops_are_budget_settings(host: Host, key: str,
                                                        value: object) -> None:
    """Retries, attempts, a chat session's turns and the wall clock are budgets now: their
    settings are checked by their budget, in its unit (DESIGN 22)."""
    with pytest.raises(InvalidBudgetValue, match=key):
        host.settings.set(key, value)


def test_chat_tools_must_name_registered_tools(host: Host) -> None:
    host.settings.set("chat_tools", ["call_remote_agent"])
    with pytest.raises(InvalidSetting, match="no_such_tool"):
        host.settings.set("chat_tools", ["call_remote_agent", "no_such_tool"])
    assert host.settings.get("chat_tools") == ["call_remote_agent"]



def _nested(depth: int) -> list[object]:
    """A list nested ``depth`` levels deep (``[]`` is one level)."""
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_value_nested_past_the_depth_limit_is_refused_and_never_stored(host: Host) -> None:
    from datamachine.setting_spec import MAX_DEPTH

    host.settings.set("x_deep", _nested(MAX_DEPTH))  # taken, and read back
    assert host.settings.get("x_deep") == _nested(MAX_DEPTH)
    itself: list[object] = []
    itself.append(itself)
    # 5,000 levels: a check walking it would hit Python's recursion limit.
    for value in (_nested(MAX_DEPTH + 1), _nested(5000), itself):
        with pytest.raises(InvalidSetting, match=f"more than {MAX_DEPTH} levels deep"):
            host.settings.set("model_options", value)
    assert host.settings.stored("model_options") is None
