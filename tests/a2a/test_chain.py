"""Chains of real servers: depth counted across hops, the ceiling, cycles, no retries."""

from __future__ import annotations

import json
from typing import Any

import httpx

from datamachine.server.chain import HEADER_CHAIN_DEPTH, HEADER_CHAIN_ID, HEADER_CHAIN_SITES
from datamachine.server.site import bound_host
from tests.a2a.conftest import MakeSite, link
from tests.a2a.live import Site

TIMEOUT = 30.0


def chat(site: Site, message: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{site.url}/chat", json={"message": message, **extra},
                      headers=site.auth(), timeout=TIMEOUT)


def remote_outcomes(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The normalized call_remote_agent tool results of a run (as returned by the server)."""
    return [r["result"] for r in result["tool_execution_results"]
            if r.get("tool_name") == "call_remote_agent"]


def chain_abcd(make_site: MakeSite) -> tuple[Site, Site, Site, Site]:
    d = make_site("d")
    c = make_site("c", next_site="d")
    b = make_site("b", next_site="c")
    a = make_site("a", next_site="b")
    link(a, b, c, d)
    return a, b, c, d


def test_hop_landing_at_the_ceiling_is_refused_with_429_and_nothing_runs_there(
    make_site: MakeSite,
) -> None:
    a, b, c, d = chain_abcd(make_site)

    response = chat(a, "hello")

    # A lands at 1, B at 2; C would land at 3 = the default ceiling, so C refuses.
    assert response.status_code == 200
    assert response.headers[HEADER_CHAIN_DEPTH] == "1"
    chain_id = response.headers[HEADER_CHAIN_ID]
    [b_hit] = b.server.app.chat_hits()
    assert (b_hit.status, b_hit.headers[HEADER_CHAIN_DEPTH.lower()]) == (200, "1")
    assert b_hit.headers[HEADER_CHAIN_ID.lower()] == chain_id
    assert b_hit.headers[HEADER_CHAIN_SITES.lower()] == a.site_id
    [c_hit] = c.server.app.chat_hits()  # exactly one: the refusal was not retried
    assert (c_hit.status, c_hit.headers[HEADER_CHAIN_DEPTH.lower()]) == (429, "2")
    assert c_hit.headers[HEADER_CHAIN_SITES.lower()] == f"{a.site_id},{b.site_id}"

    # Nothing ran on C: no model call, no transcript, no chat session. D was never reached.
    assert c.model.requests == []
    assert c.transcript_count() == 0
    assert c.host.chat_sessions.list() == []
    assert d.server.app.chat_hits() == []

    # B saw the refusal as a failed tool result carrying the remote code and the chain facts.
    b_run = b.host.transcripts.get_transcript(b.host.transcripts.list()[0].id)
    [b_tool] = [m for m in b_run.messages if m["type"] == "tool_result"]
    refusal = b_tool["payload"]
    assert refusal["success"] is False
    assert refusal["remote_status"] == 429
    assert refusal["remote_code"] == "datamachine_chain_depth_exceeded"
    assert refusal["remote_data"] == {"chain_id": chain_id, "chain_depth": 3, "ceiling": 3,
                                      "retry_after": 60}
    # ... and A got B's answer, which relays the refusal.
    [outcome] = remote_outcomes(response.json())
    from_b = outcome["result"]
    assert from_b["status"] == "completed"
    assert "datamachine_chain_depth_exceeded" in from_b["final_content"]


def test_raising_max_chain_depth_lets_the_chain_through(make_site: MakeSite) -> None:
    a, b, c, d = chain_abcd(make_site)
    for site in (c, d):
        site.host.settings.set("max_chain_depth", 5)

    response = chat(a, "hello")

    assert response.status_code == 200
    assert [h.status for h in c.server.app.chat_hits()] == [200]
    [d_hit] = d.server.app.chat_hits()
    assert (d_hit.status, d_hit.headers[HEADER_CHAIN_DEPTH.lower()]) == (200, "3")
    assert d_hit.headers[HEADER_CHAIN_SITES.lower()] == ",".join(
        [a.site_id, b.site_id, c.site_id])
    assert d.model.requests[0].payload["caller_context"]["chain_depth"] == 4
    assert d.transcript_count() == 1
    # The answer travelled back up: D answered, C, B and A relayed.
    assert "d answers: hello > a > b > c" in response.json()["final_content"]


def test_setting_above_the_clamp_is_clamped_to_ten(make_site: MakeSite) -> None:
    a = make_site("a")
    a.host.settings.set("max_chain_depth", 50)  # valid, clamped to [1, 10]
    headers = {**a.auth(), HEADER_CHAIN_DEPTH: "9"}
    refused = httpx.post(f"{a.url}/chat", json={"message": "x"}, headers=headers,
                         timeout=TIMEOUT)
    assert refused.status_code == 429
    assert refused.json()["data"]["ceiling"] == 10
    headers[HEADER_CHAIN_DEPTH] = "8"
    assert httpx.post(f"{a.url}/chat", json={"message": "x"}, headers=headers,
                      timeout=TIMEOUT).status_code == 200


def test_top_level_run_starts_at_depth_zero(make_site: MakeSite) -> None:
    a, b, c, d = chain_abcd(make_site)
    from datamachine.default_plugins.remote_agent import call_remote_agent

    # A run that nobody called over HTTP: depth 0, so B lands at 1, C at 2, D at 3 (refused).
    with bound_host(a.host):
        result = a.host.run_conversation([{"role": "user", "content": "hi"}],
                                         tools=[call_remote_agent], mode="chat")

    assert result.status == "completed", result.final_content
    assert [h.headers[HEADER_CHAIN_DEPTH.lower()] for h in b.server.app.chat_hits()] == ["0"], (
        result.model_dump_json())
    assert [h.status for h in c.server.app.chat_hits()] == [200]
    assert [h.status for h in d.server.app.chat_hits()] == [429]
    assert d.transcript_count() == 0
    assert "datamachine_chain_depth_exceeded" in result.final_content


def test_a_call_back_to_a_site_on_the_chain_is_refused_as_a_cycle(make_site: MakeSite) -> None:
    a = make_site("a", next_site="b")
    b = make_site("b", next_site="a")
    link(a, b)
    a.host.settings.set("max_chain_depth", 10)  # the cycle is refused far below the ceiling

    response = chat(a, "ping")

    assert response.status_code == 200
    hits = a.server.app.chat_hits()  # recorded as they are answered: the call back first
    assert sorted(h.status for h in hits) == [200, 409]
    [back] = [h for h in hits if h.status == 409]
    assert back.headers[HEADER_CHAIN_DEPTH.lower()] == "2"
    # The refused call back ran nothing on A: one model run (the original) and one transcript.
    assert a.transcript_count() == 1
    assert all(r.payload["caller_context"]["chain_depth"] == 1 for r in a.model.requests)
    b_run = b.host.transcripts.get_transcript(b.host.transcripts.list()[0].id)
    [b_tool] = [m for m in b_run.messages if m["type"] == "tool_result"]
    assert b_tool["payload"]["remote_status"] == 409
    assert b_tool["payload"]["remote_code"] == "datamachine_chain_cycle"
    assert b_tool["payload"]["remote_data"]["chain_sites"] == [a.site_id, b.site_id]


def test_request_already_listing_this_site_is_refused_as_a_cycle_before_any_work(
    make_site: MakeSite,
) -> None:
    a = make_site("a")
    headers = {**a.auth(), HEADER_CHAIN_SITES: f"elsewhere,{a.site_id}",
               HEADER_CHAIN_DEPTH: "0", HEADER_CHAIN_ID: "chain-1"}
    response = httpx.post(f"{a.url}/chat", json={"message": "x"}, headers=headers,
                          timeout=TIMEOUT)
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "datamachine_chain_cycle"
    assert body["data"] == {"chain_id": "chain-1", "site_id": a.site_id,
                            "chain_sites": ["elsewhere", a.site_id]}
    assert a.transcript_count() == 0
    assert a.model.requests == []


def test_unreachable_site_is_a_failed_tool_result(make_site: MakeSite) -> None:
    a = make_site("a", next_site="gone")
    gone = make_site("gone")
    link(a, gone)
    gone.server.stop()

    response = chat(a, "hello")

    assert response.status_code == 200
    [tool] = remote_outcomes(response.json())
    assert tool["success"] is False
    assert tool["error_type"] == "remote_agent_error"
    assert "could not be reached" in tool["error"]


def test_unknown_site_names_the_configured_ones(make_site: MakeSite) -> None:
    a = make_site("a", next_site="nowhere")
    b = make_site("b")
    link(a, b)
    response = chat(a, "hello")
    [tool] = remote_outcomes(response.json())
    assert tool["success"] is False
    assert "Unknown remote site 'nowhere'; known sites: b." in tool["error"]
    assert json.dumps(tool).find(b.token) == -1  # the model never sees a token
