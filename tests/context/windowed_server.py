"""A model with a context window, on loopback: an OpenAI-compatible Chat Completions server
that counts each request's prompt tokens its own way and refuses a prompt longer than its
window with the error body a real server sends (``flavour``):

- ``openai``: OpenAI's 400, ``"code": "context_length_exceeded"``, "This model's maximum
  context length is W tokens. However, your messages resulted in P tokens...";
- ``llama.cpp``: llama.cpp's server, ``"type": "exceed_context_size_error"`` with
  ``n_prompt_tokens`` and ``n_ctx``;
- ``llama-cpp-python``: its OpenAI-style body, counting the prompt *and* ``max_tokens``
  against the window ("...you requested X tokens (P in the messages, M in the completion)");
- ``vllm``: vLLM's ``{"object": "error", ...}`` body with the same sentence.

Its tokenizer is not the client's: a token is three bytes of the compact JSON of the messages
and tools, plus four per message (a chat template's overhead), so the client's first estimate
(four bytes a token) is too low and has to learn from the reported usage.

It plays a model that calls the first tool offered (``fetch_page``) ``calls`` times (page 1, 2,
...) and then answers; a request whose system message asks for a compaction summary gets a
short summary, a final summary request (``[BUDGET EXHAUSTED]``) a closing text. Every request
is checked as OpenAI checks it: a ``tool`` message must answer a call of the assistant message
before it, and every call must be answered; a request that breaks this is refused with OpenAI's
400 and recorded in ``pairing_errors``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import datamachine

FLAVOURS = ("openai", "llama.cpp", "llama-cpp-python", "vllm")


@dataclass
class Seen:
    """One request as the server saw it."""

    prompt_tokens: int
    messages: list[dict[str, Any]]
    refused: bool
    kind: str  # "turn", "compaction" or "final_summary"
    max_tokens: int | None = None


@dataclass
class WindowedModel:
    """The server's state (see the module docstring)."""

    window: int = 8192
    calls: int = 199
    flavour: str = "openai"
    seen: list[Seen] = field(default_factory=list)
    pairing_errors: list[str] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    # A smaller window for final summary requests only (a server whose template makes them
    # longer than the turns were), None: the same window.
    summary_window: int | None = None
    issued: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> WindowedModel:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.model = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- what a request is ------------------------------------------------------------------
    @staticmethod
    def tokens(body: dict[str, Any]) -> int:
        text = json.dumps([body.get("messages", []), body.get("tools", [])],
                          separators=(",", ":"))
        return math.ceil(len(text.encode()) / 3) + 4 * len(body.get("messages", []))

    @staticmethod
    def pairing_problem(messages: list[dict[str, Any]]) -> str | None:
        open_calls: set[str] = set()
        for index, message in enumerate(messages):
            role = message.get("role")
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in open_calls:
                    return (f"messages.[{index}].role: Invalid parameter: messages with role "
                            "'tool' must be a response to a preceeding message with "
                            "'tool_calls'.")
                open_calls.discard(call_id)
                continue
            if open_calls:
                return (f"messages.[{index}]: An assistant message with 'tool_calls' must be "
                        "followed by tool messages responding to each 'tool_call_id'. The "
                        f"following tool_call_ids did not have response messages: "
                        f"{', '.join(sorted(open_calls))}")
            if role == "assistant":
                open_calls = {c["id"] for c in message.get("tool_calls") or []}
        if open_calls:
            return "the last assistant message's tool_calls have no responses"
        return None

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body.get("messages", [])
        prompt = self.tokens(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        system = next((m.get("content") for m in messages if m.get("role") == "system"), "")
        last = str(messages[-1].get("content") or "") if messages else ""
        kind = ("compaction" if "compact a conversation" in str(system)
                else "final_summary" if "[BUDGET EXHAUSTED]" in last else "turn")
        problem = self.pairing_problem(messages)
        counted = prompt + (max_tokens or 0) if self.flavour == "llama-cpp-python" else prompt
        window = (self.summary_window if kind == "final_summary" and self.summary_window
                  else self.window)
        refused = problem is not None or counted > window
        with self._lock:
            self.seen.append(Seen(prompt, messages, refused, kind, max_tokens))
            if problem is not None:
                self.pairing_errors.append(problem)
        if problem is not None:
            return 400, {"error": {"message": problem, "type": "invalid_request_error",
                                   "param": "messages", "code": None}}
        if refused:
            return 400, self._overflow_body(prompt, max_tokens or 0, window)
        if kind == "compaction":
            return 200, _completion("Notes: pages fetched so far were read; continue with "
                                    "the next page.", prompt)
        if kind == "final_summary":
            return 200, _completion("Stopped early: the pages read so far are summarized "
                                    "above.", prompt)
        with self._lock:
            if self.issued >= self.calls:
                return 200, _completion(f"done after {self.issued} pages", prompt)
            self.issued += 1
            number = self.issued
        offered = body.get("tools") or [{"function": {"name": "fetch_page"}}]
        name = offered[0]["function"]["name"]
        call = {"id": f"call_{number}", "type": "function",
                "function": {"name": name, "arguments": json.dumps({"n": number})}}
        return 200, _completion(None, prompt, [call])

    def _overflow_body(self, prompt: int, max_tokens: int, window: int) -> dict[str, Any]:
        if self.flavour == "llama.cpp":
            return {"error": {"code": 400, "message": (
                f"request ({prompt} tokens) exceeds the available context size ({window} "
                "tokens), try increasing it"), "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt, "n_ctx": window}}
        if self.flavour in ("llama-cpp-python", "vllm"):
            message = (f"This model's maximum context length is {window} tokens. However, you "
                       f"requested {prompt + max_tokens} tokens ({prompt} in the messages, "
                       f"{max_tokens} in the completion). Please reduce the length of the "
                       "messages or completion.")
            if self.flavour == "vllm":
                return {"object": "error", "message": message, "type": "BadRequestError",
                        "param": None, "code": 400}
            return {"error": {"message": message, "type": "invalid_request_error",
                              "param": "messages", "code": "context_length_exceeded"}}
        return {"error": {"message": (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}}


def page(number: int, size: int = 5000) -> str:
    """Page ``number`` of the fetched site: ``size`` bytes of text."""
    line = f"page {number}: lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    return (line * (size // len(line) + 1))[:size]


@datamachine.tool
def fetch_page(n: int) -> str:
    """Fetch page ``n`` of the site."""
    return page(n)


@contextmanager
def serving(**options: Any) -> Iterator[WindowedModel]:
    """A started ``WindowedModel(**options)``, stopped on the way out (the tests' fixtures)."""
    server = WindowedModel(**options).start()
    try:
        yield server
    finally:
        server.stop()


def _completion(content: str | None, prompt: int,
                tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    completion = 12 if content else 20
    return {"id": "chatcmpl-windowed", "object": "chat.completion", "created": 0,
            "model": "windowed", "choices": [{
                "index": 0, "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in one segment: a kept-alive client otherwise waits out a
    # delayed ACK (about 40 ms) for every answer.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        model: WindowedModel = self.server.model  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = json.loads(raw)
        status, body = model.answer(request)
        if status == 200 and request.get("stream"):
            self._stream(body)
            return
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, body: dict[str, Any]) -> None:
        """The answer as Chat Completions chunks (the text in two deltas, each call whole),
        then usage, then ``[DONE]``."""
        message = body["choices"][0]["message"]
        content = message.get("content") or ""
        deltas: list[dict[str, Any]] = [{"content": part} for part in
                                        (content[: len(content) // 2],
                                         content[len(content) // 2:]) if part]
        for index, call in enumerate(message.get("tool_calls") or []):
            deltas.append({"tool_calls": [{"index": index, **call}]})
        chunks = [{"id": "c", "object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                  for delta in deltas]
        chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [{
            "index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}]})
        chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [],
                       "usage": body["usage"]})
        data = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks)
        data += b"data: [DONE]\n\n"
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        # llama.cpp's server reports its window at /props (the root, not under /v1).
        model: WindowedModel = self.server.model  # type: ignore[attr-defined]
        model.gets.append(self.path)
        if self.path == "/props" and model.flavour == "llama.cpp":
            status, body = 200, {"default_generation_settings": {"n_ctx": model.window},
                                 "total_slots": 1}
        else:
            status, body = 404, {"error": {"code": 404, "message": "File Not Found",
                                           "type": "not_found_error"}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
