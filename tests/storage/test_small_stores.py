"""The stores that took over the SQL of settings, the site id, the run viewer and the job queue:
what each stores and returns, on both backends."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from datamachine.errors import InvalidBudgetValue, UsageError
from datamachine.host import Host
from datamachine.storage import (
    JobStore,
    SettingsStore,
    SiteSecretStore,
    TaskQueueStore,
    ViewerLogin,
    ViewerLoginStore,
)
from tests.storage.backends import is_postgres


def test_the_settings_store_keeps_json_text_by_key(host: Host) -> None:
    store = SettingsStore(host.handle)
    store.put("x_colour", '"red"')
    assert store.rows()["x_colour"] == '"red"'
    store.put("x_colour", '"blue"')
    assert store.rows()["x_colour"] == '"blue"'
    assert store.remove("x_colour") is True
    assert store.remove("x_colour") is False
    assert "x_colour" not in store.rows()


def test_the_settings_store_rereads_only_when_something_changed(host: Host) -> None:
    store = SettingsStore(host.handle)
    first = store.rows()
    if not is_postgres(host):  # PostgreSQL reads its few rows every time
        assert store.rows() is first  # nothing changed: the same rows (callers cache by it)
    store.put("x_size", "3")
    assert store.rows() is not first
    assert store.rows()["x_size"] == "3"


def test_put_if_unset_keeps_the_first_value_and_replaces_a_stored_null(host: Host) -> None:
    store = SettingsStore(host.handle)
    assert store.put_if_unset("x_id", '"first"') == '"first"'
    assert store.put_if_unset("x_id", '"second"') == '"first"'
    store.put("x_empty", "null")
    assert store.put_if_unset("x_empty", '"made"') == '"made"'


def test_settings_setdefault_stores_once_checks_the_value_and_lets_the_environment_win(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert host.settings.setdefault("x_token", "abc") == "abc"
    assert host.settings.setdefault("x_token", "other") == "abc"
    assert host.settings.stored("x_token") == "abc"
    with pytest.raises(InvalidBudgetValue, match="max_turns"):
        host.settings.setdefault("max_turns", 0)
    assert host.settings.stored("max_turns") is None
    monkeypatch.setenv("DATAMACHINE_X_PINNED", '"from-env"')
    assert host.settings.setdefault("x_pinned", "stored") == "from-env"
    assert host.settings.stored("x_pinned") is None


def test_a_site_secret_is_made_once(host: Host) -> None:
    store = SiteSecretStore(host.handle)
    made: list[str] = []

    def make() -> str:
        made.append(f"secret-{len(made)}")
        return made[-1]

    assert store.get_or_create("cookie", make) == "secret-0"
    assert store.get_or_create("cookie", make) == "secret-0"
    assert SiteSecretStore(host.handle).get_or_create("cookie", make) == "secret-0"
    assert store.get_or_create("other", make) == "secret-1"
    assert made == ["secret-0", "secret-1"]


def test_a_viewer_login_is_recorded_read_ended_and_forgotten_after_its_age(host: Host) -> None:
    logins = ViewerLoginStore(host.handle)
    assert logins.get("nobody") is None
    with freeze_time("2026-03-01 10:00:00") as clock:
        logins.record("first", "alice", max_age=60)
        made = logins.get("first")
        assert made is not None
        assert (made.token_name, made.ended_at) == ("alice", None)
        clock.tick(5)
        logins.end("first", "alice")
        assert logins.get("first") == ViewerLogin("alice", made.created_at,
                                                  made.created_at + 5)
        clock.tick(120)
        logins.record("second", "alice", max_age=60)  # forgets what is older than a minute
    assert logins.get("first") is None
    assert logins.get("second") is not None


def test_a_store_without_a_queue_says_to_use_the_hosts(host: Host) -> None:
    store = JobStore(host.handle)
    with pytest.raises(UsageError, match=r"host\.jobs\.enqueue"):
        store.enqueue([{"role": "user", "content": "hi"}])
    with pytest.raises(UsageError, match=r"host\.jobs\.requeue"):
        store.requeue(1)


def test_only_a_pending_job_is_deleted(host: Host) -> None:
    waiting = host.jobs.create()
    started = host.jobs.start(host.jobs.create().id)
    assert host.jobs.delete_pending(started.id) is False
    assert host.jobs.get(started.id).status == "running"
    assert host.jobs.delete_pending(waiting.id) is True
    assert [job.id for job in host.jobs.list()] == [started.id]


def test_the_queue_store_knows_its_database(host: Host) -> None:
    url = TaskQueueStore(host.handle).postgres_url
    if not is_postgres(host):
        assert url is None  # SQLite: there is no queue
        with pytest.raises(UsageError, match="DATAMACHINE_DB=postgresql://"):
            host.queue.url()
    else:
        assert url is not None
        assert host.queue.url() == url
        assert "search_path" in TaskQueueStore.conninfo(url)
