"""One line on stderr when ``run`` or ``chat`` answers with ``scripted`` though a model was
meant: a provider's key is set, or ``-m``/``-o`` asked for a model.

Without ``--provider``, a run uses the setting ``default_provider``, which is ``scripted`` (it
echoes; no model is asked) until someone changes it. A person who exported ``OPENAI_API_KEY``
and typed ``datamachine run "hi"`` expects a model: this says why they got an echo and how to
get the model. It goes to stderr, whatever the output format, so stdout stays what a script
reads; ``--provider scripted`` or ``--script`` (a deliberate scripted run) silence it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import click

from datamachine.errors import DataMachineError

__all__ = ["keyed_providers", "provider_for_script", "read_script", "scripted_fallback_notice",
           "warn_if_scripted_fallback"]


def keyed_providers(host: Any, environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(provider, variable)`` for every provider of ``host`` whose API key variable is set in
    ``environ`` (default ``os.environ``): registered providers first, then the named endpoints
    of the ``providers`` setting, each group by name."""
    env = os.environ if environ is None else environ
    found = []
    names = sorted(host.providers.names(), key=lambda n: (host.providers.owner(n) is None, n))
    for name in names:
        try:
            provider = host.providers.get(name)
        except DataMachineError:  # a broken endpoint entry: its own run will say so
            continue
        variable = getattr(provider, "api_key_env", None)
        if isinstance(variable, str) and variable and env.get(variable, "").strip():
            found.append((name, variable))
    return found


def scripted_fallback_notice(host: Any, provider: str | None, *, scripted_on_purpose: bool,
                             asked_for_model: bool = False,
                             environ: Mapping[str, str] | None = None) -> str | None:
    """The notice, or None: only when no provider was given, the default is ``scripted``,
    nothing says the scripted run is wanted, and some provider's key is set or the command
    asked for a model (``-m``, ``-o``), which the scripted provider ignores: a local server
    (Ollama, llama.cpp) needs no key, so a key alone would miss that case."""
    if provider is not None or scripted_on_purpose:
        return None
    if host.default_provider(None) != "scripted":
        return None
    keyed = keyed_providers(host, environ)
    if not keyed:
        if not asked_for_model:
            return None
        return ("Note: answering with the scripted provider (it echoes; no model is asked), so "
                "-m and -o reach no model: name a provider with --provider (`datamachine "
                "models` lists them), or `datamachine settings set default_provider openai`.")
    variables = sorted({variable for _, variable in keyed})
    named = " and ".join(variables) + (" is" if len(variables) == 1 else " are")
    choice = keyed[0][0]
    others = "".join(f" (or --provider {name})" for name, _ in keyed[1:3])
    return (f"Note: answering with the scripted provider (it echoes; no model is asked) though "
            f"{named} set: use --provider {choice}{others}, or `datamachine settings set "
            f"default_provider {choice}`.")


def warn_if_scripted_fallback(host: Any, provider: str | None, *,
                              scripted_on_purpose: bool, asked_for_model: bool = False) -> None:
    """Print :func:`scripted_fallback_notice` on stderr when there is one."""
    notice = scripted_fallback_notice(host, provider, scripted_on_purpose=scripted_on_purpose,
                                      asked_for_model=asked_for_model)
    if notice is not None:
        click.echo(notice, err=True)


def provider_for_script(provider: str | None, script: object) -> str | None:
    """``--script`` is a scripted run: it picks the ``scripted`` provider whatever the setting
    ``default_provider`` says, and refuses another ``--provider`` naming both flags."""
    if script is None:
        return provider
    if provider is None:
        return "scripted"
    if provider != "scripted":
        raise click.UsageError(f"--script replays a script with the scripted provider; it "
                               f"cannot be used with --provider {provider}.")
    return provider


def read_script(path: Any) -> Any:
    """``--script FILE`` read here, by the command line, into the responses the run's payload
    carries: a run's payload never names a file for the provider to open (DESIGN.md 10 as
    issue 39 tightened it). A bad file is an InvalidScript naming it and the entry (exit 2)."""
    from datamachine.providers.scripted import load_script

    return load_script(path)
