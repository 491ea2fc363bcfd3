"""A hypothesis fuzz of ``/chat`` bodies and caller headers against a real server process:
whatever a caller sends, the answer is a status below 500 with the usual error shape, and the
server logs no unexpected failure."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile.conftest import Served, assert_no_paths

KNOWN_STATUSES = {200, 400, 403, 404, 409, 413, 422, 429}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12)

roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", ""]) | st.text(
    max_size=8)
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": st.text(max_size=30) | json_values, "name": json_values}), max_size=3)
chat_bodies = st.fixed_dictionaries({}, optional={
    "messages": messages | json_values,
    "message": st.text(max_size=30) | json_values,
    "session_id": st.text(max_size=30) | json_values,
    "mode": st.sampled_from(["chat", "pipeline", "system", "Chat", "a" * 70]) | json_values,
    "max_turns": st.integers(-5, 20_000) | json_values,
    "provider": st.sampled_from(["scripted", "openai", "nope", ""]) | json_values,
    "model": st.text(max_size=10) | json_values,
    "resume": st.fixed_dictionaries({}, optional={"approve": json_values,
                                                  "extend_by": json_values}) | json_values,
    "confirmation": st.sampled_from(["ask", "pause", "never"]) | json_values,
    "extra": json_values,
})
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30).map(
    str.strip)
caller_headers = st.dictionaries(
    st.sampled_from(["X-Datamachine-Chain-Id", "X-Datamachine-Chain-Depth",
                     "X-Datamachine-Chain-Sites", "X-Datamachine-Caller-Site"]),
    header_values, max_size=2)


def check(served: Served, response: httpx.Response) -> None:
    assert response.status_code in KNOWN_STATUSES, (response.status_code, response.text)
    if response.status_code != 200:
        body = response.json()
        assert set(body) == {"code", "message", "data"}, body
        assert_no_paths(served, response)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=chat_bodies | json_values, headers=caller_headers)
def test_any_chat_body_gets_a_typed_answer(served: Served, body: Any,
                                           headers: dict[str, str]) -> None:
    response = served.post(fuzz_token(served), content=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json", **headers})
    check(served, response)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_any_bytes_get_a_typed_answer(served: Served, raw: bytes) -> None:
    check(served, served.post(fuzz_token(served), content=raw))


def fuzz_token(served: Served) -> str:
    """One token for the module, with the site's rate limits off (the fuzz is one caller)."""
    cached = getattr(served, "_fuzz_token", None)
    if cached is None:
        served.host.settings.set("chat_rate_limit", 0)
        served.host.settings.set("chat_max_turns", "unlimited")
        cached = served.token("fuzz")
        served._fuzz_token = cached  # type: ignore[attr-defined]
    return str(cached)


def test_the_fuzzed_server_logged_no_unexpected_failure(served: Served) -> None:
    fuzz_token(served)
    log = served.log_text()
    assert "failed unexpectedly" not in log
    assert "Traceback" not in log
