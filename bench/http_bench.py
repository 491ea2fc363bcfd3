"""The scenario end to end over HTTP: one loopback Chat Completions server, every client.

``python3 bench/http_bench.py`` (re-runs itself in ``bench/.venv``, like ``bench/run.py``;
``--no-peers`` measures the floor and datamachine only, on the interpreter running it).

The server runs in its own process, so its work is not charged to the clients: a small asyncio
HTTP/1.1 server (standard library only, keep-alive) that plays the scripted model of
:mod:`bench.scenario` statelessly. It counts the ``tool`` messages in the request: fewer than T
(read from the prompt) and it calls ``double`` once more, else it answers in text. Every client
runs the same T + 1 requests on one event loop kept open for the whole bench:

* **floor**: a plain loop on one persistent ``httpx.AsyncClient``: post, decode, run the tool,
  append, repeat; nothing a framework adds;
* **datamachine**: ``host.arun_conversation`` on the built-in ``openai`` provider (its pooled
  client), with a ``@datamachine.tool``; budgets, duplicate checks and parameter validation on,
  the transcript in memory;
* **pydantic-ai**: ``Agent`` on ``OpenAIChatModel`` with an ``OpenAIProvider`` at the server;
* **openai-agents**: ``Runner.run`` on ``OpenAIChatCompletionsModel`` with an ``AsyncOpenAI``
  client at the server (tracing off).

µs per turn = one run's wall time / (T + 1), medians over interleaved rounds (see
:func:`bench.scenario.measure_interleaved`), so the ratios compare figures taken in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scenario import PROMPT, answer_text, double, measure_interleaved  # noqa: E402

MODEL = "bench-model"
_TURNS = re.compile(r"\[turns=(\d+)\]")


# -- the server (its own process) -------------------------------------------------------------

def _answer(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    turns = int(_TURNS.search(messages[0]["content"]).group(1))  # type: ignore[union-attr]
    done = sum(1 for m in messages if m["role"] == "tool")
    if done < turns:
        i = done + 1
        message: dict[str, Any] = {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": "double", "arguments": json.dumps({"x": i})}}]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": answer_text(turns)}, "stop"
    return {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            body = json.loads(await reader.readexactly(length))
            if body.get("stream"):
                await _stream_answer(writer, _answer(body))
                continue
            payload = json.dumps(_answer(body)).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _stream_answer(writer: asyncio.StreamWriter, answer: dict[str, Any]) -> None:
    """The answer as Server-Sent Events (chunked), its text in words: what the time-to-first-
    delta bench reads."""
    message = answer["choices"][0]["message"]
    words = (message.get("content") or "").split(" ")
    chunks = [{"choices": [{"index": 0, "delta": {"content": word + " "},
                            "finish_reason": None}]} for word in words]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"choices": [], "usage": answer["usage"]})
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for data in [*(json.dumps(chunk) for chunk in chunks), "[DONE]"]:
        event = f"data: {data}\n\n".encode()
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def serve(port: int) -> None:
    """Run the scripted Chat Completions server on ``127.0.0.1:port`` until killed."""
    async def main() -> None:
        server = await asyncio.start_server(_serve_connection, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """The server process and its base URL (``.../v1``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the bench server did not start")


def prompt(turns: int) -> str:
    return f"{PROMPT} [turns={turns}]"


# -- the clients ----------------------------------------------------------------------------

AsyncRun = Callable[[int], Coroutine[Any, Any, object]]


def floor_runner(base_url: str) -> AsyncRun:
    import httpx

    client = httpx.AsyncClient(base_url=base_url, headers={"Authorization": "Bearer x"})
    tools = [{"type": "function", "function": {
        "name": "double", "description": "Double an integer.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                       "required": ["x"]}}}]

    async def run(turns: int) -> object:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt(turns)}]
        while True:
            response = await client.post("/chat/completions", json={
                "model": MODEL, "messages": messages, "tools": tools})
            message = response.json()["choices"][0]["message"]
            calls = message.get("tool_calls")
            if not calls:
                if message["content"] != answer_text(turns):
                    raise RuntimeError("floor run went wrong")
                return message["content"]
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            for call in calls:
                result = double(**json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": json.dumps(result)})

    return run


def datamachine_runner(base_url: str) -> AsyncRun:
    import bootstrap
    import datamachine

    host = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    host.settings.set("openai_base_url", base_url)
    host.settings.set("max_turns", 200)  # the conversation_turns default (25) is below T = 50
    tool = datamachine.tool(double)

    async def run(turns: int) -> object:
        result = await host.arun_conversation(
            [{"role": "user", "content": prompt(turns)}], [tool], "openai", MODEL,
            payload={"persist_transcript": False})
        if result.final_content != answer_text(turns):
            raise RuntimeError(f"datamachine run went wrong: {result.status} {result.error}")
        return result

    return run


def pydantic_ai_runner(base_url: str) -> AsyncRun:
    from pydantic_ai import Agent, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="x"))
    agent = Agent(model)
    agent.tool_plain(double)

    async def run(turns: int) -> object:
        result = await agent.run(prompt(turns), usage_limits=UsageLimits(request_limit=turns + 5))
        if result.output != answer_text(turns):
            raise RuntimeError(f"pydantic-ai run went wrong: {result.output!r}")
        return result

    return run


def openai_agents_runner(base_url: str) -> AsyncRun:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(MODEL, AsyncOpenAI(base_url=base_url, api_key="x"))
    agent = Agent(name="bench", model=model, tools=[function_tool(double)])

    async def run(turns: int) -> object:
        result = await Runner.run(agent, prompt(turns), max_turns=turns + 5)
        if result.final_output != answer_text(turns):
            raise RuntimeError(f"openai-agents run went wrong: {result.final_output!r}")
        return result

    return run


PEERS: dict[str, Callable[[str], AsyncRun]] = {
    "pydantic-ai (OpenAIChatModel)": pydantic_ai_runner,
    "openai-agents (OpenAIChatCompletionsModel)": openai_agents_runner,
}


# -- the table ------------------------------------------------------------------------------

def measure(turn_counts: Sequence[int], runs: int, rounds: int, peers: bool) -> str:
    process, base_url = start_server()
    loop = asyncio.new_event_loop()
    try:
        factories: dict[str, Callable[[str], AsyncRun]] = {
            "floor (httpx.AsyncClient loop)": floor_runner,
            "datamachine (openai provider)": datamachine_runner,
        }
        if peers:
            factories.update(PEERS)
        runners = {}
        for name, factory in factories.items():
            run = factory(base_url)

            def call(turns: int, run: AsyncRun = run) -> object:
                return loop.run_until_complete(run(turns))

            runners[name] = call
        columns = {turns: measure_interleaved(runners, turns, runs, rounds=rounds)
                   for turns in turn_counts}
    finally:
        loop.close()
        process.kill()
        process.wait()
    floor_name, dm_name = "floor (httpx.AsyncClient loop)", "datamachine (openai provider)"
    header = " | ".join(f"T = {t}" for t in turn_counts)
    lines = [f"| over HTTP: µs per turn, median (min-max) | {header} |",
             "|---|" + "---|" * len(turn_counts)]
    for name in runners:
        cells = []
        for turns in turn_counts:
            figures = columns[turns]
            cell = figures[name].cell()
            if name == dm_name:
                cell += f" **{figures[name].median / figures[floor_name].median:.2f}x floor**"
            elif name != floor_name:
                cell += (f" **{figures[name].median / figures[dm_name].median:.1f}x "
                         "datamachine**")
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{rounds} rounds, taking turns; {runs} runs per framework per T; one "
                 "loopback server process; Nx = that row's median over the named row's.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--quick", action="store_true", help="T = 2, a few runs (smoke test)")
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return
    peers = not args.no_peers
    if peers:
        from bench.run import _in_bench_venv, _venv_python, ensure_environment

        if not _in_bench_venv():
            ensure_environment()
            os.execv(str(_venv_python()), [str(_venv_python()), __file__, *sys.argv[1:]])
    if args.quick:
        print(measure([2], runs=2, rounds=1, peers=peers))
    else:
        print(measure(args.turns, args.runs, args.rounds, peers))


if __name__ == "__main__":
    main()
