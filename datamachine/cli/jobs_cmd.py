"""``datamachine jobs enqueue`` and ``datamachine worker``: pipeline jobs on the task queue
(DESIGN.md 18; PostgreSQL in DATAMACHINE_DB). ``jobs list`` and ``jobs show`` are in
``admin``."""

from __future__ import annotations

import json
from typing import Any

import click

from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json
from datamachine.cli.prompt_input import read_prompt
from datamachine.errors import UsageError

__all__ = ["jobs_enqueue", "jobs_requeue", "worker"]

def _payload(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--payload must be a JSON object: {exc}.") from None
    if not isinstance(value, dict):
        raise UsageError(f"--payload must be a JSON object, got {type(value).__name__}.")
    return value


@click.command("enqueue")
@click.argument("prompt", required=False)
@click.option("-s", "--system", default=None, help="A system prompt before PROMPT.")
@click.option("--provider", default=None, help="Provider name (default: the worker's "
                                                 "setting default_provider).")
@click.option("-m", "--model", default=None, help="Model id.")
@click.option("--tools", "tool_names", default="",
              help="Comma-separated names of registered tools to offer.")
@click.option("--max-turns", type=click.IntRange(1, 10_000), default=None,
              help="Turn ceiling of the job's run.")
@click.option("--payload", "payload_json", default=None, metavar="JSON",
              help="The run's payload, a JSON object (completion_assertions, model_options, "
                   "context for tools, ...).")
@click.option("--flow-step-id", default=None, help="The flow step the job belongs to.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_obj
@handle_errors
def jobs_enqueue(state: State, prompt: str | None, system: str | None, provider: str | None,
                 model: str | None, tool_names: str, max_turns: int | None,
                 payload_json: str | None, flow_step_id: str | None, as_json: bool) -> None:
    """Put a job with PROMPT as its user message on the queue; print its id.

    A `datamachine worker` on the same database runs it. PROMPT may come from stdin, as for
    `run`. Follow it with `datamachine jobs show ID`.
    """
    text = read_prompt(prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}]
    tools = [name.strip() for name in tool_names.split(",") if name.strip()]
    job = state.host.jobs.enqueue(messages, tools, provider, model,
                                  payload=_payload(payload_json), max_turns=max_turns,
                                  flow_step_id=flow_step_id)
    if as_json:
        emit_json(job.model_dump(mode="json"))
    else:
        click.echo(job.id)


def _show_progress() -> None:
    """Each job's start and end, and the worker's stop, on stderr: a worker that prints
    nothing while busy looks idle, and a first Ctrl-C must say that it was heard."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("datamachine worker: %(message)s"))
    for name in ("datamachine.worker", "procrastinate.worker"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


@click.command("requeue")
@click.argument("job_id", type=int)
@click.pass_obj
@handle_errors
def jobs_requeue(state: State, job_id: int) -> None:
    """Put a pending job on the queue again (its queue entry was lost when the process that
    enqueued it died between storing it and queueing it)."""
    job = state.host.jobs.requeue(job_id)
    click.echo(job.id)


@click.command()
@click.option("-c", "--concurrency", type=click.IntRange(1, 1000), default=4, show_default=True,
              help="Jobs this worker runs at once.")
@click.option("--stalled-after", type=click.FloatRange(1, 86_400), default=30.0,
              show_default=True,
              help="Seconds without a heartbeat after which another worker's jobs are run "
                   "again (continuing their transcripts).")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.pass_obj
@handle_errors
def worker(state: State, concurrency: int, stalled_after: float, burst: bool) -> None:
    """Run queued pipeline jobs until stopped (Ctrl-C or SIGTERM finish the running ones).

    Start one or more on every machine that shares DATAMACHINE_DB (PostgreSQL); each job runs
    once at a time, and a job whose worker died is continued by another one.
    """
    try:
        from datamachine.job_worker import run_worker
    except ImportError as exc:
        raise UsageError(f"The worker needs the postgres extra ({exc}): pip install "
                         "'datamachine-agents[postgres]'.") from None
    state.host.queue.url()  # on SQLite: refused here, with what to set
    _show_progress()
    click.echo(f"datamachine worker: {concurrency} at a time on {state.host.handle.label}",
               err=True)
    run_worker(state.host, concurrency=concurrency, stalled_after=stalled_after,
               wait=not burst)
