"""Every public entry point refuses a bad argument with a typed error naming it.

Each test here pins one input that used to escape as a raw Python exception (``ValueError``,
``OverflowError``, ``TypeError``, ``UnicodeEncodeError``) or to be accepted and break something
later; now it is a ``DataMachineError`` (or an ``AgentsAPIError`` from the generic loop) that
names the field and the fix, raised before anything runs or is stored.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import bootstrap
from agents_api import IterationBudget
from agents_api.errors import InvalidBudget, brief_repr
from datamachine import InvalidSetting, PayloadKeyWarning, UsageError, hookimpl
from datamachine.host import Host

USER = [{"role": "user", "content": "go"}]
HUGE = 10**400  # float(HUGE) raises OverflowError


# -- 1. wall-clock durations -----------------------------------------------------------------

@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"),
                                     pytest.param(HUGE, id="400-digit int"),
                                     pytest.param(10**5000, id="5000-digit int"),
                                     0, -1, True, "60"])
def test_payload_max_seconds_that_no_clock_can_count_is_a_usage_error(
        host: Host, seconds: Any) -> None:
    with pytest.raises(UsageError, match=r"payload\['max_seconds'\]"):
        host.run_conversation(USER, payload={"max_seconds": seconds})
    assert host.transcripts.list() == []


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"),
                                     pytest.param(HUGE, id="400-digit int")])
def test_duration_settings_refuse_nan_infinity_and_overflow(host: Host, seconds: Any) -> None:
    # max_run_seconds is the wall clock budget's setting: its budget refuses it
    # (InvalidBudgetValue); the timeouts are plain settings (InvalidSetting).
    for key in ("max_run_seconds", "request_timeout", "connect_timeout"):
        with pytest.raises(UsageError, match=key):
            host.settings.set(key, seconds)
        assert host.settings.get(key) is None


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"),
                                     pytest.param(HUGE, id="400-digit int")])
def test_iteration_budget_refuses_a_time_rail_that_never_fires(seconds: Any) -> None:
    with pytest.raises(InvalidBudget, match="max_seconds"):
        IterationBudget("turns", 3, max_seconds=seconds)


def test_a_huge_value_is_named_by_its_size_not_printed() -> None:
    # repr() of a 5,000-digit integer raises ValueError; the message must still be written.
    assert brief_repr(10**5000) == "an integer of about 5,001 digits"
    assert brief_repr("x" * 500).endswith("...")
    assert len(brief_repr("x" * 500)) == 80
    assert brief_repr(2**63) == "9223372036854775808"


# -- 2. a message's payload ------------------------------------------------------------------

@pytest.mark.parametrize("payload", ["abc", [["a", 1]], 5])
def test_a_message_whose_payload_is_not_a_dict_is_a_usage_error(host: Host, payload: Any) -> None:
    with pytest.raises(UsageError, match=r"messages\[0\]: 'payload' must be a dict"):
        host.run_conversation([{"role": "user", "content": "x", "payload": payload}])


# -- 3. a payload that is not a mapping, at every entry point taking one --------------------

def _entry_points(host: Host, payload: Any, output_type: Any) -> dict[str, Any]:
    """Each host entry point that takes a payload, called with it (and, where it takes one,
    an ``output_type``, which is added to the payload)."""
    import asyncio

    async def drain(stream: Any) -> list[Any]:
        return [event async for event in stream]

    schema = output_type
    return {
        "run_conversation": lambda: host.run_conversation(USER, payload=payload,
                                                          output_type=schema),
        "arun_conversation": lambda: asyncio.run(host.arun_conversation(
            USER, payload=payload, output_type=schema)),
        "stream_conversation": lambda: list(host.stream_conversation(
            USER, payload=payload, output_type=schema)),
        "astream_conversation": lambda: asyncio.run(drain(host.astream_conversation(
            USER, payload=payload, output_type=schema))),
        "chat": lambda: host.chat("s1", "hi", payload=payload, output_type=schema),
        "achat": lambda: asyncio.run(host.achat("s1", "hi", payload=payload,
                                                output_type=schema)),
        "resume": lambda: host.resume("s1", True, payload=payload),
        "aresume": lambda: asyncio.run(host.aresume("s1", True, payload=payload)),
    }


ENTRY_POINTS = ["run_conversation", "arun_conversation", "stream_conversation",
                "astream_conversation", "chat", "achat", "resume", "aresume"]


@pytest.mark.parametrize("output_type", [None, {"type": "object"}], ids=["plain", "output_type"])
@pytest.mark.parametrize("payload", ["x", [("a", 1)], 3], ids=["str", "pairs", "int"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_payload_that_is_not_a_mapping_is_a_usage_error_at_every_entry_point(
        host: Host, entry: str, payload: Any, output_type: Any) -> None:
    host.chat_sessions.create(session_id="s1")
    with pytest.raises(UsageError, match="payload must be a dict"):
        _entry_points(host, payload, output_type)[entry]()
    assert host.transcripts.list() == []


@pytest.mark.parametrize("entry", ["stream_conversation", "astream_conversation"])
def test_a_stream_refuses_an_event_sink_it_would_wrap(host: Host, entry: str) -> None:
    # Wrapped in the stream's own sink, a bad one passed the payload check and then raised at
    # every event, so the stream saw none of them.
    with pytest.raises(UsageError, match=r"payload\['event_sink'\]"):
        _entry_points(host, {"event_sink": 5}, None)[entry]()


# -- 4. setting keys and values ---------------------------------------------------------------

@pytest.mark.parametrize("key", [None, 1, 2.5, ("a",), ["max_turns"], b"max_turns", "Max Turns",
                                 "max_turns\n",
                                 "", "9lives"])
def test_every_settings_call_names_a_key_that_is_not_a_setting_name(host: Host,
                                                                     key: Any) -> None:
    for call in (host.settings.get, host.settings.stored, host.settings.source,
                 host.settings.delete, lambda k: host.settings.set(k, 1)):
        with pytest.raises(InvalidSetting, match=r"Setting key .* must be a string of lowercase"):
            call(key)


@pytest.mark.parametrize(("value", "where"), [(float("nan"), "'x_note'"),
                                              ({"a": [1, float("inf")]}, r"'x_note'\['a'\]\[1\]")])
def test_a_setting_value_holding_nan_or_infinity_is_refused(host: Host, value: Any,
                                                            where: str) -> None:
    # Stored as NaN it read back unequal to itself, and is not JSON for any other reader.
    with pytest.raises(InvalidSetting, match=where + " cannot be stored: NaN and infinities"):
        host.settings.set("x_note", value)
    assert host.settings.get("x_note") is None


def test_job_engine_data_holding_nan_is_refused(host: Host) -> None:
    with pytest.raises(UsageError, match=r"engine_data\['x'\] cannot be stored: NaN"):
        host.jobs.create(engine_data={"x": float("nan")})
    job = host.jobs.create()
    with pytest.raises(UsageError, match=r"merge\['y'\]\[0\] cannot be stored: NaN"):
        host.jobs.merge_engine_data(job.id, {"y": [float("-inf")]})
    assert host.jobs.get(job.id).engine_data == {}


# -- the stores' other entry points -----------------------------------------------------------

BAD_IDS = [None, 5, 2**63, ["a"], {"a": 1}, "", "x" * 201, "\ud800"]


@pytest.mark.parametrize("session_id", BAD_IDS)
def test_chat_session_calls_name_a_value_that_cannot_be_a_session_id(host: Host,
                                                                     session_id: Any) -> None:
    # A list, 2**63 or a lone surrogate reached SQLite (ProgrammingError, OverflowError,
    # UnicodeEncodeError); the rest were a ChatSessionNotFound for an id nobody could create.
    host.chat_sessions.create(session_id="s")
    for call in (host.chat_sessions.get, host.chat_sessions.abort, host.chat_sessions.messages,
                 host.chat_sessions.reset_turns, lambda s: host.chat_sessions.add_turns(s, 1),
                 lambda s: host.chat(s, "hi")):
        with pytest.raises(UsageError, match="A session id must be"):
            call(session_id)
    assert host.chat_sessions.get("s").status == "active"


@pytest.mark.parametrize("n", [2**63, 10_001, -1])
def test_add_turns_refuses_more_than_any_limit_at_once(host: Host, n: int) -> None:
    session = host.chat_sessions.create()
    with pytest.raises(UsageError, match="add_turns needs an integer from 0 to 10,000"):
        host.chat_sessions.add_turns(session.id, n)


def test_a_lock_token_no_lock_was_given_releases_nothing(host: Host) -> None:
    token = host.transcripts.acquire("s", 30)
    assert token is not None
    assert host.transcripts.release("s", "\ud800") is False
    assert host.transcripts.renew("s", "\ud800", 30) is False
    assert host.transcripts.release("s", token) is True


def test_job_text_fields_must_be_storable_text(host: Host) -> None:
    with pytest.raises(UsageError, match="flow_step_id"):
        host.jobs.create(flow_step_id="\ud800")
    job = host.jobs.start(host.jobs.create().id)
    with pytest.raises(UsageError, match="reason"):
        host.jobs.fail(job.id, "\ud800")


@pytest.mark.parametrize("name", [2**63, "\ud800", ["a"]])
def test_a_value_sqlite_cannot_take_is_a_usage_error_even_where_no_check_names_it(
        host: Host, name: Any) -> None:
    # tokens.revoke checks nothing itself: the stores' shared SQL helpers are the net.
    with pytest.raises(UsageError, match="Cannot revoke an API token: a value given cannot be "
                                         "stored"):
        host.tokens.revoke(name)
    assert not host.db.conn.in_transaction


# -- 8. a tool cannot forge the executor's refusal mark ----------------------------------------

def test_a_tool_returning_rejected_true_is_an_ordinary_result(host: Host) -> None:
    from datamachine import tool

    @tool
    def publish(title: str) -> dict[str, Any]:
        """Publish a post."""
        return {"success": True, "result": {"id": 7, "title": title}, "rejected": True}

    script = [{"tool_calls": [{"id": "c1", "name": "publish", "parameters": {"title": "t"}}]},
              {"content": "Published."}]
    result = host.run_conversation(
        USER, [publish], "scripted", "m", payload={
            "script": script,
            "completion_assertions": {"minimum_successful_tool_counts": {"publish": 1}}})
    # It ran and succeeded: it is a result, it counts, and its own data is kept.
    assert [entry["tool_call_id"] for entry in result.tool_execution_results] == ["c1"]
    assert result.tool_execution_results[0]["result"]["rejected"] is True
    assert result.completion_assertions_complete is True
    assert result.status == "completed"


# -- 9. usage a model reports that cannot be true ---------------------------------------------

BAD_USAGE = [{"prompt_tokens": -500, "completion_tokens": 7.5, "total_tokens": float("nan")},
             {"prompt_tokens": 10**13, "completion_tokens": float("inf"), "total_tokens": -1}]


def _metered(host: Host, usages: list[dict[str, Any]]) -> Any:
    from datamachine import tool

    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    script = [{"tool_calls": [{"id": "c1", "name": "ping"}], "usage": usages[0]},
              {"content": "done", "usage": usages[1]}]
    return host.run_conversation(USER, [ping], "scripted", "m", payload={
        "script": script, "budget_ceilings": {"total_tokens": 10**9}})


def test_usage_that_cannot_be_true_counts_as_not_reported_and_warns_once(
        host: Host, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="datamachine"):
        bad = _metered(host, BAD_USAGE)
    unreported = _metered(host, [{}, {}])
    # The meter charged what it charges a provider that reports nothing: its estimate.
    assert bad.budgets["total_tokens"]["current"] == unreported.budgets["total_tokens"]["current"]
    assert bad.budgets["total_tokens"]["current"] > 0
    # Not reported is None, never 0 (DESIGN.md 25).
    assert bad.usage == unreported.usage == {"prompt_tokens": None, "completion_tokens": None,
                                             "total_tokens": None}
    warnings = [r.getMessage() for r in caplog.records if "cannot be true" in r.getMessage()]
    assert len(warnings) == 1  # two bad answers, one run: one warning
    assert "provider 'scripted'" in warnings[0]
    assert "prompt_tokens=-500" in warnings[0]


def test_plausible_fields_are_kept_beside_a_bad_one(host: Host) -> None:
    result = _metered(host, [{"prompt_tokens": 100, "completion_tokens": -3},
                             {"prompt_tokens": 50.0, "completion_tokens": 5, "cost": 0.25}])
    assert result.usage == {"prompt_tokens": 150, "completion_tokens": 5, "total_tokens": None,
                            "cost": 0.25}


@pytest.mark.parametrize("usage", [{"prompt_tokens": True}, {"completion_tokens": "12"},
                                   {"total_tokens": [1]}])
def test_a_count_that_is_not_a_number_is_ignored_and_named(
        host: Host, usage: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    from datamachine.providers.normalize import normalize_response

    response = normalize_response({"content": "x", "usage": {"prompt_tokens": 3, **usage}})
    assert response.usage == ({"prompt_tokens": 3} if "prompt_tokens" not in usage else {})
    assert response.ignored_usage == usage
    assert normalize_response(response).ignored_usage == usage  # normalizing again keeps it


# -- 10. the Python API refuses what /chat refuses --------------------------------------------

MODES = ["chat", "support_bot", "a" * 64, "Chat", "CHAT", "support-bot", "chat!", "", " chat",
         "chat\n", "9lives", "_x", "a" * 65, "chät"]


def _http_refuses(body: dict[str, Any]) -> bool:
    from pydantic import ValidationError

    from datamachine.server.schemas import ChatRequest

    try:
        ChatRequest.model_validate(body)
    except ValidationError:
        return True
    return False


def _python_refuses(call: Any) -> bool:
    try:
        call()
    except UsageError:
        return True
    return False


class _DeclaresModes:
    """Declares every well-formed extension mode of MODES, so the form check alone decides."""

    @hookimpl
    def register_modes(self) -> list[str]:
        return ["support_bot", "a" * 64]


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_is_refused_by_the_python_api_exactly_when_chat_refuses_it(mode: str) -> None:
    # "Chat!" became "chat" and "" became "pipeline" here while /chat answered 422.
    http = _http_refuses({"message": "hi", "mode": mode})
    with bootstrap.boot(db_path=":memory:", plugins=[_DeclaresModes()],
                        load_entrypoints=False) as host:
        python = _python_refuses(lambda: host.run_conversation(USER, mode=mode))
        assert python == http
        if python:
            with pytest.raises(UsageError, match="is not a mode name"):
                host.run_conversation(USER, mode=mode)


@pytest.mark.parametrize(("mode", "closest"), [("nope", None), ("suport", "support"),
                                                ("chat,nope", None), ("chats", "chat")])
def test_a_well_formed_mode_nobody_declared_is_refused_naming_the_closest(
        mode: str, closest: str | None) -> None:
    # `--mode nope` ran as if it were chat.
    class Support:
        @hookimpl
        def register_modes(self) -> list[str]:
            return ["support"]

    with bootstrap.boot(db_path=":memory:", plugins=[Support()], load_entrypoints=False) as host:
        with pytest.raises(UsageError, match="is not a known mode") as caught:
            host.run_conversation(USER, mode=mode)
        assert "register_modes" in str(caught.value)
        if closest is not None:
            assert f"did you mean {closest!r}" in str(caught.value)
        assert host.transcripts.list() == []  # refused before anything was stored


@pytest.mark.parametrize("mode", [[], ["chat", "Support"], ["chat", 5], "chat,Support",
                                  "chat, support", 7])
def test_every_mode_of_a_multi_mode_run_is_a_mode_name(host: Host, mode: Any) -> None:
    with pytest.raises(UsageError, match="mode"):
        host.run_conversation(USER, mode=mode)


def test_several_modes_are_still_one_run() -> None:
    class Declares:
        @hookimpl
        def register_modes(self) -> list[str]:
            return ["support", "audit"]

    with bootstrap.boot(db_path=":memory:", plugins=[Declares()], load_entrypoints=False) as host:
        assert host.run_conversation(USER, mode="support,chat").mode == "support,chat"
        assert host.run_conversation(USER, mode=["system", "audit"]).mode == "system,audit"
        # A mode named twice is refused (issue 39), not quietly made one.
        with pytest.raises(UsageError, match="mode names 'system' twice"):
            host.run_conversation(USER, mode=["system", "audit", "system"])
        assert len(host.transcripts.list()) == 2


ROLES = ["system", "user", "assistant", "tool", "wizard", "User", "", " user", "developer"]


@pytest.mark.parametrize("role", ROLES)
def test_a_role_is_refused_by_the_python_api_exactly_when_chat_refuses_it(host: Host,
                                                                          role: str) -> None:
    # role "tool" reached the provider without a tool_call_id and failed the turn there.
    message = {"role": role, "content": "x"}
    http = _http_refuses({"messages": [message]})
    python = _python_refuses(lambda: host.run_conversation([message]))
    assert python == http
    if python:
        with pytest.raises(UsageError, match=r"messages\[0\]"):
            host.run_conversation([message])


@pytest.mark.parametrize(("message", "match"), [
    ({"role": "user", "content": "", "type": "tool_call",
      "metadata": {"tool_name": "t", "tool_call_id": "c"}}, "a tool_call message has role"),
    ({"role": "assistant", "content": "x", "type": "tool_result",
      "metadata": {"tool_name": "t", "tool_call_id": "c"}}, "a tool_result message has role"),
    ({"role": "tool", "content": "3 hits"}, "tool_result envelope"),
])
def test_a_tool_envelope_has_its_own_role(host: Host, message: dict[str, Any],
                                          match: str) -> None:
    with pytest.raises(UsageError, match=match):
        host.run_conversation([{"role": "user", "content": "go"}, message])


def test_an_empty_conversation_and_an_overlong_model_id_are_refused(host: Host) -> None:
    assert _http_refuses({"messages": []})
    with pytest.raises(UsageError, match="messages is empty"):
        host.run_conversation([])
    assert _http_refuses({"message": "hi", "model": "m" * 201})
    with pytest.raises(UsageError, match="model must be"):
        host.run_conversation(USER, model="m" * 201)


def test_a_tool_that_skipped_its_definition_check_is_refused_before_the_run(host: Host) -> None:
    from datamachine import InvalidToolDefinition, Tool

    good = Tool(name="lookup", description="Look up.", function=lambda: "x")
    renamed = good.model_copy(update={"name": "look up!"})  # model_copy does not validate
    with pytest.raises(InvalidToolDefinition, match=r"tools\['look up!'\]: name"):
        host.run_conversation(USER, [renamed])
    good.parameters["type"] = "array"  # the schema dict changed after definition
    with pytest.raises(InvalidToolDefinition, match=r"tools\['lookup'\]: parameters must be"):
        host.run_conversation(USER, [good])
    assert host.transcripts.list() == []


# -- found by the fuzz (tests/test_fuzz_entry_points.py) --------------------------------------

BIG = 10**5000  # repr() and json.loads() of it raise ValueError (more than 4,300 digits)


@pytest.mark.parametrize("payload", [
    {"final_summary": BIG}, {"confirmation": BIG}, {"token_name": BIG},
    {"transcript_lock_ttl": BIG}, {"budget_ceilings": {"conversation_turns": BIG}},
    {"budget_ceilings": {BIG: 1}}, {"budget_pressure": {BIG: True}},
    {"model_options": {BIG: 1}}, {"output_type": {"else": BIG}}, {"output_type": BIG},
], ids=lambda payload: next(iter(payload)))
def test_a_huge_integer_in_the_payload_is_a_usage_error_not_a_valueerror(
        host: Host, payload: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        host.run_conversation(USER, payload=payload)


@pytest.mark.parametrize(("key", "value"), [
    ("x_note", BIG), ("x_note", {"a": [BIG]}), ("max_cost_usd", HUGE), ("max_cost_usd", BIG),
    ("prices", {"m": {"input": HUGE, "output": 1}}), ("budget_pressure", BIG),
    ("max_request_bytes", BIG), ("max_turns", BIG),
], ids=["free-form", "nested", "usd-overflow", "usd-huge", "prices", "flag", "bytes", "turns"])
def test_a_setting_that_would_not_read_back_is_refused(host: Host, key: str,
                                                       value: Any) -> None:
    # "x_note" = 10**5000 was stored, and every later read of it raised ValueError.
    with pytest.raises(UsageError):
        host.settings.set(key, value)
    assert host.settings.all() == {k: v for k, v in host.settings.all().items() if k != key}


def test_a_lock_ttl_too_large_for_a_float_is_a_usage_error(host: Host) -> None:
    with pytest.raises(UsageError, match="A lock ttl"):
        host.transcripts.acquire("s", HUGE)


def test_text_json_cannot_carry_is_written_anyway() -> None:
    from agents_api.jsontext import compact_json

    # A lone surrogate (from a bad decoder) and a key too long to print used to raise.
    assert compact_json({"a\ud800": ["x\udfffy"]}) == '{"a\ufffd":["x\ufffdy"]}'
    assert compact_json({BIG: 1}) == '{"an integer of about 5,001 digits":1}'


def test_a_run_whose_payload_or_messages_hold_a_lone_surrogate_is_stored(host: Host) -> None:
    result = host.run_conversation([{"role": "user", "content": "caf\udce9"}],
                                   payload={"note": "\ud800", "transcript_session_id": "s"})
    assert result.status == "completed"
    assert host.transcripts.get("s")[0]["content"] == "caf\ufffd"


def test_iteration_budget_counts_stay_storable() -> None:
    with pytest.raises(InvalidBudget, match="no larger than 9223372036854775807"):
        IterationBudget("turns", 2**63)
    budget = IterationBudget("turns", 3)
    with pytest.raises(InvalidBudget):
        budget.set_current(BIG)
    assert budget.extend(2**63 - 1) == 2**63 - 1  # an extension saturates, never overflows


def test_a_pressure_notice_takes_a_role_a_provider_has(host: Host) -> None:
    with pytest.raises(UsageError, match=r"budget_pressure'\]\['conversation_turns'\]\.role"):
        host.run_conversation(USER, payload={
            "budget_pressure": {"conversation_turns": {"role": "wizard"}}})


@pytest.mark.parametrize(("key", "meant"), [("persist_transcipt", "persist_transcript"),
                                            ("Final_Summary", "final_summary"),
                                            ("scripts", "script"),
                                            ("max_second", "max_seconds")])
def test_a_near_miss_of_a_runtime_key_warns_naming_the_key_it_was_meant_to_be(
        host: Host, key: str, meant: str) -> None:
    # `persist_transcipt=False` was silently ignored: the run was stored anyway.
    with pytest.warns(PayloadKeyWarning, match=rf"{key!r}.*did you mean {meant!r}"):
        result = host.run_conversation(USER, payload={key: False})
    assert result.status == "completed"


def test_ordinary_payload_keys_do_not_warn(host: Host) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", PayloadKeyWarning)
        result = host.run_conversation(USER, payload={
            "job_id": None, "flow_step_id": "s1", "agent_slug": "a", "engine_data": {},
            "customer": "ACME", "output": "x", "model": "m", "persist": 1, "transcript": 2})
    assert result.status == "completed"


def test_continuing_a_run_whose_mode_is_no_longer_declared_names_the_recorded_mode(
        tmp_path: Any) -> None:
    class Research:
        @hookimpl
        def register_modes(self) -> list[str]:
            return ["research"]

    db = tmp_path / "m.db"
    with bootstrap.boot(db_path=db, plugins=[Research()], load_entrypoints=False) as host:
        done = host.run_conversation(USER, mode="research", max_turns=1,
                                     payload={"script": [{"tool_calls": [
                                         {"name": "nope", "parameters": {}}]}]})
    session = done.transcript_session_id
    assert session is not None
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        with pytest.raises(UsageError, match="recorded in mode 'research'"):
            host.continue_conversation(session, extend_by=1)
        # Refused before anything ran, and the lock was given back.
        assert host.transcripts.get_transcript(session).status == done.status
        assert host.transcripts.summary(session).locked_until is None


# -- issue 39: bad input that ran, or escaped untyped, at the public entry points -----------

class _Policy:
    """A completion policy that takes every natural answer as done."""

    def record_natural_completion(self, messages: Any, content: Any, context: Any) -> Any:
        from datamachine import Decision

        return Decision(complete=True)


@pytest.mark.parametrize(("messages", "mode", "payload", "field"), [
    pytest.param(USER, "pipeline", {1: "x"}, "payload keys must be names", id="int key"),
    pytest.param([{"role": "user"}], "pipeline", None, r"messages\[0\] has no 'content'",
                 id="no content"),
    pytest.param([{"role": "user", "content": None}], "pipeline", None,
                 r"messages\[0\] has no 'content'", id="content None"),
    pytest.param(USER, None, None, "mode is None", id="mode None"),
    pytest.param(USER, ["chat", "chat"], None, "mode names 'chat' twice", id="mode twice"),
    pytest.param(USER, "chat,chat", None, "mode names 'chat' twice", id="mode twice joined"),
    pytest.param(USER, "pipeline", {"completion_policy": 5},
                 r"payload\['completion_policy'\] must be an object", id="policy 5"),
    pytest.param(USER, "pipeline", {"engine_data": "x"},
                 r"payload\['engine_data'\] must be a dict", id="engine_data str"),
    pytest.param(USER, "pipeline", {"caller_context": "x"},
                 r"payload\['caller_context'\] must be", id="caller_context str"),
    pytest.param(USER, "pipeline", {"job_id": object()}, r"payload\['job_id'\] must be a job id",
                 id="job_id object"),
    pytest.param(USER, "pipeline", {"job_id": 1.5}, r"payload\['job_id'\] must be a job id",
                 id="job_id float"),
    pytest.param(USER, "pipeline", {"script": []}, r"payload\['script'\] has no responses",
                 id="empty script"),
    pytest.param(USER, "pipeline", {"script": "/etc/passwd"}, r"payload\['script'\] is a string",
                 id="script str path"),
    pytest.param(USER, "pipeline", {"script": {"content": "x"}},
                 r"payload\['script'\] must be a list", id="script dict"),
])
def test_bad_run_input_is_a_usage_error_naming_the_field_and_writes_nothing(
        host: Host, messages: Any, mode: Any, payload: Any, field: str) -> None:
    job = host.jobs.create()
    with pytest.raises(UsageError, match=field):
        host.run_conversation(messages, mode=mode, payload=payload)
    assert host.transcripts.list() == []
    assert [j.id for j in host.jobs.list()] == [job.id]  # no job touched or made
    assert host.jobs.get(job.id).status == "pending"


def test_good_context_and_a_policy_object_still_run(host: Host) -> None:
    job = host.jobs.create()
    result = host.run_conversation(USER, payload={
        "engine_data": {"k": 1}, "job_id": job.id, "completion_policy": _Policy(),
        "caller_context": {"chain_id": "a" * 32, "chain_depth": 1}})
    assert result.status == "completed"
    assert host.jobs.get(job.id).status == "completed"


def test_a_script_file_is_read_only_from_a_path_object(host: Host, tmp_path: Any) -> None:
    import json
    from pathlib import Path

    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"content": "from the file"}]))
    assert host.run_conversation(USER, payload={"script": script}).final_content == \
        "from the file"
    with pytest.raises(UsageError, match=r"payload\['script'\] is a string"):
        host.run_conversation(USER, payload={"script": str(script)})
    notes = tmp_path / "notes.txt"
    notes.write_text("[]")
    for path in (notes, Path(tmp_path), tmp_path / "missing.json"):
        with pytest.raises(UsageError, match=r"must be an existing \.json, \.yaml or \.yml"):
            host.run_conversation(USER, payload={"script": path})
    assert len(host.transcripts.list()) == 1


def test_a_queued_jobs_payload_can_never_name_a_script_file(host: Host) -> None:
    # A queued payload is JSON: a string is all it can hold, and a string never opens a file.
    from datamachine.conversation.payload import check_payload_is_data

    check_payload_is_data({"script": "/etc/passwd"})  # data, so it can be queued ...
    with pytest.raises(UsageError, match="is a string"):  # ... and the run refuses it
        host.run_conversation(USER, payload={"script": "/etc/passwd"})


def test_jobs_create_refuses_engine_data_that_would_read_back_otherwise(host: Host) -> None:
    cases: list[tuple[Any, str]] = [
        ({1: "x"}, "engine_data has the key 1"),
        ({"a": [{2: "y"}]}, r"engine_data\['a'\]\[0\] has the key 2")]
    for data, where in cases:
        with pytest.raises(UsageError, match=where):
            host.jobs.create(engine_data=data)
    assert host.jobs.list() == []


@pytest.mark.parametrize("current", [-1, 1.5, True, "0"])
def test_budgets_create_refuses_a_current_that_is_no_count(host: Host, current: Any) -> None:
    with pytest.raises(UsageError, match="current must be what the budget has used so far"):
        host.budgets.create("conversation_turns", current=current)
    assert host.budgets.create("conversation_turns", current=3).current() == 3


@pytest.mark.parametrize("token", [None, "", 5])
def test_transcripts_release_refuses_what_is_no_token(host: Host, token: Any) -> None:
    held = host.transcripts.acquire("s", 60)
    assert held is not None
    with pytest.raises(UsageError, match="token must be the lock token acquire"):
        host.transcripts.release("s", token)
    assert host.transcripts.release("s", held) is True


def _lookup(q: str, limit: int = 3) -> list[str]:
    return [q] * limit


@pytest.mark.parametrize(("properties", "named"), [
    ({"q": {"type": "strng"}}, r"parameters\.properties\.q\.type 'strng' is not a JSON-schema "
                               "type"),
    ({"q": {"type": ["string", "nul"]}}, r"'nul' is not a JSON-schema type"),
    ({"q": {"$ref": "#/$defs/Nope"}}, r"parameters\.properties\.q\.\$ref '#/\$defs/Nope' points "
                                      "to nothing"),
    ({"q": {"$ref": "https://example.com/schema"}}, r"points to nothing"),
    ({"q": {"type": "string", "enum": {"a", "b"}}}, r"parameters\.properties\.q\.enum is a "
                                                    r"Python set.*\(use a list\)"),
    ({"q": {"type": "number", "default": float("nan")}}, "which JSON cannot hold"),
    ({"q": {"type": "string"}, "extra": {"type": "string"}},
     r"parameters\.properties\.extra: _lookup\(\) takes no parameter 'extra' \(it takes: q, "
     r"limit\)"),
    ({"q": {"type": "string"}, "context": {"type": "string"}}, "takes no parameter 'context'"),
])
def test_a_tool_schema_is_refused_at_definition_naming_what_is_wrong(
        properties: dict[str, Any], named: str) -> None:
    from datamachine import InvalidToolDefinition, Tool

    with pytest.raises(InvalidToolDefinition, match=named):
        Tool(name="lookup", description="Look it up.", function=_lookup,
             parameters={"type": "object", "properties": properties})


def test_a_tool_schema_that_uses_refs_defs_and_kwargs_is_fine() -> None:
    from datamachine import Tool

    def anything(**arguments: Any) -> Any:
        return arguments

    schema = {"type": "object", "$defs": {"Place": {"type": "object", "properties": {
        "city": {"type": "string"}}}},
        "properties": {"place": {"$ref": "#/$defs/Place"},
                       "tags": {"type": "array", "items": {"type": ["string", "null"]}},
                       "type": {"enum": ["a", "b"]}}}
    made = Tool(name="anything", description="Any.", function=anything, parameters=schema)
    assert made.parameters["properties"]["place"] == {"$ref": "#/$defs/Place"}
