"""``TranscriptStore.page``: keyset pages over every transcript, with the run viewer's filters."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from datamachine.errors import UsageError
from datamachine.host import Host


def _store(host: Host, sid: str, at: float, title: str, **request: Any) -> None:
    with freeze_time(_moment(at)):
        host.transcripts.begin(sid, [{"role": "user", "content": title}], request)


def _moment(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(1_700_000_000 + at, UTC).isoformat()


def _all_ids(host: Host, limit: int, **filters: Any) -> list[list[str]]:
    pages, after = [], None
    while True:
        page = host.transcripts.page(limit=limit, after=after, **filters)
        pages.append([item.id for item in page.items])
        after = page.next
        if after is None:
            return pages


def test_pages_cover_every_transcript_once_newest_first_ties_by_id(backend_host: Host) -> None:
    for i in range(7):
        _store(backend_host, f"s{i}", float(i // 2), f"task {i}")  # pairs share a moment
    pages = _all_ids(backend_host, 3)
    assert pages == [["s6", "s5", "s4"], ["s3", "s2", "s1"], ["s0"]]
    assert _all_ids(backend_host, 7) == [["s6", "s5", "s4", "s3", "s2", "s1", "s0"]]
    assert backend_host.transcripts.page(limit=7).next is None


def test_a_run_updated_while_paging_moves_to_the_top_without_shifting_pages(
        backend_host: Host) -> None:
    for i in range(4):
        _store(backend_host, f"s{i}", float(i), f"task {i}")
    first = backend_host.transcripts.page(limit=2)
    assert [i.id for i in first.items] == ["s3", "s2"]
    _store(backend_host, "s0", 10.0, "task 0")  # s0 writes again: now the newest
    second = backend_host.transcripts.page(limit=2, after=first.next)
    assert [i.id for i in second.items] == ["s1"]


def test_filters_status_mode_and_text(backend_host: Host) -> None:
    _store(backend_host, "alpha-1", 1, "Compare the weather in Oslo", provider="scripted",
           model="gpt-tiny", mode="chat")
    _store(backend_host, "beta-2", 2, "Tell me about 100% of bikes", provider="openai",
           model="llama", mode="pipeline,chat")
    _store(backend_host, "gamma-3", 3, "plain", provider="openai", model="m", mode="system")
    backend_host.transcripts.set_status("gamma-3", "error")

    def ids(**filters: Any) -> list[str]:
        return [i.id for i in backend_host.transcripts.page(**filters).items]

    assert ids(text="OSLO") == ["alpha-1"]           # title, case-insensitive
    assert ids(text="llama") == ["beta-2"]           # model
    assert ids(text="openai") == ["gamma-3", "beta-2"]  # provider
    assert ids(text="gam") == ["gamma-3"]            # the start of an id
    assert ids(text="100%") == ["beta-2"]            # % is literal
    assert ids(text="1_0") == []                     # so is _
    assert ids(mode="chat") == ["beta-2", "alpha-1"]
    assert ids(status="error") == ["gamma-3"]
    assert ids(status="interrupted") == ["beta-2", "alpha-1"]  # running, no lock behind them
    assert ids(status="running") == []
    assert ids(status="error", text="alpha") == []
    assert backend_host.transcripts.page(text="Oslo").items[0].title == (
        "Compare the weather in Oslo")


def test_a_held_lock_makes_a_running_row_running(backend_host: Host) -> None:
    _store(backend_host, "live", 1, "x")
    assert backend_host.transcripts.acquire("live", 60) is not None
    assert [i.id for i in backend_host.transcripts.page(status="running").items] == ["live"]


@pytest.mark.parametrize(("arguments", "field"), [
    ({"limit": 0}, "limit"), ({"limit": 501}, "limit"), ({"limit": True}, "limit"),
    ({"after": "nonsense"}, "after"), ({"after": "nan:x"}, "after"), ({"after": "1.0:"}, "after"),
    ({"after": 3}, "after"), ({"status": "done"}, "status"), ({"text": ""}, "text"),
    ({"mode": 1}, "mode"),
])
def test_bad_arguments_name_the_field(host: Host, arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(UsageError, match=f"^{field} must"):
        host.transcripts.page(**arguments)


def test_text_finds_the_answer_not_the_keys_of_the_stored_result(backend_host: Host) -> None:
    result = backend_host.run_conversation(
        [{"role": "user", "content": "What is it?"}], [], "scripted", "m",
        payload={"transcript_session_id": "answered",
                 "script": [{"content": 'The answer is "forty-two" \\o/'}]})
    assert result.status == "completed"

    def ids(text: str) -> list[str]:
        return [i.id for i in backend_host.transcripts.page(text=text).items]

    assert ids("FORTY-TWO") == ["answered"]
    assert ids('"forty-two" \\o/') == ["answered"]  # quotes and backslashes, JSON-escaped
    assert ids("final_content") == []                # a key of the stored result
    assert ids("completed") == []                    # a value that is not the answer


def test_a_sessions_usage_adds_up_over_its_runs(backend_host: Host) -> None:
    session = backend_host.chat_sessions.create()
    for _ in range(2):
        backend_host.chat(session.id, "hi", [], "scripted", "m",
                          payload={"script": [{"content": "hello", "usage": {
                              "prompt_tokens": 10, "completion_tokens": 5,
                              "total_tokens": 15}}]})
    summary = backend_host.transcripts.summary(session.id)
    assert summary.usage["total_tokens"] == 15                       # the last run's
    assert summary.result["session_usage"]["total_tokens"] == 30     # every run's
