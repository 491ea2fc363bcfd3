"""The providers one host knows: :class:`ProviderRegistry`, filled from ``register_providers()``.

Built-in providers come from the default plugin ``datamachine.default_plugins.providers`` and go
through the same hook as third-party ones, so the registry never special-cases them. Each entry
remembers the plugin that registered it, which is what lets a name clash at boot say which two
plugins disagree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pluggy

from datamachine.errors import DuplicateProviderError, PluginLoadError, UnknownProvider
from datamachine.plugins import collect
from datamachine.providers.base import Provider

__all__ = ["ProviderRegistry", "RegisteredProvider"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True)
class RegisteredProvider:
    """A provider with the name it answers to and the plugin (pluggy name) that registered it."""

    name: str
    provider: Provider
    plugin: str


class ProviderRegistry:
    """Providers by name. Build it at boot with :meth:`from_plugin_manager`."""

    def __init__(self) -> None:
        self._entries: dict[str, RegisteredProvider] = {}

    @classmethod
    def from_plugin_manager(cls, pm: pluggy.PluginManager) -> ProviderRegistry:
        """Collect every ``register_providers()`` hookimpl, tagging each provider by plugin.

        Raises :class:`DuplicateProviderError` when two plugins register one name and
        :class:`PluginLoadError` when an item is not a provider.
        """
        registry = cls()
        for plugin_name, item in collect(pm, "register_providers"):
            registry.register(item, plugin=plugin_name)
        return registry

    def register(self, provider: object, *, plugin: str = "explicit") -> RegisteredProvider:
        """Add ``provider`` (anything with a ``name`` and a callable ``complete``)."""
        name = getattr(provider, "name", None)
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise PluginLoadError(
                f"Plugin {plugin!r}: register_providers() returned {provider!r}, whose 'name' "
                f"is {name!r}; a provider needs a name of letters, digits, '_', '.', ':' or "
                "'-' (at most 64 characters)."
            )
        if not callable(getattr(provider, "complete", None)):
            raise PluginLoadError(
                f"Plugin {plugin!r}: provider {name!r} has no complete(request) method."
            )
        existing = self._entries.get(name)
        if existing is not None:
            raise DuplicateProviderError(
                f"Provider {name!r} is registered by both {existing.plugin!r} and {plugin!r}; "
                "rename one of them or load only one of the plugins "
                "(DATAMACHINE_LOAD_PLUGINS)."
            )
        entry = RegisteredProvider(name=name, provider=provider, plugin=plugin)  # type: ignore[arg-type]
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> Provider:
        """The provider registered as ``name``; :class:`UnknownProvider` lists the known ones."""
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownProvider(
                f"Unknown provider {name!r}. Registered providers: {known}. A plugin adds "
                "providers through the register_providers() hook."
            )
        return entry.provider

    def owner(self, name: str) -> str | None:
        """The plugin that registered ``name``, or None."""
        entry = self._entries.get(name)
        return entry.plugin if entry is not None else None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[RegisteredProvider]:
        """Every registration, sorted by name (for ``datamachine plugins`` style listings)."""
        return [self._entries[name] for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def availability(self, name: str) -> Literal[True] | str:
        """The provider's own availability: ``True`` or a reason string.

        This is the default check behind the ``provider_availability`` hook (the adapter asks
        the hook first). A provider without an ``availability()`` method is always available;
        a check that raises or answers nonsense is reported as unavailable, with the reason.
        """
        provider = self.get(name)
        check = getattr(provider, "availability", None)
        if check is None:
            return True
        try:
            answer = check()
        except Exception as exc:
            return f"The {name} provider's availability check failed: {exc}"
        if answer is True:
            return True
        if isinstance(answer, str) and answer.strip():
            return answer
        return f"The {name} provider reports it is unavailable (answer {answer!r})."

    def bind_settings(self, lookup: Callable[[str], Any]) -> None:
        """Give providers that read host settings (``bind_settings``) the host's lookup."""
        for entry in self._entries.values():
            bind = getattr(entry.provider, "bind_settings", None)
            if callable(bind):
                bind(lookup)
