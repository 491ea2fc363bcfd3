"""The scenario on datamachine, and the floor: the same work as a bare Python loop.

Datamachine runs through the public entry point, ``host.run_conversation``, on a host booted
once (``bootstrap.boot``), with the built-in ``scripted`` provider and a ``@datamachine.tool``:

- *in memory*: ``persist_transcript=False``; the turn and tool-call budgets, duplicate checks
  and parameter validation are on, as in every run;
- *SQLite*: the default persistence (the transcript written to a SQLite file turn by turn, the
  transcript lock renewed every turn) and nothing else;
- *all on*: transcripts written to a SQLite file turn by turn (with the transcript lock renewed
  every turn), an event sink, a wall-clock budget, budget pressure and a completion policy.

The built-in ``conversation_turns`` budget allows at most 200 turns and ``tool_calls`` 100 by
default; the bench host raises both so that T = 200 (201 turns, 200 tool calls) completes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bootstrap
import datamachine
from agents_api import Decision
from bench.scenario import PROMPT, answer_text, double, script_for
from datamachine.host import Host
from datamachine.providers.scripted import Script, load_script

__all__ = [
    "AsyncScriptedProvider",
    "BenchPolicy",
    "CountingSink",
    "all_on_runner",
    "async_runner",
    "checked_runner",
    "floor",
    "make_host",
    "memory_runner",
    "persisted_runner",
]

DOUBLE = datamachine.tool(double)
MAX_TURNS = 1000


def make_host(db_path: str | Path = ":memory:", plugins: tuple[object, ...] = ()) -> Host:
    """A host for the bench: no installed plugins, turn and tool-call ceilings raised."""
    host = bootstrap.boot(db_path=db_path, plugins=plugins, load_entrypoints=False)
    spec = host.budgets.get_spec("conversation_turns")
    assert spec is not None
    host.budgets.register(spec.model_copy(update={"max": MAX_TURNS}), owner="bootstrap")
    host.settings.set("max_tool_calls", MAX_TURNS)
    return host


_scripts: dict[int, Script] = {}


def _script(turns: int) -> Script:
    # Validated once per T, like the peers' test models, which are built once.
    if turns not in _scripts:
        _scripts[turns] = load_script(script_for(turns))
    return _scripts[turns]


def _check(result: Any, turns: int) -> None:
    if result.status != "completed" or result.final_content != answer_text(turns):
        raise RuntimeError(f"bench run went wrong: {result.status} {result.error!r} "
                           f"{result.final_content!r}")


def memory_runner(host: Host) -> Callable[[int], object]:
    """One in-memory run of the scenario per call."""

    def run(turns: int) -> object:
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [DOUBLE], "scripted", "bench",
            payload={"script": _script(turns), "persist_transcript": False},
            max_turns=turns + 1,
        )
        _check(result, turns)
        return result

    return run


def persisted_runner(host: Host) -> Callable[[int], object]:
    """One run per call with the host's transcript store (the default) and nothing else added."""

    def run(turns: int) -> object:
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [DOUBLE], "scripted", "bench",
            payload={"script": _script(turns)}, max_turns=turns + 1,
        )
        _check(result, turns)
        return result

    return run


class CountingSink:
    """An event sink that counts events by name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """Count one event."""
        self.counts[event] = self.counts.get(event, 0) + 1


class BenchPolicy:
    """A completion policy: keep going after each tool result, complete on a plain answer."""

    def __init__(self) -> None:
        self.calls = 0

    def record_tool_result(self, tool_name: str, tool: Any, result: Any,
                           context: dict[str, Any]) -> Decision:
        """Not done yet: the model answers when it is."""
        self.calls += 1
        return Decision(complete=False)

    def record_natural_completion(self, messages: Any, content: str,
                                  context: dict[str, Any]) -> Decision:
        """A plain answer completes the task."""
        self.calls += 1
        return Decision(complete=True)


def checked_runner(host: Host, *, persist: bool) -> Callable[[int], object]:
    """One run per call with everything the issue lists on: budgets, an event sink, duplicate
    checks and a completion policy; transcripts in the host's store when ``persist``."""
    extra: dict[str, Any] = {} if persist else {"persist_transcript": False}

    def run(turns: int) -> object:
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [DOUBLE], "scripted", "bench",
            payload={"script": _script(turns), "event_sink": CountingSink(),
                     "completion_policy": BenchPolicy(), **extra},
            max_turns=turns + 1,
        )
        _check(result, turns)
        return result

    return run


def all_on_runner(host: Host, *, wall_clock: bool = False) -> Callable[[int], object]:
    """One run per call with SQLite persistence, events, budgets, pressure and a policy.

    ``wall_clock=True`` adds a time rail (payload ``max_seconds``), under which the loop runs
    every provider and tool call where it can stop waiting for it.
    """
    extra: dict[str, Any] = {"max_seconds": 3600} if wall_clock else {}

    def run(turns: int) -> object:
        result = host.run_conversation(
            [{"role": "user", "content": PROMPT}], [DOUBLE], "scripted", "bench",
            payload={"script": _script(turns), "event_sink": CountingSink(),
                     "completion_policy": BenchPolicy(), "budget_pressure": True, **extra},
            max_turns=turns + 1,
        )
        _check(result, turns)
        return result

    return run


class AsyncScriptedProvider:
    """An async provider that replays the scenario and awaits once per turn."""

    name = "bench_async"

    def __init__(self, name: str = "bench_async") -> None:
        self.name = name

    async def complete(self, request: Any) -> dict[str, Any]:
        """Yield to the event loop once, then answer like the scripted model."""
        await asyncio.sleep(0)
        last = request.messages[-1]
        done = int(last["tool_call_id"].rsplit("_", 1)[1]) if last["role"] == "tool" else 0
        turns = request.payload["bench_turns"]
        if done < turns:
            i = done + 1
            return {"content": "", "tool_calls": [{"id": f"call_{i}", "name": "double",
                                                   "parameters": {"x": i}}]}
        return {"content": answer_text(turns)}


class AsyncProviderPlugin:
    """Registers :class:`AsyncScriptedProvider` through ``register_providers()``."""

    @datamachine.hookimpl
    def register_providers(self) -> list[Any]:
        """The bench's async provider."""
        return [AsyncScriptedProvider()]


async def async_runner(host: Host, turns: int) -> object:
    """One async in-memory run on ``host`` (booted with :class:`AsyncProviderPlugin`)."""
    result = await host.arun_conversation(
        [{"role": "user", "content": PROMPT}], [DOUBLE], "bench_async", "bench",
        payload={"bench_turns": turns, "persist_transcript": False}, max_turns=turns + 1,
    )
    _check(result, turns)
    return result


_floor_scripts: dict[int, list[dict[str, Any]]] = {}


def floor(turns: int) -> str:
    """The scenario with no framework: the same model answers, appends and tool calls."""
    if turns not in _floor_scripts:
        _floor_scripts[turns] = script_for(turns)
    responses = _floor_scripts[turns]
    tools: dict[str, Callable[..., Any]] = {"double": double}
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]

    def model(history: list[dict[str, Any]], turn: int) -> dict[str, Any]:
        return responses[turn]

    for turn in range(len(responses)):
        response = model(messages, turn)
        calls = response.get("tool_calls", [])
        messages.append({"role": "assistant", "content": response["content"],
                         "tool_calls": calls})
        if not calls:
            break
        for call in calls:
            value = tools[call["name"]](**call["parameters"])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps(value)})
    content = messages[-1]["content"]
    if content != answer_text(turns):
        raise RuntimeError("floor run went wrong")
    return str(content)
