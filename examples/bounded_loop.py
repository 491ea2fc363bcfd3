"""A bounded loop with a turn runner of your own: the model keeps asking for a tool, the
turn budget stops it. Run: uv run python examples/bounded_loop.py"""

from agents_api import IterationBudget, TurnResult, run_loop


def runner(messages, context):
    # A stand-in model that never stops calling tools: exactly the runaway a budget is for.
    return TurnResult(
        content=f"Turn {context['turn']}: doubling again.",
        tool_calls=[{"name": "double", "parameters": {"n": context["turn"]}}],
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    )


def double(tool_call, context):
    return {"success": True, "result": tool_call["parameters"]["n"] * 2}


result = run_loop(
    [{"role": "user", "content": "Double numbers forever."}],
    runner,
    turn_budget=IterationBudget("conversation_turns", 5),
    tool_executor=double,
    on_event=lambda event, payload: print(f"  event {event}: turn {payload.get('turn')}"),
)
print(f"status={result.status} budget={result.budget} turns={result.turn_count}")
print(f"flags={result.flags} warning={result.warning!r}")
print(f"usage={result.usage}")
