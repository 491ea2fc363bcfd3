"""Transcript locks: never wait, expire after their TTL, and only the holder's token counts."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

from datamachine.errors import UsageError
from datamachine.host import Host
from datamachine.storage import TranscriptStore


@pytest.fixture
def frozen() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time("2026-01-01 12:00:00") as clock:
        assert isinstance(clock, FrozenDateTimeFactory)
        yield clock


@pytest.fixture
def store(host: Host) -> TranscriptStore:
    return host.transcripts


def test_held_lock_answers_none_at_once(store: TranscriptStore,
                                        frozen: FrozenDateTimeFactory) -> None:
    token = store.acquire("s", 60)
    assert isinstance(token, str)
    assert token
    assert store.acquire("s", 60) is None
    assert store.acquire("other", 60) is not None


def test_lock_expires_exactly_at_its_ttl(store: TranscriptStore,
                                         frozen: FrozenDateTimeFactory) -> None:
    first = store.acquire("s", 10)
    frozen.tick(9.999)
    assert store.acquire("s", 10) is None
    frozen.tick(0.001)
    second = store.acquire("s", 10)
    assert second is not None
    assert second != first


def test_stale_token_cannot_release_or_renew_the_new_holders_lock(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    stale = store.acquire("s", 5)
    assert stale is not None
    frozen.tick(6)
    fresh = store.acquire("s", 5)
    assert fresh is not None
    assert store.release("s", stale) is False
    assert store.renew("s", stale, 100) is False
    assert store.acquire("s", 5) is None  # the new holder still has it
    assert store.release("s", fresh) is True
    assert store.release("s", fresh) is False  # releasing twice is harmless
    assert store.acquire("s", 5) is not None


def test_renew_keeps_a_long_run_ahead_of_its_ttl(store: TranscriptStore,
                                                 frozen: FrozenDateTimeFactory) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    for _ in range(5):  # 40 s in total, four times the TTL
        frozen.tick(8)
        assert store.renew("s", token, 10) is True
        assert store.acquire("s", 10) is None
    info = store.locks.info("s")
    assert info is not None
    assert info.expires_at == pytest.approx(info.acquired_at + 50)


def test_renewing_an_expired_lock_nobody_took_still_works(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    frozen.tick(60)
    assert store.renew("s", token, 10) is True
    assert store.acquire("s", 10) is None


def test_lock_info_hides_the_token_and_lists_only_live_locks(
    store: TranscriptStore, frozen: FrozenDateTimeFactory
) -> None:
    token = store.acquire("s", 10)
    assert token is not None
    info = store.locks.info("s")
    assert info is not None
    assert token not in info.model_dump_json()
    assert ":" in info.holder  # host:pid, for whoever debugs a stuck lock
    assert [i.session_id for i in store.locks.held()] == ["s"]
    frozen.tick(11)
    assert store.locks.info("s") is None
    assert store.locks.held() == []


@pytest.mark.parametrize(("session_id", "ttl"), [("", 10), ("s", 0), ("s", -1), ("s", True),
                                                 (None, 10), ("x" * 201, 10)])
def test_bad_lock_arguments_are_usage_errors(store: TranscriptStore, session_id: object,
                                             ttl: object) -> None:
    with pytest.raises(UsageError):
        store.acquire(session_id, ttl)  # type: ignore[arg-type]


def test_threads_sharing_one_host_get_exactly_one_lock(file_host: Host) -> None:
    """The host's connection is shared across threads; the stores serialize its use."""
    store = file_host.transcripts
    barrier = threading.Barrier(8)
    tokens: list[str | None] = []
    errors: list[BaseException] = []

    def grab() -> None:
        try:
            barrier.wait(timeout=10)
            for index in range(20):
                tokens.append(store.acquire(f"t{index}", 60))
                file_host.jobs.create(engine_data={"i": index})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert sum(token is not None for token in tokens) == 20
    assert len(file_host.jobs.list(limit=1000)) == 160
    assert not file_host.handle.conn.in_transaction
