"""The pieces without a server: header parsing, admission, site ids, settings, status mapping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bootstrap
from datamachine.conversation.result import ConversationResult
from datamachine.default_plugins.remote_agent import load_remote_sites
from datamachine.errors import (
    ChainCycle,
    ChainDepthExceeded,
    InvalidCallerContext,
    InvalidSetting,
    UsageError,
)
from datamachine.host import Host
from datamachine.server.chain import (
    HEADER_CALLER_SITE,
    HEADER_CHAIN_DEPTH,
    HEADER_CHAIN_ID,
    HEADER_CHAIN_SITES,
    CallerContext,
    admit,
    parse_caller_headers,
)
from datamachine.server.site import DEFAULT_MAX_REQUEST_BYTES, ensure_site_id, max_request_bytes

ROOT = Path(__file__).resolve().parents[2]


def test_absent_headers_start_a_chain_at_depth_zero() -> None:
    inbound = parse_caller_headers([])
    assert inbound.depth == 0
    assert inbound.landing_depth == 1
    assert inbound.chain_id_generated is True
    assert len(inbound.chain_id) == 32


def test_header_names_are_case_insensitive_and_sites_are_deduplicated() -> None:
    inbound = parse_caller_headers([(HEADER_CHAIN_DEPTH.lower(), " 2 "),
                                    (HEADER_CHAIN_ID.upper(), "abc"),
                                    (HEADER_CHAIN_SITES, "a, b,a")])
    assert (inbound.depth, inbound.chain_id, inbound.chain_sites) == (2, "abc", ("a", "b"))
    assert inbound.chain_id_generated is False


@pytest.mark.parametrize("value", ["1000", "0"])
def test_depth_up_to_one_thousand_parses(value: str) -> None:
    assert parse_caller_headers([(HEADER_CHAIN_DEPTH, value)]).depth == int(value)


def test_depth_over_one_thousand_is_malformed() -> None:
    with pytest.raises(InvalidCallerContext) as info:
        parse_caller_headers([(HEADER_CHAIN_DEPTH, "1001")])
    assert info.value.header == HEADER_CHAIN_DEPTH


@pytest.mark.parametrize(("inbound", "accepted"), [(None, True), ("1", True), ("2", False)])
def test_default_ceiling_three_refuses_the_hop_landing_at_three(
    host: Host, inbound: str | None, accepted: bool,
) -> None:
    headers = [] if inbound is None else [(HEADER_CHAIN_DEPTH, inbound)]
    parsed = parse_caller_headers(headers)
    if accepted:
        assert admit(host, parsed, "here").chain_depth == parsed.depth + 1
    else:
        with pytest.raises(ChainDepthExceeded) as info:
            admit(host, parsed, "here")
        assert (info.value.chain_depth, info.value.ceiling, info.value.retry_after) == (3, 3, 60)


def test_max_chain_depth_setting_moves_the_ceiling(host: Host) -> None:
    host.settings.set("max_chain_depth", 1)
    with pytest.raises(ChainDepthExceeded):
        admit(host, parse_caller_headers([]), "here")  # lands at 1 = ceiling 1
    host.settings.set("max_chain_depth", 4)
    assert admit(host, parse_caller_headers([(HEADER_CHAIN_DEPTH, "2")]), "here").chain_depth == 3


def test_caller_site_equal_to_this_site_is_a_cycle(host: Host) -> None:
    with pytest.raises(ChainCycle) as info:
        admit(host, parse_caller_headers([(HEADER_CALLER_SITE, "here")]), "here")
    assert info.value.chain_sites == ["here"]


def test_cycle_wins_over_depth(host: Host) -> None:
    parsed = parse_caller_headers([(HEADER_CHAIN_DEPTH, "9"), (HEADER_CHAIN_SITES, "here")])
    with pytest.raises(ChainCycle):
        admit(host, parsed, "here")


def test_admitted_context_lists_the_caller_among_the_sites(host: Host) -> None:
    parsed = parse_caller_headers([(HEADER_CHAIN_SITES, "root"), (HEADER_CALLER_SITE, "mid"),
                                   (HEADER_CHAIN_DEPTH, "1"), (HEADER_CHAIN_ID, "c")])
    caller = admit(host, parsed, "here")
    assert caller.chain_sites == ("root", "mid")
    assert caller.outbound_headers("here", "agent-7") == {
        HEADER_CHAIN_ID: "c", HEADER_CHAIN_DEPTH: "2", HEADER_CALLER_SITE: "here",
        HEADER_CHAIN_SITES: "root,mid,here", "X-Datamachine-Caller-Agent": "agent-7"}


def test_caller_context_round_trips_through_the_payload() -> None:
    context = CallerContext(chain_id="c", chain_depth=2, chain_sites=("a",))
    assert CallerContext.from_payload({"caller_context": context.to_payload()}) == context
    top = CallerContext.from_payload({})
    assert top.chain_depth == 0
    assert top.outbound_headers("me")[HEADER_CHAIN_DEPTH] == "0"
    with pytest.raises(UsageError, match="chain_depth"):
        CallerContext.from_payload({"caller_context": {"chain_id": "c", "chain_depth": -1}})


def test_site_id_is_generated_once_and_survives_a_reboot(tmp_path: Path) -> None:
    path = tmp_path / "site.db"
    with bootstrap.boot(db_path=path, load_entrypoints=False) as first:
        first.settings.delete("site_id")  # whether or not boot already made one
        generated = ensure_site_id(first)
        assert len(generated) == 32
        assert first.settings.get("site_id") == generated
        assert ensure_site_id(first) == generated
    with bootstrap.boot(db_path=path, load_entrypoints=False) as second:
        assert ensure_site_id(second) == generated


def test_site_id_can_be_pinned_and_must_be_header_safe(host: Host,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    host.settings.set("site_id", "alpha")
    assert ensure_site_id(host) == "alpha"
    monkeypatch.setenv("DATAMACHINE_SITE_ID", "beta")
    assert ensure_site_id(host) == "beta"
    monkeypatch.setenv("DATAMACHINE_SITE_ID", "a,b")
    with pytest.raises(InvalidSetting, match="site_id"):
        ensure_site_id(host)


def test_max_request_bytes_defaults_to_one_mebibyte_and_is_validated(
    host: Host, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert max_request_bytes(host) == DEFAULT_MAX_REQUEST_BYTES == 1_048_576
    # The environment bypasses any write-time check, so the server checks what it reads.
    monkeypatch.setenv("DATAMACHINE_MAX_REQUEST_BYTES", "big")
    with pytest.raises(InvalidSetting, match="max_request_bytes"):
        max_request_bytes(host)
    from datamachine.errors import SiteMisconfigured
    from datamachine.server.app import create_app

    with pytest.raises(SiteMisconfigured, match="max_request_bytes") as refused:
        create_app(host)  # refused at startup, not on the first request
    assert refused.value.setting == "max_request_bytes"


def test_remote_sites_setting_is_validated(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_remote_sites(host) == {}
    host.settings.set("remote_sites", {"b": {"url": "http://b.example", "token": "dm_x"}})
    assert load_remote_sites(host)["b"].url == "http://b.example"
    # Bad values through the environment, which no write-time check sees.
    monkeypatch.setenv("DATAMACHINE_REMOTE_SITES", '{"b": {"url": "ftp://b", "token": "dm_x"}}')
    with pytest.raises(InvalidSetting, match="site 'b': url"):
        load_remote_sites(host)
    monkeypatch.setenv("DATAMACHINE_REMOTE_SITES", '["b"]')
    with pytest.raises(InvalidSetting, match="JSON object"):
        load_remote_sites(host)


@pytest.mark.parametrize(("status", "error_code", "http", "code"), [
    ("completed", None, 200, None),
    ("incomplete", None, 200, None),
    ("budget_exceeded", None, 200, None),
    ("aborted", None, 409, "session_aborted"),
    ("transcript_lock_contention", "transcript_lock_contention", 409, "session_lock_contention"),
    ("error", "provider_timeout", 502, "provider_error"),
    ("error", "completion_required_tool_unavailable", 422,
     "completion_required_tool_unavailable"),
    ("error", "transcript_lock_lost", 409, "session_lock_lost"),
    ("error", "transcript_write_failed", 503, "transcript_write_failed"),
])
def test_run_status_maps_to_the_lifecycle_table(status: str, error_code: str | None, http: int,
                                                code: str | None) -> None:
    from datamachine.server.app import result_response

    result = ConversationResult(status=status, error_code=error_code,
                                error="why" if error_code else None)
    response = result_response(result)
    assert response.status_code == http
    body = json.loads(bytes(response.body))
    if code is None:
        assert body["status"] == status
    else:
        assert body["code"] == code
        assert body["data"]["status"] == status


def test_tool_and_chain_modules_do_not_load_the_web_stack() -> None:
    code = ("import sys, bootstrap\n"
            "import datamachine.server.chain, datamachine.default_plugins.remote_agent\n"
            "h = bootstrap.boot(db_path=':memory:', load_entrypoints=False)\n"
            "print([m for m in ('starlette', 'uvicorn') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60).stdout.strip()
    assert out == "[]"
