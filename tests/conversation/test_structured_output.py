"""output_type=: the final answer validated, retried within the turn budget, result.output."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, Field

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.errors import UsageError
from datamachine.host import Host
from tests.providers.fake_openai import FakeOpenAIServer, Reply, completion

USER = [{"role": "user", "content": "Extract the invoice."}]


class Invoice(BaseModel):
    number: str
    total: float = Field(ge=0)


class Answers:
    """Replays answers; records each request."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.requests.append(request)
        return {"content": self.answers.pop(0)}


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def test_a_valid_answer_is_the_output_as_a_model_instance() -> None:
    model = Answers('```json\n{"number": "A-1", "total": 12.5}\n```')
    with boot(model) as host:
        result = host.run_conversation(USER, [], "scripted", "m", output_type=Invoice)
    assert result.status == "completed"
    assert result.output == Invoice(number="A-1", total=12.5)
    assert result.turn_count == 1


def test_a_wrong_answer_is_asked_again_and_each_retry_is_a_turn() -> None:
    model = Answers("Invoice A-1, 12.50 EUR", '{"number": "A-1", "total": -3}',
                    '{"number": "A-1", "total": 12.5}')
    with boot(model) as host:
        result = host.run_conversation(USER, [], "scripted", "m", output_type=Invoice)
    assert (result.status, result.turn_count) == ("completed", 3)
    assert result.output == Invoice(number="A-1", total=12.5)
    second, third = model.requests[1].messages[-1], model.requests[2].messages[-1]
    assert "It was not accepted: it is not JSON" in second["content"]
    assert "total: Input should be greater than or equal to 0" in third["content"]
    retries = [m for m in result.messages if m.metadata.get("type") == "output_retry"]
    assert len(retries) == 2


def test_no_valid_answer_when_no_turn_is_left_is_incomplete() -> None:
    model = Answers("nope", "still nope")
    with boot(model) as host:
        result = host.run_conversation(USER, [], "scripted", "m", max_turns=2,
                                       output_type=Invoice)
    assert result.status == "incomplete"
    assert result.output is None
    assert result.warning is not None
    assert result.warning.startswith("The final answer did not match output_type Invoice: ")


def test_single_turn_with_a_wrong_answer_is_incomplete() -> None:
    with boot(Answers("{}")) as host:
        result = host.run_conversation(USER, [], "scripted", "m", single_turn=True,
                                       output_type=Invoice)
    assert (result.status, result.output) == ("incomplete", None)
    assert "number" in (result.warning or "")


def test_a_json_schema_dict_gives_the_decoded_value() -> None:
    schema = {"title": "Tags", "type": "array", "items": {"type": "string"}, "minItems": 1}
    model = Answers("[]", '["a", "b"]')
    with boot(model) as host:
        result = asyncio.run(host.arun_conversation(USER, [], "scripted", "m",
                                                    output_type=schema))
    assert result.output == ["a", "b"]
    assert "should be non-empty" in model.requests[1].messages[-1]["content"]


def test_a_budget_stop_stays_budget_exceeded() -> None:
    script = [{"tool_calls": [{"name": "nothing", "parameters": {"i": i}}]} for i in range(3)]
    with boot() as host:
        result = host.run_conversation(USER, [], "scripted", "m", max_turns=2,
                                       output_type=Invoice,
                                       payload={"script": script, "final_summary": False})
    assert (result.status, result.output) == ("budget_exceeded", None)


@pytest.mark.parametrize("bad", [int, {"type": "nonsense"}, "Invoice"])
def test_a_bad_output_type_is_a_usage_error(bad: Any) -> None:
    with boot() as host, pytest.raises(UsageError, match="output_type"):
        host.run_conversation(USER, [], "scripted", "m", output_type=bad)


def test_the_schema_goes_to_openai_as_response_format() -> None:
    with FakeOpenAIServer() as server, boot() as host:
        server.enqueue(Reply(body=completion('{"number": "B-2", "total": 3}')))
        host.settings.set("openai_base_url", server.url + "/v1")
        result = host.run_conversation(USER, [], "openai", "m", output_type=Invoice)
        sent = server.requests[0].json["response_format"]
    assert result.output == Invoice(number="B-2", total=3)
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["name"] == "Invoice"
    assert sent["json_schema"]["schema"]["required"] == ["number", "total"]


def test_chat_and_continue_take_an_output_type_too() -> None:
    with boot(Answers("x", '{"number": "C", "total": 1}')) as host:
        session = host.chat_sessions.create()
        chatted = host.chat(session.id, "go", output_type=Invoice)
        assert chatted.output == Invoice(number="C", total=1)
    with boot(Answers("draft", '{"number": "D", "total": 2}')) as host:
        first = host.run_conversation(USER, [], "scripted", "m", max_turns=1)
        assert (first.status, first.output) == ("completed", None)
        assert first.transcript_session_id is not None
        resumed = host.continue_conversation(first.transcript_session_id, 1,
                                             output_type=Invoice)
        assert resumed.output == Invoice(number="D", total=2)
