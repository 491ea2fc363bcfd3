"""Fuzzing the public entry points: whatever a caller passes, only typed errors come out.

``datamachine.run_conversation`` gets arbitrary messages, tools, provider and model names,
modes, payloads (every runtime key among them, and scripts the scripted provider plays, with
tool calls and usage), turn limits and output types; ``host.chat`` arbitrary session ids,
messages and payloads; ``host.settings`` arbitrary keys and JSON-ish values. Anything raised
must be a ``DataMachineError`` or an ``AgentsAPIError``, never a raw ``ValueError``,
``TypeError`` or ``OverflowError``; a value ``set`` accepts must read back equal and must not
break the next run.

Deterministic (``derandomize=True``, no example database) and fast (each test a few seconds):
every example gets a fresh host on an in-memory database, so nothing carries over between
examples. The scripted provider answers, so no network is used.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bootstrap
import datamachine
from agents_api import AgentsAPIError
from datamachine import ConversationResult, DataMachineError, tool
from datamachine.api import reset_default_host
from datamachine.payload_keys import RUNTIME_KEYS

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TYPED = (DataMachineError, AgentsAPIError)

# Values a caller might pass anywhere: JSON, plus the numbers and text JSON cannot hold and the
# integers SQLite and float() cannot take.
EDGES = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**30, -(2**63), 2**63, -0.0,
                     "", " ", "\ud800", "x" * 300, "1", "Chat", "\n"]),
    # An integer too long for repr() (ValueError past 4,300 digits), built so that hypothesis
    # need not print it.
    st.just(5000).map(lambda digits: 10**digits))
LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                 EDGES)
JSONISH = st.recursive(LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@tool
def echo(text: str = "") -> str:
    """Say it back."""
    return text


@tool
def claims(flag: bool = True) -> dict[str, Any]:
    """A tool whose answer carries keys the product uses itself."""
    return {"success": True, "result": {"ok": flag}, "rejected": flag, "_dm_rejected": flag}


@tool
def broken(n: int = 0) -> int:
    """Always fails."""
    raise RuntimeError(f"broken {n}")


TOOLS = [echo, claims, broken]
TOOL_NAMES = st.sampled_from(["echo", "claims", "broken", "missing", ""])
CALL = st.fixed_dictionaries(
    {"name": st.one_of(TOOL_NAMES, JSONISH)},
    optional={"id": st.one_of(st.text(max_size=4), JSONISH),
              "parameters": st.one_of(st.dictionaries(st.sampled_from(["text", "flag", "n"]),
                                                      JSONISH, max_size=2), JSONISH)})
USAGE = st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens",
                                         "cost"]), JSONISH, max_size=3)
RESPONSE = st.fixed_dictionaries({}, optional={
    "content": st.one_of(st.text(max_size=20), JSONISH),
    "tool_calls": st.one_of(st.lists(CALL, max_size=2), JSONISH),
    "usage": st.one_of(USAGE, JSONISH),
    "finish_reason": st.one_of(st.sampled_from(["stop", "length", "tool_calls"]), JSONISH),
})
SCRIPT = st.one_of(st.lists(RESPONSE, max_size=4), JSONISH)
PAYLOAD_KEY = st.one_of(st.sampled_from(sorted(RUNTIME_KEYS | {"job_id", "agent_slug",
                                                                "engine_data"})),
                        st.text(max_size=6))


def _keyed(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=4)), JSONISH,
                           max_size=3)


def _raising_sink(event: str, payload: dict[str, Any]) -> None:
    raise RuntimeError(f"sink broke on {event}")


# Runtime options shaped like the real ones, so the fuzz reaches past their first check.
SHAPED = st.fixed_dictionaries({}, optional={
    "completion_assertions": _keyed(["required_tool_names", "minimum_successful_tool_counts",
                                     "required_tool_parameters", "required_outputs"]),
    "tool_runtime_rules": st.lists(_keyed(["type", "after_tool", "limited_tools", "max_calls",
                                           "then_require_one_of", "before_tool",
                                           "require_prior_tool", "blocked_tools",
                                           "until_one_of"]), max_size=2),
    "budget_pressure": st.one_of(st.booleans(), st.dictionaries(
        st.sampled_from(["conversation_turns", "tool_calls", "total_tokens"]),
        st.one_of(st.just(True), _keyed(["tiers", "role", "wrap_up"])), max_size=2)),
    "model_options": _keyed(["temperature", "top_p", "max_tokens", "seed", "stop",
                             "tool_choice", "response_format"]),
    "budget_ceilings": _keyed(["conversation_turns", "tool_calls", "total_tokens", "cost"]),
    "event_sink": st.sampled_from([_raising_sink, None]),
    "max_seconds": st.one_of(st.floats(0.001, 5), JSONISH),
    "transcript_session_id": st.one_of(st.text(min_size=1, max_size=8), JSONISH),
})
PAYLOAD = st.one_of(
    st.tuples(st.dictionaries(PAYLOAD_KEY, JSONISH, max_size=4), SHAPED).flatmap(
        lambda parts: st.one_of(st.just({**parts[0], **parts[1]}),
                                SCRIPT.map(lambda s: {**parts[0], **parts[1], "script": s}))),
    JSONISH)
ROLE = st.one_of(st.sampled_from(["user", "assistant", "system", "tool"]), JSONISH)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": st.one_of(st.text(max_size=20), JSONISH)}),
    st.dictionaries(st.sampled_from(["role", "content", "type", "payload", "metadata",
                                     "schema", "version"]), JSONISH, max_size=5),
    JSONISH)
MESSAGES = st.one_of(st.just([{"role": "user", "content": "go"}]), st.lists(MESSAGE, max_size=3),
                     JSONISH)
MODE = st.one_of(st.sampled_from(["pipeline", "chat", "system", "support,chat"]), JSONISH)
OUTPUT_TYPE = st.one_of(st.none(), st.just({"type": "object"}), JSONISH)


@contextlib.contextmanager
def fresh_default_host() -> Iterator[None]:
    """The default host, booted anew on an in-memory database with no installed plugins."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DATAMACHINE_DB", ":memory:")
        patch.setenv("DATAMACHINE_LOAD_PLUGINS", "")
        reset_default_host()
        try:
            yield
        finally:
            reset_default_host()


@FUZZ
@given(messages=MESSAGES, tools=st.one_of(st.just(TOOLS), st.none(), JSONISH),
       provider=st.one_of(st.none(), st.just("scripted"), JSONISH),
       model=st.one_of(st.none(), st.just("m"), JSONISH), mode=MODE, payload=PAYLOAD,
       max_turns=st.one_of(st.none(), st.integers(1, 5), JSONISH),
       single_turn=st.one_of(st.booleans(), JSONISH), output_type=OUTPUT_TYPE)
def test_run_conversation_raises_only_typed_errors(
        messages: Any, tools: Any, provider: Any, model: Any, mode: Any, payload: Any,
        max_turns: Any, single_turn: Any, output_type: Any) -> None:
    with fresh_default_host():
        try:
            result = datamachine.run_conversation(messages, tools, provider, model, mode,
                                                  payload, max_turns, single_turn,
                                                  output_type=output_type)
        except TYPED:
            return
        assert isinstance(result, ConversationResult)
        for value in result.usage.values():  # usage that cannot be true never gets in
            if value is None:
                continue  # not reported (DESIGN.md 25): never a 0 that reads as "free"
            assert not isinstance(value, float) or math.isfinite(value)
            assert value >= 0


@FUZZ
@given(session_id=st.one_of(st.just("s1"), JSONISH), message=st.one_of(st.just("hi"), JSONISH),
       tools=st.one_of(st.none(), st.just(TOOLS), JSONISH),
       payload=st.one_of(st.none(), PAYLOAD), output_type=OUTPUT_TYPE)
def test_chat_raises_only_typed_errors(session_id: Any, message: Any, tools: Any, payload: Any,
                                       output_type: Any) -> None:
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False) as host:
        host.chat_sessions.create(session_id="s1")
        try:
            result = host.chat(session_id, message, tools, payload=payload,
                               output_type=output_type)
        except TYPED:
            return
        assert isinstance(result, ConversationResult)


SETTING_KEYS = st.one_of(
    st.sampled_from(["max_turns", "max_tool_calls", "max_run_seconds", "request_timeout",
                     "connect_timeout", "chat_max_turns", "confirmation", "default_provider",
                     "default_model", "budget_pressure", "model_options", "prices",
                     "max_cost_usd", "max_total_tokens", "spend_limits", "providers",
                     "provider_max_retries", "max_request_bytes", "x_note"]),
    st.text(max_size=12), JSONISH)


@FUZZ
@given(key=SETTING_KEYS, value=JSONISH)
def test_settings_set_and_get_raise_only_typed_errors_and_round_trip(key: Any,
                                                                     value: Any) -> None:
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False) as host:
        with contextlib.suppress(*TYPED):
            host.settings.get(key)
        try:
            host.settings.set(key, value)
        except TYPED:
            return
        assert host.settings.get(key) == value  # what set accepts reads back the same
        assert host.settings.all()[key] == value
        # and a setting set accepted never breaks a run with a raw exception
        with contextlib.suppress(*TYPED):
            host.run_conversation([{"role": "user", "content": "go"}])


@FUZZ
@given(messages=MESSAGES, mode=MODE, payload=PAYLOAD)
def test_a_refused_run_writes_nothing(messages: Any, mode: Any, payload: Any) -> None:
    # Issue 39: every refusal comes before anything is stored (no transcript rows, no job
    # touched); the inputs that used to run or fail late are pinned in test_hardening_inputs.
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False) as host:
        job = host.jobs.create()
        refused = False
        try:
            host.run_conversation(messages, TOOLS, "scripted", "m", mode, payload)
        except datamachine.UsageError:
            refused = True
        except TYPED:
            return  # a failure during the run (a policy that raised) may have run turns
        if refused:
            assert host.transcripts.list() == []
            assert host.jobs.get(job.id).status == "pending"
            assert [j.id for j in host.jobs.list()] == [job.id]
