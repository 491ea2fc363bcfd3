"""API tokens: shown once, stored hashed, verified in constant time, revocable by name."""

from __future__ import annotations

import hashlib

import pytest

from datamachine.errors import DuplicateTokenName, InvalidTokenName
from datamachine.host import Host
from tests.storage import backends


def test_a_token_is_shown_once_and_only_its_hash_is_stored(host: Host) -> None:
    token = host.tokens.create("ci")
    assert token.startswith("dm_")
    assert len(token) > 40
    rows = host.handle.conn.execute("SELECT name, token_hash FROM api_tokens").fetchall()
    assert rows == [("ci", hashlib.sha256(token.encode()).hexdigest())]
    assert token not in backends.dump(host)
    assert host.tokens.verify(token) == "ci"


@pytest.mark.parametrize("wrong", ["", "dm_", "dm_nope", "Bearer dm_x", None, 42,
                                   "dm_\ud800", "dm_caf\u00e9", "dm_\x00"])
def test_anything_but_an_active_token_verifies_as_none(host: Host, wrong: object) -> None:
    host.tokens.create("ci")
    assert host.tokens.verify(wrong) is None  # type: ignore[arg-type]


def test_a_revoked_token_no_longer_verifies_and_its_name_can_be_reused(host: Host) -> None:
    old = host.tokens.create("ci")
    assert host.tokens.revoke("ci") is True
    assert host.tokens.revoke("ci") is False
    assert host.tokens.verify(old) is None
    new = host.tokens.create("ci")
    assert new != old
    assert host.tokens.verify(new) == "ci"
    assert host.tokens.verify(old) is None


def test_an_active_name_cannot_be_taken_twice(host: Host) -> None:
    first = host.tokens.create("ci")
    with pytest.raises(DuplicateTokenName, match="ci"):
        host.tokens.create("ci")
    assert host.tokens.verify(first) == "ci"


@pytest.mark.parametrize("bad", ["", " ", "has space", "x" * 101, "-leading", None])
def test_token_names_are_validated(host: Host, bad: object) -> None:
    with pytest.raises(InvalidTokenName):
        host.tokens.create(bad)  # type: ignore[arg-type]


def test_list_shows_names_and_dates_never_secrets(host: Host) -> None:
    token = host.tokens.create("b")
    host.tokens.create("a")
    host.tokens.revoke("b")
    listed = host.tokens.list()
    assert [(t.name, t.active) for t in listed] == [("a", True), ("b", False)]
    assert token not in str([t.model_dump() for t in listed])
