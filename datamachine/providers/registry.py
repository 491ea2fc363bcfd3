"""The providers one host knows: :class:`ProviderRegistry`, filled from ``register_providers()``.

Built-in providers come from the default plugin ``datamachine.default_plugins.providers`` and go
through the same hook as third-party ones, so the registry never special-cases them. Each entry
remembers the plugin that registered it, which is what lets a name clash at boot say which two
plugins disagree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pluggy

from agents_api.jsontext import compact_json
from datamachine.errors import DuplicateProviderError, PluginLoadError, UnknownProvider, UsageError
from datamachine.plugins import collect
from datamachine.providers.base import Provider
from datamachine.providers.endpoints import PROVIDERS_SETTING, Endpoint, parse_endpoints

__all__ = ["ProviderRegistry", "RegisteredProvider"]

logger = logging.getLogger("datamachine.providers")

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
        self._lookup: Callable[[str], Any] | None = None
        # Providers made from the ``providers`` setting: name -> (the entry's JSON, provider).
        self._from_settings: dict[str, tuple[str, Provider]] = {}

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
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
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

    def get(self, name: str, *, settings: Callable[[str], Any] | None = None) -> Provider:
        """The provider named ``name``: an endpoint of the ``providers`` setting (which wins
        over a registration of the same name), else the one registered;
        :class:`UnknownProvider` lists the known ones. ``settings``: where the ``providers``
        setting is read (a run's snapshot; default: the host's settings)."""
        configured = self._endpoint(name, settings) if isinstance(name, str) else None
        if configured is not None:
            return configured
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            known = ", ".join(self.names()) or "none"
            raise UnknownProvider(
                f"Unknown provider {name!r}. Known providers: {known}. A plugin adds "
                "providers through the register_providers() hook, the 'providers' setting "
                "adds named endpoints."
            )
        return entry.provider

    def _endpoint_settings(self) -> Mapping[str, Any]:
        value = self._lookup(PROVIDERS_SETTING) if self._lookup is not None else None
        return value if isinstance(value, Mapping) else {}

    def _endpoint(self, name: str, settings: Callable[[str], Any] | None = None
                  ) -> Provider | None:
        """The provider of the ``providers`` setting's entry ``name`` (made once per entry
        value), or None when the setting has no such entry."""
        lookup = settings or self._lookup
        if lookup is None:
            return None
        value = lookup(PROVIDERS_SETTING)
        if not value:
            return None
        if not isinstance(value, Mapping):
            parse_endpoints(value)  # raises, saying what the setting should look like
        if name not in value:
            return None
        key = compact_json(value[name])
        made = self._from_settings.get(name)
        if made is not None and made[0] == key:
            return made[1]
        endpoint = parse_endpoints({name: value[name]})[name]
        provider = self._make_endpoint(name, endpoint)
        if made is not None:
            _close_quietly(made[1])
        self._from_settings[name] = (key, provider)
        return provider

    def _make_endpoint(self, name: str, endpoint: Endpoint) -> Provider:
        base = self._entries.get(endpoint.type)
        factory = getattr(base.provider, "for_endpoint", None) if base is not None else None
        if not callable(factory):
            kinds = ", ".join(entry.name for entry in self._entries.values()
                              if callable(getattr(entry.provider, "for_endpoint", None)))
            hint = (" (install the datamachine-anthropic plugin)"
                    if endpoint.type == "anthropic" else "")
            raise UsageError(
                f"setting 'providers'[{name!r}].type: {endpoint.type!r} is not an endpoint type "
                f"of this host{hint}; the types are: {kinds or 'none'}.")
        provider = factory(name=name, base_url=endpoint.base_url,
                           api_key_env=endpoint.api_key_env,
                           model_options=endpoint.model_options, headers=endpoint.headers)
        bind = getattr(provider, "bind_settings", None)
        if callable(bind) and self._lookup is not None:
            bind(self._lookup)
        return provider  # type: ignore[no-any-return]

    def owner(self, name: str) -> str | None:
        """The plugin that registered ``name``, or None."""
        entry = self._entries.get(name)
        return entry.plugin if entry is not None else None

    def names(self) -> list[str]:
        """Every provider name, registered or from the ``providers`` setting, sorted."""
        return sorted(set(self._entries) | set(self._endpoint_settings()))

    def entries(self) -> list[RegisteredProvider]:
        """Every registration, sorted by name (for ``datamachine plugins`` style listings)."""
        return [self._entries[name] for name in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._entries
                                          or name in self._endpoint_settings())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

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

    def close(self) -> None:
        """Close every provider that holds connections (``close()``); one that fails is
        logged, and the others are still closed."""
        for provider in self._providers_once():
            _close_quietly(provider)

    async def aclose(self) -> None:
        """:meth:`close` inside an event loop: ``aclose()`` is awaited where a provider has it."""
        for provider in self._providers_once():
            try:
                aclose = getattr(provider, "aclose", None)
                if callable(aclose):
                    await aclose()
                    continue
                close = getattr(provider, "close", None)
                if callable(close):
                    close()
            except Exception:
                logger.warning("datamachine: closing provider %r failed",
                               getattr(provider, "name", "?"), exc_info=True)

    def _providers_once(self) -> list[Provider]:
        seen: dict[int, Provider] = {}
        for entry in self._entries.values():
            seen.setdefault(id(entry.provider), entry.provider)
        for _, provider in self._from_settings.values():
            seen.setdefault(id(provider), provider)
        return list(seen.values())

    def bind_settings(self, lookup: Callable[[str], Any]) -> None:
        """Read the ``providers`` setting through ``lookup`` (a host's ``settings.get``), and
        give providers that read host settings (``bind_settings``) the same lookup."""
        self._lookup = lookup
        for entry in self._entries.values():
            bind = getattr(entry.provider, "bind_settings", None)
            if callable(bind):
                bind(lookup)


def _close_quietly(provider: object) -> None:
    close = getattr(provider, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            logger.warning("datamachine: closing provider %r failed",
                           getattr(provider, "name", "?"), exc_info=True)
