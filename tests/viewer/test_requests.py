"""The run page's requests table (DESIGN.md 25): one row per provider request with its latency,
tokens and the options sent, each failed attempt (status and message) before it; recorded
while the run ran, in its timeline."""

from __future__ import annotations

import re
from typing import Any

from freezegun import freeze_time

import bootstrap
from datamachine import hookimpl
from datamachine import tool as datamachine_tool
from datamachine.server.ui.request_rows import request_rows
from datamachine.testing import FunctionModel
from tests.viewer.site import ViewerSite, http_run, logged_in


def _rows(html: str) -> list[str]:
    table = html.split('<table class="runs requests">', 1)[1].split("</table>", 1)[0]
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip()
            for row in re.findall(r"<tr class=\"(?:request|attempt)[^>]*>(.*?)</tr>", table,
                                  flags=re.DOTALL)]


def test_each_request_is_a_row_with_the_failed_attempt_before_it(site: ViewerSite) -> None:
    session = http_run(site.host)
    records = site.host.transcripts.requests(session)
    assert [(r["turn"], r["ok"], len(r.get("attempts", []))) for r in records] == [
        (1, True, 1), (2, True, 0)]
    assert records[0]["attempts"] == [{"status": 503, "waited": 0.25,
                                       "error": "The model is overloaded, try again."}]
    assert records[0]["options"] == {"temperature": 0.2, "max_tokens": 256}
    assert site.host.transcripts.timeline(session) == []  # the rare events stay apart
    page = logged_in(site).get("/ui/run", params={"id": session})
    assert page.status_code == 200
    rows = _rows(page.text)
    assert len(rows) == 3
    assert rows[0].startswith("1.1 Turn 1 HTTP 503: The model is overloaded, try again.")
    assert "retried after 0.25 s" in rows[0]
    assert re.fullmatch(r"1 Turn 1 \d+ ms 412 19 temperature=0.2, max_tokens=256 answered",
                        rows[1]), rows[1]
    assert re.fullmatch(r"2 Turn 2 \d+ ms 468 11 temperature=0.2, max_tokens=256 answered",
                        rows[2]), rows[2]


def test_latency_comes_from_the_run_clock_and_missing_usage_says_so() -> None:
    with freeze_time("2026-01-01 09:00:00") as clock:

        def slow(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
            clock.tick(2.5)
            return "done"

        with bootstrap.boot(":memory:", plugins=[FunctionModel(slow)],
                            load_entrypoints=False) as host:
            result = host.run_conversation([{"role": "user", "content": "hi"}],
                                           provider="function",
                                           payload={"transcript_session_id": "slow"})
            assert result.status == "completed"
            [record] = host.transcripts.requests("slow")
    assert (record["ms"], record["ok"], record["turn"]) == (2500, True, 1)
    assert "usage" not in record  # the function reported none
    [row] = request_rows([record])
    assert (row.latency, row.prompt, row.completion, row.options) == (
        "2.5 s", "not reported", "not reported", "-")


class _SummaryFails:
    @hookimpl
    def text_result(self, request: Any) -> Any:
        if not request.tools:
            return RuntimeError("summary refused")
        return {"tool_calls": [{"name": "noop", "parameters": {"n": request.turn}}]}


def test_a_failed_request_and_the_final_summary_are_rows_too() -> None:
    from datamachine import tool

    @tool
    def noop(n: int) -> int:
        """Do nothing.

        Args:
            n: A number.
        """
        return n

    with bootstrap.boot(":memory:", plugins=[_SummaryFails()],
                        load_entrypoints=False) as host:
        result = host.run_conversation([{"role": "user", "content": "go"}], [noop],
                                       max_turns=2, payload={"transcript_session_id": "f"})
        records = host.transcripts.requests("f")
    assert result.status == "budget_exceeded"
    assert [(r["turn"], r["ok"], r.get("summary", False)) for r in records] == [
        (1, True, False), (2, True, False), (3, False, True)]
    assert records[2]["error"] == "summary refused"
    rows = request_rows(records)
    assert [row.label for row in rows] == ["Turn 1", "Turn 2", "Final summary"]
    assert (rows[2].ok, rows[2].error) == (False, "summary refused")


def test_damaged_records_show_what_can_be_read() -> None:
    rows = request_rows([{"turn": "x", "ms": -1, "usage": "lots", "options": [1],
                          "attempts": [None, {"status": 500, "waited": True}]},
                         {"run_base": 4, "turn": 1, "ms": 40}])
    assert (rows[0].turn, rows[0].latency, rows[0].prompt, rows[0].options) == (
        0, "-", "not reported", "-")
    assert [(a.status, a.waited) for a in rows[0].attempts] == [("no answer", "-"),
                                                                 ("HTTP 500", "-")]
    assert (rows[1].run, rows[1].label, rows[1].latency) == (2, "Run 2 · Turn 1", "40 ms")


def test_compactions_show_on_the_run_page(site: ViewerSite) -> None:
    """DESIGN.md 21 and 25: each compaction is a line of the timeline, the summary call a row
    of the requests table, and the run's ``context_tokens`` a budget bar."""
    from tests.context.windowed_server import WindowedModel, page

    @datamachine_tool
    def read_page(n: int) -> str:
        """Read page ``n``."""
        return page(n)

    from datamachine.providers.openai import OpenAIProvider
    from tests.viewer.site import HTTP_PROVIDER

    model = WindowedModel(calls=8, window=6000).start()
    try:
        host = site.host
        # The site's stand-in model lets this provider's requests through to the server.
        host.providers.register(OpenAIProvider(name=HTTP_PROVIDER, base_url=model.base_url,
                                               api_key="sk-local"))
        host.settings.set("context_windows", {"windowed": 6000})
        result = host.run_conversation(
            [{"role": "user", "content": "Read the pages."}], [read_page], HTTP_PROVIDER,
            "windowed", payload={"transcript_session_id": "compacted-run",
                                 "context_compaction": {"strategies": ["summarize",
                                                                       "clear_tool_results"]}})
    finally:
        model.stop()
    assert result.status == "completed", result.error
    assert result.compactions > 0
    page_html = logged_in(site).get("/ui/run", params={"id": "compacted-run"}).text
    text = re.sub(r"\s+", " ", page_html)
    assert "Context compacted by summarize: about " in text
    assert "message(s) removed or cleared from what the model is sent" in text
    assert 'data-budget="context_tokens"' in page_html
    assert any(seen.kind == "compaction" for seen in model.seen)
    labels = [row.split(" ", 1)[1] for row in _rows(page_html)]
    assert any(label.startswith("Compaction summary before turn") for label in labels), labels
