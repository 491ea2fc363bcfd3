"""The scenario on the peers, each with its own idiomatic test model.

- pydantic-ai: an ``Agent`` with a ``FunctionModel`` and a ``tool_plain``;
- openai-agents: an ``Agent`` on a ``Model`` subclass, run by ``Runner`` (tracing off, as for
  any offline run: there is nowhere to export traces to);
- LangGraph: the prebuilt ReAct agent (``create_react_agent``) on a LangChain chat model
  subclass (``BaseChatModel`` with ``bind_tools``) and a ``@tool``.

The peers are async frameworks, so each runs inside one event loop that the bench keeps open:
the cheapest way to call them (no event loop per run). Imported only inside the benchmark
environment (``bench/.venv``); the project never depends on them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from bench.scenario import PROMPT, answer_text, double

__all__ = ["PEERS", "peer_versions"]

PEER_PACKAGES = {
    "pydantic-ai": "pydantic-ai-slim",
    "openai-agents": "openai-agents",
    "LangGraph": "langgraph",
}


def peer_versions() -> dict[str, str]:
    """Installed versions of the peers and the packages they run on."""
    from importlib.metadata import version

    names = ("pydantic-ai-slim", "openai-agents", "openai", "langgraph", "langgraph-prebuilt",
             "langchain-core", "pydantic")
    return {name: version(name) for name in names}


def next_call(call_id: str) -> int:
    """How many tool turns are done, read from the last result's call id (``call_<i>``).

    Every test model reads only the last message, so the model's own cost stays flat.
    """
    return int(call_id.rsplit("_", 1)[1])


# -- pydantic-ai ----------------------------------------------------------------------------
def pydantic_ai_runner() -> Callable[[int], Coroutine[Any, Any, object]]:
    """``await run(T)`` runs the scenario once on pydantic-ai."""
    from pydantic_ai import Agent, UsageLimits
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    turns_for_run = [0]

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        done = next_call(last.tool_call_id) if isinstance(last, ToolReturnPart) else 0
        turns = turns_for_run[0]
        if done < turns:
            i = done + 1
            return ModelResponse(parts=[ToolCallPart("double", {"x": i}, tool_call_id=f"call_{i}")])
        return ModelResponse(parts=[TextPart(answer_text(turns))])

    agent = Agent(FunctionModel(model))
    agent.tool_plain(double)

    async def run(turns: int) -> object:
        turns_for_run[0] = turns
        result = await agent.run(PROMPT, usage_limits=UsageLimits(request_limit=turns + 5))
        if result.output != answer_text(turns):
            raise RuntimeError(f"pydantic-ai run went wrong: {result.output!r}")
        return result

    return run


# -- openai-agents --------------------------------------------------------------------------
def openai_agents_runner() -> Callable[[int], Coroutine[Any, Any, object]]:
    """``await run(T)`` runs the scenario once on openai-agents."""
    from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)
    turns_for_run = [0]

    class ScriptedModel(Model):
        """Calls ``double`` once per turn, then answers."""

        async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                               tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                               **kwargs: Any) -> ModelResponse:
            last = input[-1] if isinstance(input, list) else {}
            done = (next_call(last["call_id"])
                    if isinstance(last, dict) and last.get("type") == "function_call_output"
                    else 0)
            turns = turns_for_run[0]
            if done < turns:
                i = done + 1
                output: list[Any] = [ResponseFunctionToolCall(
                    type="function_call", call_id=f"call_{i}", name="double",
                    arguments=json.dumps({"x": i}), id=f"fc_{i}", status="completed")]
            else:
                output = [ResponseOutputMessage(
                    type="message", id="msg_final", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=answer_text(turns),
                                                annotations=[])])]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the bench does not stream")

    agent = Agent(name="bench", model=ScriptedModel(), tools=[function_tool(double)])

    async def run(turns: int) -> object:
        turns_for_run[0] = turns
        result = await Runner.run(agent, PROMPT, max_turns=turns + 5)
        if result.final_output != answer_text(turns):
            raise RuntimeError(f"openai-agents run went wrong: {result.final_output!r}")
        return result

    return run


# -- LangGraph ------------------------------------------------------------------------------
def langgraph_runner() -> Callable[[int], Coroutine[Any, Any, object]]:
    """``await run(T)`` runs the scenario once on LangGraph's prebuilt ReAct agent."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    turns_for_run = [0]

    class ScriptedChatModel(BaseChatModel):
        """Calls ``double`` once per turn, then answers."""

        @property
        def _llm_type(self) -> str:
            return "bench-scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
            return self

        def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            last = messages[-1]
            done = next_call(last.tool_call_id) if isinstance(last, ToolMessage) else 0
            turns = turns_for_run[0]
            if done < turns:
                i = done + 1
                message = AIMessage(content="", tool_calls=[
                    {"name": "double", "args": {"x": i}, "id": f"call_{i}", "type": "tool_call"}])
            else:
                message = AIMessage(content=answer_text(turns))
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _agenerate(self, messages: list[Any], stop: Any = None,
                             run_manager: Any = None, **kwargs: Any) -> ChatResult:
            return self._generate(messages, stop, None, **kwargs)

    graph = create_react_agent(ScriptedChatModel(), [tool(double)])

    async def run(turns: int) -> object:
        turns_for_run[0] = turns
        state = await graph.ainvoke({"messages": [("user", PROMPT)]},
                                    {"recursion_limit": 2 * turns + 10})
        final = state["messages"][-1].content
        if final != answer_text(turns):
            raise RuntimeError(f"LangGraph run went wrong: {final!r}")
        return state

    return run


PEERS: dict[str, Callable[[], Callable[[int], Coroutine[Any, Any, object]]]] = {
    "pydantic-ai": pydantic_ai_runner,
    "openai-agents": openai_agents_runner,
    "LangGraph": langgraph_runner,
}


def sync_adapter(loop: asyncio.AbstractEventLoop,
                 run: Callable[[int], Coroutine[Any, Any, object]]) -> Callable[[int], object]:
    """Drive an async ``run(T)`` on an event loop kept open for the whole bench."""

    def call(turns: int) -> object:
        return loop.run_until_complete(run(turns))

    return call
