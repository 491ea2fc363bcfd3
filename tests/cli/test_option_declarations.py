"""Providers declare their model options; ``-o`` of another key is refused, as ``llm`` refuses
``-o temprature 0`` (DESIGN.md 25), unless ``--option-passthrough``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import bootstrap
from datamachine import ProviderResponse, hookimpl
from datamachine.cli import cli
from datamachine.providers.options import OPENAI_OPTIONS, declared_options
from tests.providers.fake_openai import FakeOpenAIServer, Reply, completion


def invoke(db: Path, *args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["--db", str(db), *args])
    return done.exit_code, done.stdout, done.stderr


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        with bootstrap.boot(tmp_path / "o.db", load_entrypoints=False) as host:
            host.settings.set("openai_base_url", fake.url + "/v1")
        yield fake


def test_each_built_in_provider_declares_its_options() -> None:
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        assert declared_options(host.providers.get("openai")) == OPENAI_OPTIONS == {
            "temperature", "top_p", "max_tokens", "seed", "stop", "tool_choice",
            "parallel_tool_calls", "response_format"}
        assert declared_options(host.providers.get("scripted")) == frozenset()
        host.settings.set("providers", {"local": {"type": "openai",
                                                  "base_url": "http://127.0.0.1:9/v1"}})
        assert declared_options(host.providers.get("local")) == OPENAI_OPTIONS


def test_the_anthropic_plugin_declares_its_own() -> None:
    from datamachine_anthropic import AnthropicProvider

    declared = declared_options(AnthropicProvider())
    assert declared is not None
    assert {"max_tokens", "top_k", "thinking", "stop", "tool_choice"} <= declared
    assert "seed" not in declared  # not sent to the Messages API: refused, not dropped


def test_a_misspelt_option_is_refused_with_a_suggestion_and_nothing_is_sent(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    code, out, err = invoke(tmp_path / "o.db", "run", "hi", "--provider", "openai", "-m", "m",
                            "-o", "temprature", "0")
    assert code == 2
    assert out == ""
    assert "-o temprature: the openai provider has no option 'temprature' (did you mean " \
           "'temperature'?)" in err
    assert "--option-passthrough" in err
    assert server.requests == []
    with bootstrap.boot(tmp_path / "o.db", load_entrypoints=False) as host:
        assert host.transcripts.list() == []


def test_passthrough_sends_an_undeclared_option_as_it_is(tmp_path: Path,
                                                          server: FakeOpenAIServer) -> None:
    server.enqueue(Reply(body=completion("ok")))
    code, out, err = invoke(tmp_path / "o.db", "run", "hi", "--provider", "openai", "-m", "m",
                            "-o", "top_k", "40", "-o", "temperature", "0",
                            "--option-passthrough")
    assert code == 0, err
    assert out == "ok\n"
    body = server.requests[0].json
    assert (body["top_k"], body["temperature"]) == (40, 0.0)


def test_chat_refuses_an_undeclared_option_before_it_makes_a_session(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    code, _, err = invoke(db, "chat", "-o", "temperature", "0")
    assert code == 2
    assert "the scripted provider declares no model options" in err
    with bootstrap.boot(db, load_entrypoints=False) as host:
        assert host.chat_sessions.list() == []
    code, out, err = invoke(db, "chat", "-o", "temperature", "0", "--option-passthrough")
    assert code == 0, err
    assert "Chat session" in out


class _Undeclared:
    """A plugin provider that declares nothing: every ``-o`` key is taken, as before."""

    name = "plain"

    def complete(self, request: object) -> ProviderResponse:
        return ProviderResponse(content=json.dumps(getattr(request, "options", {})))


class _PlainPlugin:
    @hookimpl
    def register_providers(self) -> list[object]:
        return [_Undeclared()]


def test_a_provider_that_declares_nothing_takes_every_option() -> None:
    from datamachine.cli.model_options import check_declared_options
    from datamachine.errors import UsageError

    with bootstrap.boot(":memory:", plugins=[_PlainPlugin()], load_entrypoints=False) as host:
        check_declared_options(host, "plain", {"anything": 1}, passthrough=False)
        with pytest.raises(UsageError, match="did you mean 'max_tokens'"):
            check_declared_options(host, "openai", {"max_token": 1}, passthrough=False)
        check_declared_options(host, "openai", {"max_token": 1}, passthrough=True)


def test_models_json_lists_each_providers_declared_options(tmp_path: Path) -> None:
    code, out, err = invoke(tmp_path / "m.db", "models", "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)["providers"]}
    assert rows["openai"]["options"] == sorted(OPENAI_OPTIONS)
    assert rows["scripted"]["options"] == []
