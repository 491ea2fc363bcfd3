"""Default plugin: the built-in ``scripted`` and ``openai`` providers.

Fresh provider objects per call, so two hosts in one process never share a script position or
recorded requests. The ``openai`` provider reads ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` when a
request is made, not here, so exporting a key after boot works; the host's
``openai_base_url`` setting reaches it through ``ProviderRegistry.bind_settings``.
"""

from __future__ import annotations

from typing import Any

from datamachine.hookspecs import hookimpl


@hookimpl
def register_providers() -> list[Any]:
    """The embedded ``scripted`` provider and the OpenAI-compatible ``openai`` provider."""
    from datamachine.providers.openai import OpenAIProvider
    from datamachine.providers.scripted import ScriptedProvider

    return [ScriptedProvider(), OpenAIProvider()]
