"""``datamachine demo``: two realistic runs on the embedded scripted provider.

The first run is a weather comparison that finishes on its own: tool calls, one duplicate call
rejected by the executor, and a final answer. The second is a research agent that never stops
searching; the ``conversation_turns`` budget stops it, one tool-less call asks it for a summary
(graceful exhaustion), and the result says why it stopped. Both transcripts are written to
SQLite. Nothing here reaches the network.
"""

from __future__ import annotations

import shlex
from typing import Any

import click

from agents_api.jsontext import pretty_json
from datamachine.cli.app import State, exit_code_for, handle_errors
from datamachine.cli.output import print_run_summary

__all__ = ["demo"]

_WEATHER = {
    "paris": {"city": "Paris", "temp_c": 14, "sky": "light rain"},
    "oslo": {"city": "Oslo", "temp_c": 3, "sky": "snow showers"},
    "lisbon": {"city": "Lisbon", "temp_c": 19, "sky": "sunny"},
}


def _tools() -> tuple[Any, Any]:
    from datamachine import tool

    @tool
    def lookup_weather(city: str) -> dict[str, Any]:
        """Current weather for a city.

        Args:
            city: The city name, e.g. "Paris".
        """
        found = _WEATHER.get(city.strip().lower())
        if found is None:
            return {"success": False, "error": f"No weather station for {city!r}."}
        return found

    @tool
    def search_web(query: str) -> dict[str, Any]:
        """Search the web and return the top result titles.

        Args:
            query: What to search for.
        """
        return {"query": query, "results": [f"{query}: an overview", f"{query}: recent news"]}

    return lookup_weather, search_web


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


WEATHER_SCRIPT: list[dict[str, Any]] = [
    {"content": "I'll look up Paris and Oslo first.",
     "tool_calls": [{"id": "w1", "name": "lookup_weather", "parameters": {"city": "Paris"}},
                    {"id": "w2", "name": "lookup_weather", "parameters": {"city": "Oslo"}}],
     "usage": _usage(120, 30)},
    {"content": "Checking Paris once more, then Lisbon.",
     "tool_calls": [{"id": "w3", "name": "lookup_weather", "parameters": {"city": "Paris"}},
                    {"id": "w4", "name": "lookup_weather", "parameters": {"city": "Lisbon"}}],
     "usage": _usage(210, 28)},
    {"content": "Lisbon is the warmest (19 °C, sunny), Paris is mild with light rain (14 °C), "
                "and Oslo is coldest with snow showers (3 °C).",
     "usage": _usage(300, 45)},
]

# The runaway model would search forever; its budget allows 4 turns. The last entry answers the
# one tool-less summary request the run makes when a budget stops a model mid-work.
RUNAWAY_SCRIPT: list[dict[str, Any]] = [
    *[{"content": "" if turn > 1 else "Let me research that thoroughly.",
       "tool_calls": [{"id": f"s{turn}", "name": "search_web",
                       "parameters": {"query": f"history of the bicycle, part {turn}"}}],
       "usage": _usage(100 + 60 * turn, 20)}
      for turn in range(1, 5)],
    {"content": "<think>I was cut off; summarize.</think>I searched four angles of the "
                "bicycle's history (overviews and recent news for parts 1-4) but ran out of "
                "turns before writing the full story. Still open: the 20th century and racing.",
     "usage": _usage(420, 40)},
]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print both results as JSON.")
@click.pass_obj
@handle_errors
def demo(state: State, as_json: bool) -> None:
    """Run two conversations on the scripted provider and explain how each one stopped."""
    host = state.host
    lookup_weather, search_web = _tools()
    first = host.run_conversation(
        [{"role": "user", "content": "Compare today's weather in Paris, Oslo and Lisbon."}],
        [lookup_weather], provider="scripted", model="demo-weather", mode="chat",
        payload={"script": WEATHER_SCRIPT},
    )
    second = host.run_conversation(
        [{"role": "user", "content": "Tell me everything about the history of the bicycle."}],
        [search_web], provider="scripted", model="demo-runaway", mode="chat",
        payload={"script": RUNAWAY_SCRIPT}, max_turns=4,
    )
    if as_json:
        click.echo(pretty_json([first.model_dump(mode="json"), second.model_dump(mode="json")]))
    else:
        print_run_summary("1. A conversation that finishes", first, host)
        click.echo()
        print_run_summary("2. A runaway agent, stopped by its turn budget", second, host)
        click.echo()
        where = host.db_path or ":memory:"
        given = ""
        if host.db_path is not None:
            from datamachine.storage.database import default_db_target

            if str(default_db_target()) != str(host.db_path):
                given = f"--db {shlex.quote(str(host.db_path))} "
        click.echo(f"Transcripts are stored in {where}. Read one back with: "
                   f"datamachine {given}transcripts show {second.transcript_session_id}")
        if host.db_path is not None:
            click.echo(f"Or browse every run: datamachine {given}serve --ui-open, then open "
                       "http://127.0.0.1:8000/ui/")
    # The demo itself succeeded when both runs ended the way they were designed to.
    expected = first.status == "completed" and second.status == "budget_exceeded"
    raise SystemExit(0 if expected else exit_code_for("error"))
