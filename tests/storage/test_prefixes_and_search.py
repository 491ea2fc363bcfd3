"""Ids by their first characters (``resolve``) and the transcript listing's filters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import bootstrap
from datamachine import hookimpl
from datamachine.errors import (
    AmbiguousIdPrefix,
    ChatSessionNotFound,
    TranscriptNotFound,
    UsageError,
)
from datamachine.host import Host


def _run(host: Host, session: str, text: str, **kwargs: object) -> None:
    host.run_conversation([{"role": "user", "content": text}], None, "scripted", "m",
                          payload={"transcript_session_id": session}, **kwargs)  # type: ignore[arg-type]


def test_resolve_takes_a_whole_id_or_a_unique_prefix_of_any_length(host: Host) -> None:
    for session in ("abc", "abcdef", "abd1", "xyz"):
        _run(host, session, "hi")
    store = host.transcripts
    assert store.resolve("x") == "xyz"
    assert store.resolve("abcd") == "abcdef"
    assert store.resolve("abc") == "abc"  # a whole id means itself, even when it starts another
    with pytest.raises(AmbiguousIdPrefix) as caught:
        store.resolve("ab")
    assert caught.value.prefix == "ab"
    assert caught.value.matches == ["abc", "abcdef", "abd1"]
    assert str(caught.value) == ("Ambiguous transcript id prefix 'ab': it starts abc, abcdef, "
                                 "abd1; give more characters.")
    assert isinstance(caught.value, UsageError)  # exit 2 on the command line
    with pytest.raises(TranscriptNotFound, match="No transcript id starts with 'zz'"):
        store.resolve("zz")
    with pytest.raises(UsageError):
        store.resolve("")


def test_resolve_reads_glob_wildcards_and_case_literally(host: Host) -> None:
    for session in ("a*b", "a?c", "a[d]", "aXe", "Abc"):
        _run(host, session, "hi")
    store = host.transcripts
    assert store.resolve("a*") == "a*b"
    assert store.resolve("a?") == "a?c"
    assert store.resolve("a[") == "a[d]"
    assert store.resolve("A") == "Abc"  # ids are case-sensitive, so are their prefixes
    with pytest.raises(TranscriptNotFound):
        store.resolve("ax")


def test_an_ambiguous_prefix_names_at_most_five_ids(host: Host) -> None:
    for i in range(8):
        _run(host, f"same{i}", "hi")
    with pytest.raises(AmbiguousIdPrefix) as caught:
        host.transcripts.resolve("same")
    assert caught.value.matches == [f"same{i}" for i in range(5)]
    assert str(caught.value).endswith("same4, ...; give more characters.")


def test_chat_sessions_resolve_prefixes_too(host: Host) -> None:
    first = host.chat_sessions.create(session_id="chat-one")
    host.chat_sessions.create(session_id="chat-two")
    assert host.chat_sessions.resolve("chat-o") == first.id
    with pytest.raises(AmbiguousIdPrefix, match="chat session id prefix 'chat-'"):
        host.chat_sessions.resolve("chat-")
    with pytest.raises(ChatSessionNotFound, match="No chat session id starts with 'nope'"):
        host.chat_sessions.resolve("nope")


def test_list_searches_message_text_case_insensitively(host: Host) -> None:
    _run(host, "s1", "Tell me about Pelicans")
    _run(host, "s2", "50% off, snake_case")
    _run(host, "s3", "nothing here")
    store = host.transcripts
    assert [t.id for t in store.list(search="pelican")] == ["s1"]
    assert [t.id for t in store.list(search="ECHO: TELL")] == ["s1"]  # the answer counts too
    assert [t.id for t in store.list(search="50%")] == ["s2"]
    assert [t.id for t in store.list(search="%")] == ["s2"]  # % and _ are literal
    assert [t.id for t in store.list(search="e_c")] == ["s2"]
    assert store.list(search="ke_case x") == []
    assert {t.id for t in store.list(search="e")} == {"s1", "s2", "s3"}
    assert len(store.list(search="e", limit=2)) == 2
    with pytest.raises(UsageError, match="search must be a non-empty string"):
        store.list(search="")


def test_a_prefix_pasted_with_spaces_around_it_still_resolves(host: Host) -> None:
    _run(host, "3f2a-one", "hi")
    assert host.transcripts.resolve(" 3f2a ") == "3f2a-one"
    assert host.transcripts.resolve("3f2a-one\n") == "3f2a-one"


def test_a_damaged_message_costs_only_its_own_match(file_host: Host) -> None:
    # One envelope that is not JSON failed every `transcripts list --search`.
    _run(file_host, "s1", "Tell me about Pelicans")
    _run(file_host, "s2", "and walruses")
    with file_host.handle.conn:
        file_host.handle.conn.execute(
            "UPDATE transcript_messages SET envelope = '{broken' WHERE session_id = 's2' "
            "AND rowid = (SELECT min(rowid) FROM transcript_messages WHERE session_id = 's2')")
    assert [t.id for t in file_host.transcripts.list(search="pelican")] == ["s1"]
    assert [t.id for t in file_host.transcripts.list(search="echo: and")] == ["s2"]


class _Research:
    @hookimpl
    def register_modes(self) -> list[str]:
        return ["research"]


@pytest.fixture
def research_host() -> Iterator[Host]:
    with bootstrap.boot(db_path=":memory:", plugins=[_Research()], load_entrypoints=False) as h:
        yield h


def test_list_filters_by_status_and_mode_together_with_search(research_host: Host) -> None:
    host = research_host
    _run(host, "p1", "alpha")
    _run(host, "c1", "alpha", mode="chat")
    _run(host, "m1", "alpha", mode=["chat", "research"])
    host.run_conversation([{"role": "user", "content": "alpha"}], None, "scripted", "m",
                          payload={"transcript_session_id": "b1", "script": [
                              {"content": "", "tool_calls": [
                                  {"id": "1", "name": "nope", "parameters": {}}]}]},
                          max_turns=1)
    store = host.transcripts
    assert {t.id for t in store.list(mode="chat")} == {"c1", "m1"}
    assert [t.id for t in store.list(mode="research")] == ["m1"]
    assert store.list(mode="searc") == []
    assert [t.id for t in store.list(status="budget_exceeded", search="ALPHA")] == ["b1"]
    assert {t.id for t in store.list(status="completed", mode="pipeline")} == {"p1"}
