"""Compactions are stored with the transcript and a continued session starts from the latest
one instead of compacting (and summarizing) its history again (DESIGN.md 21), on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from datamachine.host import Host
from tests.context.windowed_server import WindowedModel, fetch_page, serving


@pytest.fixture
def model() -> Iterator[WindowedModel]:
    with serving(calls=8, window=6000) as server:
        yield server


def test_a_chat_session_goes_on_from_its_stored_compaction(backend_host: Host,
                                                          model: WindowedModel) -> None:
    host = backend_host
    host.settings.set("openai_base_url", model.base_url)
    host.settings.set("context_windows", {"windowed": model.window})
    host.settings.set("context_compaction", {"strategies": ["summarize", "drop_oldest"],
                                             "keep_turns": 1})
    session = host.chat_sessions.create(max_turns="unlimited")

    first = host.chat(session.id, "Read the pages.", [fetch_page], "openai", "windowed")
    assert first.status == "completed", first.error
    assert first.compactions > 0
    stored = host.transcripts.compactions(session.id)
    assert len(stored) == first.compactions
    assert [r["seq"] for r in stored] == list(range(1, len(stored) + 1))
    assert {r["strategy"] for r in stored} == {"summarize"}
    assert stored[-1]["summary"].startswith("Notes:")
    latest = host.transcripts.latest_compaction(session.id)
    assert latest is not None
    assert any("[Summary of the earlier conversation]" in str(m.get("content"))
               for m in latest["view"])
    summaries = sum(1 for seen in model.seen if seen.kind == "compaction")

    model.issued, model.calls = 0, 0  # the next message is answered at once
    second = host.chat(session.id, "How many pages was that?", [fetch_page], "openai",
                       "windowed")
    assert second.status == "completed", second.error
    sent = [seen for seen in model.seen if seen.kind == "turn"][-1].messages
    # It started from the stored view: the summary, not the pages it stands for, and no
    # new summary call was needed.
    assert any("[Summary of the earlier conversation]" in str(m.get("content")) for m in sent)
    assert str(sent).count("lorem ipsum") < str(first.messages).count("lorem ipsum")
    assert sent[-1]["content"] == "How many pages was that?"
    assert sum(1 for seen in model.seen if seen.kind == "compaction") == summaries
    assert second.compactions == 0
    # The transcript keeps every message of both runs.
    assert len(host.transcripts.get(session.id)) == len(second.messages)


def test_a_session_without_compactions_has_none_stored(backend_host: Host) -> None:
    host = backend_host
    session = host.chat_sessions.create()
    host.chat(session.id, "hi", payload={"script": [{"content": "hello"}]})
    assert host.transcripts.compactions(session.id) == []
    assert host.transcripts.latest_compaction(session.id) is None


def test_continue_conversation_starts_from_the_stored_view(host: Host,
                                                          model: WindowedModel) -> None:
    host.settings.set("openai_base_url", model.base_url)
    host.settings.set("context_windows", {"windowed": model.window})
    model.calls = 30
    first = host.run_conversation(
        [{"role": "user", "content": "Read the pages."}], [fetch_page], "openai", "windowed",
        max_turns=6, payload={"final_summary": False})
    assert first.status == "budget_exceeded"
    assert first.compactions > 0
    session = first.transcript_session_id
    assert session is not None
    latest = host.transcripts.latest_compaction(session)
    assert latest is not None
    sent_before = len(model.seen)

    more = host.continue_conversation(session, 2, [fetch_page], "openai", "windowed")
    assert more.status == "budget_exceeded", more.error
    first_request = model.seen[sent_before].messages
    # The stored view, not the whole history: the pages it cleared stay cleared.
    assert "cleared" in str(first_request)
    assert str(first_request).count("lorem ipsum") < str(first.messages).count("lorem ipsum")
    # ...and it did not have to compact before its first request to get there.
    stored = host.transcripts.compactions(session)
    this_run = stored[len(stored) - more.compactions:]
    assert all(record["turn"] > 1 for record in this_run)
    assert model.pairing_errors == []


def test_a_long_chat_session_on_llama_cpp_never_sees_a_400(host: Host,
                                                           model: WindowedModel) -> None:
    model.flavour, model.window = "llama.cpp", 5000
    host.settings.set("openai_base_url", model.base_url)  # no window known: learned
    session = host.chat_sessions.create(max_turns="unlimited")
    for message in range(15):
        model.issued, model.calls = 0, 2  # each message: two pages, then an answer
        result = host.chat(session.id, f"Question {message}: read two pages.", [fetch_page],
                           "openai", "windowed")
        assert result.status == "completed", (message, result.error)
        assert result.final_content == "done after 2 pages"
    refused = [seen for seen in model.seen if seen.refused]
    assert len(refused) <= 2  # once to learn the window (maybe twice), never again
    assert model.pairing_errors == []
    assert len(host.transcripts.get(session.id)) == 15 * 6
    assert host.transcripts.compactions(session.id)
