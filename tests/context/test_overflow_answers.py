"""Every server's "prompt too long" answer is known for what it is, with its numbers; nothing
else is (DESIGN.md 21). The bodies are the servers' own (see tests/context/windowed_server.py
for where each comes from)."""

from __future__ import annotations

from typing import Any

import pytest

from datamachine.providers.overflow import overflow_of
from tests.context.windowed_server import WindowedModel


@pytest.mark.parametrize(("flavour", "expected"), [
    ("openai", (8192, 9013)), ("llama.cpp", (8192, 9013)),
    ("llama-cpp-python", (8192, 9013)), ("vllm", (8192, 9013))])
def test_each_servers_body_says_the_window_and_the_prompt(
        flavour: str, expected: tuple[int, int]) -> None:
    model = WindowedModel(window=8192, flavour=flavour)
    body = model._overflow_body(9013, 200, 8192)
    error: Any = body.get("error", body)
    detail = error["message"]
    assert overflow_of(400, body, detail) == expected


def test_ollama_says_it_in_a_500() -> None:
    assert overflow_of(500, {"error": "input exceeds context length"},
                       "input exceeds context length") == (None, None)


@pytest.mark.parametrize(("status", "body", "detail"), [
    (400, {"error": {"message": "messages: field required", "code": None}},
     "messages: field required"),
    (429, {"error": {"message": "Rate limit reached: too many tokens per min",
                     "code": "rate_limit_exceeded"}}, "Rate limit reached: too many tokens"),
    (500, {"error": {"message": "boom", "code": "context_length_exceeded"}}, "boom"),
    (401, {"error": {"message": "maximum context length is 10"}},
     "maximum context length is 10"),
])
def test_other_errors_are_not_overflows(status: int, body: Any, detail: str) -> None:
    assert overflow_of(status, body, detail) is None
