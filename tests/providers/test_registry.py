"""ProviderRegistry: collection from plugins, clashes, lookups, availability and settings."""

from __future__ import annotations

from typing import Any

import pluggy
import pytest

from datamachine import hookimpl, hookspecs
from datamachine.default_plugins import providers as default_providers
from datamachine.errors import (
    BootError,
    DuplicateProviderError,
    PluginLoadError,
    UnknownProvider,
    UsageError,
)
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.openai import OpenAIProvider
from datamachine.providers.registry import ProviderRegistry
from datamachine.providers.scripted import ScriptedProvider


class _Fixed:
    """A minimal third-party provider."""

    def __init__(self, name: str, availability: Any = True) -> None:
        self.name = name
        self._availability = availability

    def complete(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(content=f"{self.name} says hi")

    def availability(self) -> Any:
        if isinstance(self._availability, Exception):
            raise self._availability
        return self._availability


class _Plugin:
    def __init__(self, *providers: object) -> None:
        self.providers = list(providers)

    @hookimpl
    def register_providers(self) -> list[Any]:
        return self.providers


def _pm(**plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("datamachine")
    pm.add_hookspecs(hookspecs)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    pm.check_pending()
    return pm


def test_default_plugin_registers_scripted_and_openai() -> None:
    pm = _pm(**{"datamachine.default_plugins.providers": default_providers})

    registry = ProviderRegistry.from_plugin_manager(pm)

    assert registry.names() == ["openai", "scripted"]
    assert isinstance(registry.get("scripted"), ScriptedProvider)
    assert isinstance(registry.get("openai"), OpenAIProvider)
    assert registry.owner("openai") == "datamachine.default_plugins.providers"
    assert "scripted" in registry
    assert len(registry) == 2


def test_each_collection_builds_fresh_provider_objects() -> None:
    pm = _pm(defaults=default_providers)
    first = ProviderRegistry.from_plugin_manager(pm)
    second = ProviderRegistry.from_plugin_manager(pm)
    assert first.get("scripted") is not second.get("scripted")


def test_third_party_provider_registers_beside_the_defaults() -> None:
    pm = _pm(defaults=default_providers, acme=_Plugin(_Fixed("acme")))

    registry = ProviderRegistry.from_plugin_manager(pm)

    assert registry.names() == ["acme", "openai", "scripted"]
    assert registry.owner("acme") == "acme"
    assert registry.get("acme").complete(ProviderRequest(messages=[], provider="acme")) == (
        ProviderResponse(content="acme says hi"))


def test_two_plugins_claiming_one_name_is_a_boot_error_naming_both() -> None:
    pm = _pm(first_plugin=_Plugin(_Fixed("dup")), second_plugin=_Plugin(_Fixed("dup")))

    with pytest.raises(DuplicateProviderError) as caught:
        ProviderRegistry.from_plugin_manager(pm)

    message = str(caught.value)
    assert isinstance(caught.value, BootError)
    assert "'dup'" in message
    assert "'first_plugin'" in message
    assert "'second_plugin'" in message


def test_a_plugin_cannot_shadow_a_builtin_provider() -> None:
    pm = _pm(defaults=default_providers, shadow=_Plugin(_Fixed("openai")))
    with pytest.raises(DuplicateProviderError) as caught:
        ProviderRegistry.from_plugin_manager(pm)
    assert "'defaults'" in str(caught.value)
    assert "'shadow'" in str(caught.value)


@pytest.mark.parametrize(("item", "reason"), [
    (object(), "whose 'name' is None"),
    (_Fixed("has space"), "name"),
    (type("NoComplete", (), {"name": "nc"})(), "no complete(request) method"),
])
def test_items_that_are_not_providers_fail_naming_the_plugin(item: object, reason: str) -> None:
    pm = _pm(broken=_Plugin(item))
    with pytest.raises(PluginLoadError) as caught:
        ProviderRegistry.from_plugin_manager(pm)
    assert reason in str(caught.value)
    assert "'broken'" in str(caught.value)


def test_unknown_provider_lists_the_known_names() -> None:
    registry = ProviderRegistry()
    registry.register(ScriptedProvider())
    registry.register(_Fixed("acme"))

    with pytest.raises(UnknownProvider) as caught:
        registry.get("opnai")

    assert isinstance(caught.value, UsageError)
    assert "'opnai'" in str(caught.value)
    assert "acme, scripted" in str(caught.value)


@pytest.mark.parametrize(("answer", "expected"), [
    (True, True),
    ("quota used up", "quota used up"),
    (False, "reports it is unavailable"),
    ("", "reports it is unavailable"),
    (RuntimeError("probe failed"), "probe failed"),
])
def test_availability_is_true_or_a_reason(answer: Any, expected: Any) -> None:
    registry = ProviderRegistry()
    registry.register(_Fixed("p", availability=answer))

    result = registry.availability("p")

    if expected is True:
        assert result is True
    else:
        assert isinstance(result, str)
        assert expected in result


def test_builtin_availability_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ProviderRegistry.from_plugin_manager(_pm(defaults=default_providers))
    assert registry.availability("scripted") is True
    reason = registry.availability("openai")
    assert isinstance(reason, str)
    assert "OPENAI_API_KEY" in reason
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert registry.availability("openai") is True


def test_bind_settings_reaches_the_openai_provider() -> None:
    registry = ProviderRegistry.from_plugin_manager(_pm(defaults=default_providers))
    settings = {"openai_base_url": "http://127.0.0.1:11434/v1"}

    registry.bind_settings(settings.get)

    provider = registry.get("openai")
    assert isinstance(provider, OpenAIProvider)
    assert provider.resolved_base_url() == "http://127.0.0.1:11434/v1"
    assert registry.availability("openai") is True  # a local server needs no key
