"""Settings: JSON values in SQLite, environment overrides, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

import bootstrap
from datamachine import InvalidSetting
from datamachine.host import Host


def test_set_get_delete_all_roundtrip_json_values(host: Host) -> None:
    host.settings.set("remote_sites", {"b": {"url": "http://127.0.0.1:1"}})
    host.settings.set("default_provider", "scripted")
    host.settings.set("budget_pressure", True)
    assert host.settings.get("remote_sites") == {"b": {"url": "http://127.0.0.1:1"}}
    everything = host.settings.all()
    assert everything.pop("site_id")  # generated at boot
    assert everything == {"budget_pressure": True, "default_provider": "scripted",
                          "remote_sites": {"b": {"url": "http://127.0.0.1:1"}}}
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
        host.settings.set("thing", object())


def test_settings_persist_across_boots(tmp_path: Path) -> None:
    path = tmp_path / "dm.db"
    with bootstrap.boot(path, load_entrypoints=False) as first:
        first.settings.set("max_turns", 42)
    with bootstrap.boot(path, load_entrypoints=False) as second:
        assert second.settings.get("max_turns") == 42
        assert second.budgets.create("conversation_turns").ceiling() == 42


def test_updated_at_comes_from_the_project_clock(host: Host) -> None:
    from freezegun import freeze_time

    with freeze_time("2030-05-01 12:00:00"):
        host.settings.set("default_model", "m")
    row = host.db.execute("SELECT updated_at FROM settings WHERE key='default_model'").fetchone()
    assert row[0] == pytest.approx(1903867200.0)


def test_a_write_from_another_process_is_seen_at_once(tmp_path: Path) -> None:
    # Settings are cached per host; another connection's commit must invalidate the cache.
    path = tmp_path / "shared.db"
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


def test_batch_reads_a_consistent_snapshot_and_sees_own_writes(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with bootstrap.boot(path, load_entrypoints=False) as first, \
            bootstrap.boot(path, load_entrypoints=False) as second:
        with first.settings.batch():
            assert first.settings.get("max_turns") is None
            first.settings.set("max_turns", 7)  # its own write drops the cache
            assert first.settings.get("max_turns") == 7
        second.settings.set("max_turns", 9)
        assert first.settings.get("max_turns") == 9  # outside the batch: checked again
