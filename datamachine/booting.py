"""Boot a datamachine host: plugins, database, settings and the built-in budgets.

The built-in budgets are registered here, before any plugin's budgets are collected, so a plugin
that claims a built-in name fails at boot with both owners named.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agents_api.errors import brief_repr
from datamachine.budgets_builtin import BUILTIN_BUDGETS, BUILTIN_OWNER
from datamachine.errors import (
    DataMachineError,
    DuplicateBudgetError,
    DuplicateSettingError,
    InvalidBudgetSpec,
    InvalidSetting,
    PluginLoadError,
    UsageError,
)
from datamachine.host import Host
from datamachine.job_queue import JobQueue
from datamachine.modes import collect_modes
from datamachine.plugins import collect, make_plugin_manager, plugin_failed
from datamachine.providers.registry import ProviderRegistry
from datamachine.registry import BudgetSpec, BudgetSpecs, IterationBudgetRegistry
from datamachine.server.site import ensure_site_id
from datamachine.setting_rules import (
    CORE_SETTINGS,
    check_provider_setting,
    check_tools_setting,
)
from datamachine.setting_spec import CORE_OWNER, SettingDeclarations, SettingSpec
from datamachine.settings import Settings
from datamachine.storage import (
    ChatSessionStore,
    JobStore,
    SettingsStore,
    SpendStore,
    TaskQueueStore,
    TokenStore,
    TranscriptStore,
)
from datamachine.storage.database import default_db_target, is_postgres_url, open_handle
from datamachine.tools.registry import ToolRegistry

__all__ = ["boot"]


def boot(
    db_path: str | Path | None = None,
    plugins: Iterable[object] = (),
    load_entrypoints: bool = True,
) -> Host:
    """Build an isolated host.

    ``db_path``: a file path, ``":memory:"``, a ``postgresql://`` URL (DESIGN.md 18), or None
    for ``$DATAMACHINE_DB`` / the user data directory. ``plugins``: extra plugin modules or
    objects registered after the installed ones. ``load_entrypoints=False`` skips installed
    plugins (``DATAMACHINE_LOAD_PLUGINS`` narrows them).
    """
    if db_path is not None and not isinstance(db_path, str | os.PathLike):
        raise UsageError(f"db_path must be a file path, ':memory:', a postgresql:// URL or "
                         f"None (for $DATAMACHINE_DB), got {brief_repr(db_path)}.")
    pm, infos = make_plugin_manager(plugins, load_entrypoints=load_entrypoints)
    target = default_db_target() if db_path is None else db_path
    resolved_path = None if str(target) == ":memory:" or is_postgres_url(target) \
        else Path(target).expanduser()
    handle = open_handle(db_path)
    specs = BudgetSpecs()  # the budgets' settings are declared by the budgets
    tools: list[ToolRegistry] = []  # filled below: the validator outlives this function
    legacy = bool(pm.hook.validate_setting.get_hookimpls())

    def validate(key: str, value: object) -> None:
        # What a declaration cannot know: this host's tools and providers, and the plugins
        # that still check their keys through the older validate_setting hook.
        if legacy:
            _plugin_setting_check(pm, key, value)
        if tools:
            check_tools_setting(key, value, tools[0])
            check_provider_setting(key, value, providers)

    declarations = SettingDeclarations(budgets=specs)
    settings = Settings(SettingsStore(handle), validator=validate, declarations=declarations)
    registry = IterationBudgetRegistry(settings.get, specs=specs)
    for spec in BUILTIN_BUDGETS:
        registry.register(spec, owner=BUILTIN_OWNER)
    _register_plugin_budgets(pm, registry)
    _declare_settings(pm, declarations)
    transcripts = TranscriptStore(handle)
    providers = ProviderRegistry.from_plugin_manager(pm)
    providers.bind_settings(settings.get)
    tools.append(ToolRegistry.from_plugin_manager(pm))
    queue = JobQueue(TaskQueueStore(handle), tools=tools[0], providers=providers,
                     budgets=registry)
    host = Host(pm=pm, handle=handle, settings=settings, budgets=registry, db_path=resolved_path,
                plugins=infos, providers=providers, tools=tools[0],
                transcripts=transcripts, jobs=JobStore(handle, queue=queue), queue=queue,
                chat_sessions=ChatSessionStore(handle, budgets=registry,
                                               transcripts=transcripts),
                tokens=TokenStore(handle), spend=SpendStore(handle), modes=collect_modes(pm))
    # Every host has a site id from its first boot (agent-to-agent chains use it). A bad one
    # (stored by hand or by an older version) must not stop the boot: `datamachine settings`
    # has to run to fix it, and what needs the id (serve, call_remote_agent) refuses it there.
    with contextlib.suppress(DataMachineError):
        ensure_site_id(host)
    try:
        _start_plugins(pm, host)
    except BaseException:
        host.close()  # what started before the failure is stopped again
        raise
    return host


def _start_plugins(pm: Any, host: Host) -> None:
    """Each plugin's ``host_started``, in pluggy's order; one that raises stops the boot with
    one line naming it (and how to boot without it)."""
    for impl in reversed(pm.hook.host_started.get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            impl.function(*[{"host": host}[name] for name in impl.argnames])
        except DataMachineError:
            raise
        except Exception as exc:
            raise plugin_failed(impl.plugin_name, "host_started()", exc) from exc


def _plugin_setting_check(pm: Any, key: str, value: object) -> None:
    """A plugin's word on a setting it owns (the ``validate_setting`` hook)."""
    try:
        pm.hook.validate_setting(key=key, value=value)
    except InvalidSetting:
        raise
    except ValueError as exc:  # UsageError included
        text = str(exc)
        raise InvalidSetting(text if key in text else f"Setting {key!r}: {text}") from None


def _declare_settings(pm: Any, declarations: SettingDeclarations) -> None:
    """The core's settings, then each plugin's (``register_settings``); a name declared twice,
    or declared and also a budget's setting, stops the boot naming both owners."""
    for spec in CORE_SETTINGS:
        declarations.declare(spec, owner=CORE_OWNER)
    for plugin_name, item in collect(pm, "register_settings"):
        if not isinstance(item, SettingSpec):
            raise PluginLoadError(
                f"Plugin {plugin_name!r}: register_settings() items must be SettingSpec "
                f"objects, got {item!r}.")
        owner = declarations.owner(item.name)
        if owner is not None:
            raise DuplicateSettingError(
                f"Setting {item.name!r} is declared by both {owner!r} and {plugin_name!r}; "
                "rename one of them (setting names are global to a host).")
        declarations.declare(item, owner=plugin_name)
    conflicts = declarations.budget_conflicts()
    if conflicts:
        key, owner, budget, budget_owner = conflicts[0]
        raise DuplicateSettingError(
            f"Setting {key!r} is declared by {owner!r} and is also the setting of the budget "
            f"{budget!r} (registered by {budget_owner!r}); rename one of them (setting names "
            "are global to a host).")


def _register_plugin_budgets(pm: object, registry: IterationBudgetRegistry) -> None:
    for plugin_name, item in collect(pm, "register_budgets"):  # type: ignore[arg-type]
        if isinstance(item, BudgetSpec):
            spec = item
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            try:
                spec = BudgetSpec.from_config(item[0], item[1])
            except InvalidBudgetSpec as exc:
                raise InvalidBudgetSpec(f"Plugin {plugin_name!r}: {exc}") from None
        else:
            raise PluginLoadError(
                f"Plugin {plugin_name!r}: register_budgets() items must be BudgetSpec objects "
                f"or (name, config) pairs, got {item!r}."
            )
        owner = registry.owner(spec.name)
        if owner is not None:
            raise DuplicateBudgetError(
                f"Budget {spec.name!r} is registered by both {owner!r} and {plugin_name!r}; "
                "rename one of them (budget names are global to a host)."
            )
        reader = registry.reader_of(spec.setting, besides=spec.name)
        if reader is not None:
            raise DuplicateSettingError(
                f"Setting {spec.setting!r} feeds budget {reader!r} of {registry.owner(reader)!r} "
                f"and budget {spec.name!r} of {plugin_name!r}; give one of them a setting of "
                "its own (a setting decides one budget's limit)."
            )
        registry.register(spec, owner=plugin_name)


