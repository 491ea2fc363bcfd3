"""The plugin manager: loading plugins, and calling hooks the way the source's filters behave.

Built-in providers and tools are default plugins registered exactly like third-party ones.
Installed plugins come from the ``datamachine`` entry point group, loaded in a deterministic
order (distribution name, then entry point name) so two machines with the same packages behave
the same. Each host gets its own manager: nothing here is global.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from agents_api.errors import brief_repr
from datamachine import hookspecs
from datamachine.errors import DataMachineError, PluginLoadError, PluginLoadWarning

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "collect",
    "first_result",
    "fold_value",
    "make_plugin_manager",
]

ENTRY_POINT_GROUP = "datamachine"
LOAD_PLUGINS_ENV = "DATAMACHINE_LOAD_PLUGINS"
TRACE_HOOKS_ENV = "DATAMACHINE_TRACE_HOOKS"

# Modules registered in every host before entry points; later issues add providers and tools.
def _has_otel_api() -> bool:
    """Whether OpenTelemetry's API (not only its namespace: opentelemetry-proto alone brings
    that) is installed."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # the namespace is there, its API is not
        return False


# The tracing plugin only when OpenTelemetry's API is installed (the ``otel`` extra): found,
# not imported, so booting stays light.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "datamachine.default_plugins.providers",
    "datamachine.default_plugins.remote_agent",
    *(("datamachine.default_plugins.otel",) if _has_otel_api() else ()),
)


@dataclass(frozen=True)
class PluginInfo:
    """Where a loaded plugin came from, for ``datamachine plugins`` and error messages."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    source: str = "explicit"  # "default", "entrypoint" or "explicit"


def _normalize_dist(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _allowed_distributions(environ: Mapping[str, str]) -> set[str] | None:
    raw = environ.get(LOAD_PLUGINS_ENV)
    if raw is None:
        return None
    return {_normalize_dist(part) for part in raw.split(",") if part.strip()}


def _plugin_list(plugins: object) -> list[object]:
    """``boot(plugins=...)`` as a list, refusing what pluggy would register with no hooks at
    all (a module's name as text, a number, None): such a plugin loads nothing and says
    nothing, and the run later misses its provider or budget without a word why."""
    if isinstance(plugins, str | bytes | Mapping) or not isinstance(plugins, Iterable):
        raise PluginLoadError(f"plugins must be a list of plugin modules or objects with "
                              f"hookimpls, got {brief_repr(plugins)}.")
    found = list(plugins)
    for index, plugin in enumerate(found):
        if isinstance(plugin, str):
            raise PluginLoadError(
                f"plugins[{index}] is the text {brief_repr(plugin)}: pass the module itself "
                f"(plugins=[importlib.import_module({plugin!r})]) or an object with hookimpls.")
        if plugin is None or isinstance(plugin, bytes | int | float | complex):
            raise PluginLoadError(f"plugins[{index}] must be a plugin module or an object with "
                                  f"hookimpls, got {brief_repr(plugin)}.")
    return found


def make_plugin_manager(
    plugins: Iterable[object] = (),
    *,
    load_entrypoints: bool = True,
    environ: Mapping[str, str] | None = None,
) -> tuple[pluggy.PluginManager, dict[str, PluginInfo]]:
    """A fresh manager with the hookspecs, default plugins, entry points and ``plugins``.

    ``check_pending()`` runs before returning, so a misspelled hookimpl fails here, loudly.
    """
    env = os.environ if environ is None else environ
    pm = pluggy.PluginManager("datamachine")
    pm.add_hookspecs(hookspecs)
    infos: dict[str, PluginInfo] = {}

    for module_name in DEFAULT_PLUGINS:
        module = importlib.import_module(module_name)
        pm.register(module, name=module_name)
        infos[module_name] = PluginInfo(module_name, module_name, source="default")

    if load_entrypoints:
        _load_entrypoints(pm, infos, _allowed_distributions(env))
        _drop_misspelled(pm, infos)

    for plugin in _plugin_list(plugins):
        module_name = getattr(plugin, "__name__", type(plugin).__name__)
        try:
            name = pm.register(plugin)
        except ValueError as exc:
            raise PluginLoadError(f"Cannot register plugin {module_name!r}: {exc}") from None
        if name is None:  # blocked or already registered
            continue
        infos[name] = PluginInfo(name, str(module_name))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(
            f"Plugin {exc.plugin!r} implements a hook that does not exist: {exc}. "
            "Check the spelling against `datamachine docs hooks`."
        ) from None

    if _tracing(env):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm, infos


def _load_entrypoints(
    pm: pluggy.PluginManager, infos: dict[str, PluginInfo], allowed: set[str] | None
) -> None:
    from importlib.metadata import entry_points

    found = []
    installed: list[tuple[str, str]] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        # Each ``dist.name`` / ``dist.version`` parses the METADATA file anew: read it once.
        metadata = ep.dist.metadata if ep.dist is not None else None
        dist_name = metadata["Name"] if metadata is not None else ""
        version = metadata["Version"] if metadata is not None else None
        names = (_normalize_dist(dist_name), _normalize_dist(ep.name))
        installed.append(names)
        # DATAMACHINE_LOAD_PLUGINS names a distribution, or a plugin as `datamachine plugins`
        # shows it (its entry point name).
        if allowed is not None and not allowed.intersection(names):
            continue
        found.append((names[0], ep.name, ep, version))
    if allowed:
        _warn_unknown_names(allowed, installed)
    for dist_name, ep_name, ep, version in sorted(found, key=lambda item: (item[0], item[1])):
        try:
            plugin = ep.load()
            if pm.is_registered(plugin):
                continue
            name = ep_name if pm.get_plugin(ep_name) is None else f"{dist_name}:{ep_name}"
            pm.register(plugin, name=name)
        except Exception as exc:  # an ImportError, a bad hookimpl, anything the module raises
            _skip_broken(ep_name, dist_name, version, exc)
            continue
        infos[name] = PluginInfo(name, ep.value, dist_name, version, source="entrypoint")


def _warn_unknown_names(allowed: set[str], installed: list[tuple[str, str]]) -> None:
    """A name in DATAMACHINE_LOAD_PLUGINS that no installed plugin has loads nothing: say so
    rather than start quietly without the plugin that was meant."""
    known = {name for pair in installed for name in pair}
    unknown = sorted(allowed - known)
    if unknown:
        listed = ", ".join(sorted(f"{dist} ({ep})" for dist, ep in set(installed))) or "none"
        warnings.warn(
            f"{LOAD_PLUGINS_ENV} names {', '.join(map(repr, unknown))}, which no installed "
            f"plugin has; installed plugins, by distribution (plugin): {listed}.",
            PluginLoadWarning, stacklevel=3)


def _skip_broken(ep_name: str, dist_name: str, version: str | None, exc: BaseException) -> None:
    """Warn, in one line, that an installed plugin was left out, and how to stop loading it."""
    why = " ".join(f"{type(exc).__name__}: {exc}".split())
    if len(why) > 300:
        why = why[:297] + "..."
    release = f"{dist_name} {version}" if version else dist_name or "an unknown distribution"
    warnings.warn(
        f"plugin {ep_name!r} ({release}) failed to load and was skipped: {why}. Fix or "
        f"uninstall {dist_name or 'it'}, or set {LOAD_PLUGINS_ENV} to the plugins to load "
        f"(comma-separated distributions; empty for none).",
        PluginLoadWarning, stacklevel=2)


def _drop_misspelled(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> None:
    """Skip each installed plugin that implements a hook that does not exist (a misspelling);
    runs before the caller's own plugins are registered, which still fail the boot."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            info = infos.get(name) if name is not None else None
            if name is None or info is None or info.source != "entrypoint":
                return  # not an installed plugin: the final check reports it
            pm.unregister(exc.plugin)
            del infos[name]
            _skip_broken(name, info.distribution or "", info.version,
                         RuntimeError(f"it implements a hook that does not exist ({exc})"))


def _tracing(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(TRACE_HOOKS_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def _impls(hook: pluggy.HookCaller) -> list[pluggy.HookImpl]:
    # pluggy calls impls in reverse registration order (tryfirst first, trylast last).
    return [impl for impl in reversed(hook.get_hookimpls())
            if not (impl.hookwrapper or impl.wrapper)]


def fold_value(pm: pluggy.PluginManager, hook_name: str, value: Any, **kwargs: Any) -> Any:
    """Pass ``value`` through every impl of a value-filter hook, in pluggy's call order.

    Each impl receives the current value and may return a new one; ``None`` leaves it unchanged.
    """
    hook: pluggy.HookCaller = getattr(pm.hook, hook_name)
    impls = _impls(hook)
    if not impls:
        return value
    tracing = _tracing()
    for impl in impls:
        args = {"value": value, **kwargs}
        try:
            out = impl.function(*[args[name] for name in impl.argnames])
        except KeyError as exc:
            raise PluginLoadError(
                f"Plugin {impl.plugin_name!r} asks {hook_name} for argument {exc.args[0]!r}, "
                "which the hook does not provide."
            ) from None
        if tracing:
            sys.stderr.write(f"{hook_name} [{impl.plugin_name}] {value!r} -> {out!r}\n")
        if out is not None:
            value = out
    return value


def first_result(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> Any:
    """Call a ``firstresult`` hook: the first non-None answer, or None when nobody has one."""
    hook: pluggy.HookCaller = getattr(pm.hook, hook_name)
    return hook(**kwargs)


def plugin_failed(plugin_name: str, where: str, exc: BaseException) -> PluginLoadError:
    """One line for a plugin whose hook raised at boot: what it raised and how to boot without
    it (the traceback stays with ``--debug``, chained)."""
    why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return PluginLoadError(
        f"Plugin {plugin_name!r} failed in {where}: {why}. Fix or uninstall it, or leave it out "
        f"with {LOAD_PLUGINS_ENV} (comma-separated distributions or plugins to load).")


def collect(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """Call a registration hook impl by impl, tagging each returned item with its plugin name."""
    hook: pluggy.HookCaller = getattr(pm.hook, hook_name)
    collected: list[tuple[str, Any]] = []
    tracing = _tracing()
    for impl in _impls(hook):
        try:
            items = impl.function(*[kwargs[name] for name in impl.argnames])
        except DataMachineError:
            raise
        except Exception as exc:
            raise plugin_failed(impl.plugin_name, f"{hook_name}()", exc) from exc
        if tracing:
            sys.stderr.write(f"{hook_name} [{impl.plugin_name}] -> {items!r}\n")
        if items is None:
            continue
        if not isinstance(items, list | tuple):
            raise PluginLoadError(
                f"Plugin {impl.plugin_name!r}: {hook_name}() must return a list, "
                f"got {type(items).__name__}."
            )
        collected.extend((impl.plugin_name, item) for item in items)
    return collected
