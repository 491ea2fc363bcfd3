"""Site settings: JSON values in the database, with ``DATAMACHINE_<KEY>`` environment
overrides.

The environment wins so a deployment can pin a value without touching the database. Every
setting is declared (:mod:`datamachine.setting_spec`): writes of a key nobody declared are
refused (keys starting with ``x_`` are the application's own, free-form), and values are checked
against their declaration (budget settings must be positive integers <= 10,000) before they land.
The rows themselves are read and written by :class:`datamachine.storage.stored_settings
.SettingsStore`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from agents_api.errors import brief_repr
from agents_api.jsontext import plain_json, unreadable
from datamachine.errors import (
    DuplicateSettingError,
    InvalidSetting,
    SiteMisconfigured,
    UsageError,
)
from datamachine.setting_spec import (
    FREE_FORM_PREFIX,
    MASK,
    MAX_DEPTH,
    SettingDeclarations,
    SettingSpec,
    default_copy,
    hide_url_passwords,
    nests_too_deep,
    read_json,
    unknown_setting,
)

if TYPE_CHECKING:
    from datamachine.storage.stored_settings import SettingsStore

__all__ = ["RESERVED_ENV", "SettingEntry", "Settings", "SettingsSnapshot"]

# Environment variables with their own meaning; they never override a setting.
RESERVED_ENV = frozenset({"DATAMACHINE_DB", "DATAMACHINE_DB_POOL_SIZE", "DATAMACHINE_LOAD_PLUGINS",
                          "DATAMACHINE_TRACE_HOOKS"})
_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_MISSING = object()
_UNREAD = object()  # a snapshot's key not read yet


def _env_name(key: str) -> str:
    return f"DATAMACHINE_{key.upper()}"


# A run reads about ten settings; these two small caches keep a read to one environment lookup
# and, for a stored number, string or boolean, no JSON decoding.
_override_names: dict[str, str | None] = {}  # key -> its variable, None when reserved
_scalars: dict[str, Any] = {}  # stored JSON text -> its value, for immutable values only
_SCALAR_TYPES = frozenset({int, float, str, bool, type(None)})


def _override_name(key: str) -> str | None:
    """The environment variable that overrides ``key``, or None when that name is reserved.

    A key seen for the first time is checked here (a key nobody could have stored is an error,
    not a silent ``None``), so only valid keys are remembered and a read of a known key costs
    one dictionary lookup."""
    if key in _override_names:
        return _override_names[key]
    Settings.check_key(key)
    env_name = _env_name(key)
    name = _override_names[key] = None if env_name in RESERVED_ENV else env_name
    return name


def _decode(encoded: str, key: str) -> Any:
    """A stored value from its JSON text; a dict or list is decoded afresh every time (the
    caller may change it), a scalar once. Text that is not JSON (written around ``set``) is
    the site's fault: :class:`SiteMisconfigured` naming the key and where the text goes wrong,
    never the text itself (it may hold a secret)."""
    value = _scalars.get(encoded, _MISSING)
    if value is _MISSING:
        fix = (f"store it again with `datamachine settings set {key} <value>` or remove it with "
               f"`datamachine settings unset {key}`.")
        try:
            value = read_json(encoded, f"The stored value of setting {key!r}")
        except UsageError as exc:  # nested too deep
            raise SiteMisconfigured(f"{str(exc).removesuffix('.')}; {fix}",
                                    setting=key) from None
        except ValueError as exc:  # json's message names a position, never the text
            raise SiteMisconfigured(
                f"The stored value of setting {key!r} is not JSON ({exc}); {fix}",
                setting=key) from None
        if type(value) in _SCALAR_TYPES and len(_scalars) < 1024:
            _scalars[encoded] = value
    return value


def _parse_env(raw: str, key: str) -> Any:
    # Env values are text; numbers, booleans and JSON objects are read as JSON so
    # DATAMACHINE_MAX_TURNS=30 means the integer 30, while plain words stay strings. A declared
    # setting reads its text by its type instead (SettingSpec.parse_text).
    try:
        return read_json(raw, f"Setting {key!r}")
    except UsageError:
        raise
    except ValueError:
        return raw


class SettingEntry(BaseModel):
    """One row of ``datamachine settings list``: a setting's declared ``type``, ``default``
    and ``description``, its effective ``value`` and where it comes from (``source``: ``env``,
    ``db`` or ``default``), who declared it (``owner``; ``declared`` is False for a stored or
    environment key nobody declares now), whether it is ``secret`` (``value`` and ``default``
    are then masked unless revealed), and ``problem``: why a run would refuse the value, else
    None."""

    model_config = ConfigDict(frozen=True)

    key: str
    type: str
    default: Any = None
    value: Any = None
    source: Literal["env", "db", "default"]
    owner: str | None = None
    declared: bool
    secret: bool = False
    description: str = ""
    problem: str | None = None



class Settings:
    """``get/set/delete/all`` over the stored settings of one host (``store``)."""

    def __init__(
        self,
        store: SettingsStore,
        *,
        environ: Mapping[str, str] | None = None,
        validator: Callable[[str, Any], None] | None = None,
        declarations: SettingDeclarations | None = None,
    ) -> None:
        self._store = store
        self._environ = environ
        # Checks beyond the declarations (tools and providers this host registers, the older
        # validate_setting hook); run after the declared check, on every write.
        self.validator = validator
        # None: nothing is declared and any key may be written (a bare Settings in a test).
        self.declarations = declarations
        self._problems: tuple[dict[str, str], tuple[tuple[str, str], ...],
                              tuple[tuple[str, str], ...]] | None = None

    @property
    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    @staticmethod
    def check_key(key: object) -> str:
        """Return ``key`` if it is a lowercase identifier, else raise InvalidSetting."""
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise InvalidSetting(
                f"Setting key {brief_repr(key)} must be a string of lowercase letters, digits "
                "and underscores, starting with a letter (for example 'max_turns')."
            )
        return key

    def get(self, key: str, default: Any = None) -> Any:
        """The environment override, else the stored value, else ``default``; a key that is
        not a setting name (None, a number, ``"Max Turns"``) raises InvalidSetting."""
        if type(key) is not str:  # before the cache lookup, which would hash it
            self.check_key(key)
        env_name = _override_name(key)
        if env_name is not None:
            # One lookup per read: a run reads about ten settings, while copying the
            # environment's DATAMACHINE_* part means decoding every variable it has.
            raw = (os.environ if self._environ is None else self._environ).get(env_name)
            if raw is not None:
                return self._from_env(key, raw)
        encoded = self._store.rows().get(key)
        return default if encoded is None else _decode(encoded, key)

    def effective(self, key: str) -> Any:
        """What the code uses for ``key``: the environment override, else the stored value,
        else the declared default (None for a key nobody declares)."""
        value = self.get(key, _MISSING)
        return default_copy(self.spec(key)) if value is _MISSING else value

    def _from_env(self, key: str, raw: str) -> Any:
        """The value of ``key`` from its environment variable's text; text that cannot be
        read (JSON nested too deep) is the site's fault: :class:`SiteMisconfigured`."""
        spec = self.declarations.get(key) if self.declarations is not None else None
        try:
            return _parse_env(raw, key) if spec is None else spec.parse_text(raw)
        except UsageError as exc:
            raise SiteMisconfigured(f"{exc} (from the environment variable {_env_name(key)}; "
                                    "change or unset it)", setting=key) from None

    def snapshot(self) -> SettingsSnapshot:
        """The settings as one run sees them: the stored rows read once, now, and each
        environment override read once, when first asked (see :class:`SettingsSnapshot`)."""
        return SettingsSnapshot(self, self._store.rows())

    def _read(self, key: str, rows: Mapping[str, str]) -> Any:
        """``get(key)`` against ``rows`` (``_MISSING`` when unset)."""
        env_name = _override_name(key)
        if env_name is not None:
            raw = (os.environ if self._environ is None else self._environ).get(env_name)
            if raw is not None:
                return self._from_env(key, raw)
        encoded = rows.get(key)
        return _MISSING if encoded is None else _decode(encoded, key)

    def batch(self) -> AbstractContextManager[None]:
        """Read several stored settings as one consistent snapshot, checking the database for
        changes once (environment overrides are still read per lookup).

        Holds the connection lock for the block (keep it short: a run's set-up uses it), so no
        other thread can write in between.
        """
        return self._store.batch()

    def source(self, key: str) -> Literal["env", "db"] | None:
        """Where ``get(key)`` reads from: ``"env"``, ``"db"`` or None (unset)."""
        self.check_key(key)
        env_name = _env_name(key)
        if env_name not in RESERVED_ENV and env_name in self._env:
            return "env"
        return "db" if key in self._store.rows() else None

    def stored(self, key: str, default: Any = None) -> Any:
        """The value in the database only, ignoring the environment."""
        self.check_key(key)
        encoded = self._store.rows().get(key)
        return default if encoded is None else _decode(encoded, key)

    def problems(self) -> list[tuple[str, str]]:
        """``(key, why)`` for every stored or environment value a run would fail on: text that
        is not JSON, or a value its declaration or the host refuses (what ``set`` would have
        refused).

        Values that reach the site around ``set`` (an environment variable, an older version's
        rules, a hand-edited database) are caught here: ``datamachine serve`` refuses to start
        on them, and ``/chat`` answers 503 while they last. Keys nobody declares are not
        problems. Cached until the stored settings or the environment change, so a server may
        ask on every request.
        """
        rows = self._store.rows()
        overrides = tuple(sorted(self._overrides().items()))
        cached = self._problems
        if cached is not None and cached[0] is rows and cached[1] == overrides:
            return list(cached[2])
        env = dict(overrides)
        found: list[tuple[str, str]] = []
        for key in sorted(set(rows) | set(env)):
            why = self._problem(key, rows, env)
            if why is not None:
                found.append((key, why))
        self._problems = (rows, overrides, tuple(found))
        return found

    def _overrides(self) -> dict[str, str]:
        """Every ``DATAMACHINE_<KEY>`` variable that overrides a setting: key -> its text."""
        found = {}
        for name, raw in self._env.items():
            if name.startswith("DATAMACHINE_") and name not in RESERVED_ENV:
                key = name[len("DATAMACHINE_"):].lower()
                if _KEY_RE.fullmatch(key) and _env_name(key) == name:
                    found[key] = raw
        return found

    def _problem(self, key: str, rows: Mapping[str, str], env: Mapping[str, str]) -> str | None:
        """Why the value of ``key`` (from ``env``, else ``rows``) cannot be used, or None."""
        spec = self.spec(key)
        try:
            value = self._from_env(key, env[key]) if key in env else _decode(rows[key], key)
        except SiteMisconfigured as exc:
            return str(exc)
        try:
            self._check(key, value, writing=False)
        except (SiteMisconfigured, UsageError, ValueError) as exc:
            text = str(exc)
            if key in env:
                text = (f"{text.rstrip('.')} (from the environment variable {_env_name(key)}: "
                        "correct it there, or unset it).")
            if spec is not None:
                # Longest first, so a secret that contains another is replaced whole; shorter
                # than four characters, replacing would mangle the message more than it hides.
                for secret in sorted(spec.secrets_in(value), key=len, reverse=True):
                    if len(secret) >= 4:
                        text = text.replace(secret, MASK)
            return text
        return None

    def _check(self, key: str, value: Any, *, writing: bool) -> None:
        """Refuse ``value`` for ``key`` as its declaration and the host's checks would; when
        ``writing``, also a key nobody declared (unless it is free-form, ``x_...``)."""
        declarations = self.declarations
        if declarations is not None:
            spec = declarations.get(key)
            if spec is not None:
                spec.check(value)
            elif writing and not key.startswith(FREE_FORM_PREFIX):
                raise unknown_setting(key, declarations.names())
        if self.validator is not None:
            self.validator(key, value)

    def set(self, key: str, value: Any) -> None:
        """Check and store ``value`` (a JSON value) under ``key``.

        ``key`` must be declared (by the core, a plugin's ``register_settings()``, a budget, or
        :meth:`declare`) or start with ``x_`` (free-form, the application's own); otherwise
        :class:`InvalidSetting` names the closest declared key. The value must fit the
        declaration (type and validator), else :class:`InvalidSetting` (or
        ``InvalidBudgetValue`` for a budget setting) says what a good value looks like.
        """
        self._store.put(key, self._encode(key, value))

    def setdefault(self, key: str, value: Any) -> Any:
        """``get(key)`` when that is not None; else store ``value`` (checked as :meth:`set`
        checks it) and return it, unless another process stored a value first: then that one.

        The check for a stored value and the write are one transaction, so processes starting
        together on one database agree on one value (the site id is made so).
        """
        current = self.get(key)
        if current is not None:
            return current
        return _decode(self._store.put_if_unset(key, self._encode(key, value)), key)

    def _encode(self, key: str, value: Any) -> str:
        """The JSON text stored for ``value`` under ``key``, after every check :meth:`set`
        documents."""
        self.check_key(key)
        if nests_too_deep(value):  # before any check walks it, past the recursion limit
            raise InvalidSetting(f"Setting {key!r} nests lists and objects more than "
                                 f"{MAX_DEPTH} levels deep (or contains itself), which no "
                                 "setting takes.")
        self._check(key, value, writing=True)
        try:
            encoded = plain_json(value)
        except (TypeError, ValueError) as exc:
            raise InvalidSetting(f"Setting {key!r} must be a JSON value: {exc}.") from None
        problem = unreadable(value)
        if problem is not None:
            # Stored, it would not read back (or not equal): every later read would fail.
            raise InvalidSetting(f"Setting {key!r}{problem[0]} cannot be stored: {problem[1]}.")
        return encoded

    def delete(self, key: str) -> bool:
        """Remove the stored value of any key, declared or not, whatever it holds; True if
        there was one (environment overrides stay). A stored key that :meth:`check_key` would
        refuse for writing (``"Bad Key"``, stored by hand) is removed too: ``settings list``
        names it, so ``settings unset`` must take it."""
        if not isinstance(key, str) or key not in self._store.rows():
            self.check_key(key)
        return self._store.remove(key)

    def all(self) -> dict[str, Any]:
        """Every stored setting, with environment overrides applied on top (declared
        defaults are not included: :meth:`entries` lists those)."""
        values = {key: _decode(encoded, key) for key, encoded in self._store.rows().items()}
        for key, raw in self._overrides().items():
            values[key] = self._from_env(key, raw)
        return dict(sorted(values.items()))

    # -- declarations ------------------------------------------------------------------------
    def declare(self, spec: SettingSpec, *, owner: str = "app") -> SettingSpec:
        """Declare a setting of your own application at run time (plugins use the
        ``register_settings()`` hook instead); redeclaring a name of the same ``owner``
        replaces it. A name the core, a plugin, a budget or another owner declared is refused
        with :class:`DuplicateSettingError` naming both (as at boot), so a declaration cannot
        loosen the checks of a setting someone else reads."""
        if self.declarations is None:
            self.declarations = SettingDeclarations()
        current = self.declarations.owner(spec.name) if isinstance(spec, SettingSpec) else None
        if current is not None and current != owner:
            raise DuplicateSettingError(
                f"Setting {spec.name!r} is declared by both {current!r} and {owner!r}; declare "
                "yours under another name (setting names are global to a host).")
        declared = self.declarations.declare(spec, owner=owner)
        self._problems = None  # a stored value may not fit the new declaration
        return declared

    def declared(self) -> list[SettingSpec]:
        """Every declared setting, sorted by name (budget settings included)."""
        return [] if self.declarations is None else self.declarations.specs()

    def spec(self, key: str) -> SettingSpec | None:
        """The declaration of ``key``, or None."""
        return None if self.declarations is None else self.declarations.get(key)

    def owner(self, key: str) -> str | None:
        """Who declared ``key``: ``core``, a plugin's name, or None when nobody did."""
        return None if self.declarations is None else self.declarations.owner(key)

    def entries(self, *, reveal: bool = False) -> list[SettingEntry]:
        """Every declared setting, and every stored or environment key nobody declares, with
        its default, value, source, owner and any problem; secrets masked unless
        ``reveal``. A value that cannot be read is reported in ``problem``, never raised."""
        rows, env = self._store.rows(), self._overrides()
        declared = set(self.declarations.names()) if self.declarations is not None else set()
        return [self._entry(key, rows, env, reveal)
                for key in sorted(declared | set(rows) | set(env))]

    def entry(self, key: str, *, reveal: bool = False) -> SettingEntry:
        """:meth:`entries`' row for ``key`` (declared or not, set or not)."""
        self.check_key(key)
        return self._entry(key, self._store.rows(), self._overrides(), reveal)

    def _entry(self, key: str, rows: Mapping[str, str], env: Mapping[str, str],
               reveal: bool) -> SettingEntry:
        spec = self.spec(key)
        source: Literal["env", "db", "default"]
        source = "env" if key in env else "db" if key in rows else "default"
        problem = None if source == "default" else self._problem(key, rows, env)
        try:
            value = (self._from_env(key, env[key]) if source == "env"
                     else _decode(rows[key], key) if source == "db" else default_copy(spec))
        except SiteMisconfigured:
            value = None  # the problem says so
        default = default_copy(spec)
        if spec is not None and spec.is_secret and not reveal:
            value = spec.masked(value, whole=problem is not None)
            default = spec.masked(default)
        elif not reveal:  # a URL's password, in any setting
            value = hide_url_passwords(value)
        return SettingEntry(
            key=key, type=spec.type_text() if spec is not None else "any JSON",
            default=default, value=value, source=source, owner=self.owner(key),
            declared=spec is not None, secret=spec is not None and spec.is_secret,
            description=spec.description if spec is not None else "", problem=problem)


class SettingsSnapshot:
    """One run's settings: read once, when the run starts, never again while it runs.

    A run reads a dozen settings while it is set up and its providers read some on every
    request; asking the database each time would cost a query per read (a ``PRAGMA
    data_version`` on SQLite, the table on PostgreSQL) and let one run see two different
    values. The stored rows are taken when the snapshot is made; an environment override is read
    when its key is first asked, then kept. A value that is a list or a dict is decoded afresh
    for each reader (a reader may change its copy); others are kept once decoded.
    """

    __slots__ = ("_rows", "_settings", "_values")

    def __init__(self, settings: Settings, rows: Mapping[str, str]) -> None:
        self._settings = settings
        self._rows = rows
        self._values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        """What :meth:`Settings.get` answered when the snapshot was made."""
        value = self._values.get(key, _UNREAD)
        if value is _UNREAD:
            if type(key) is not str:
                Settings.check_key(key)
            value = self._settings._read(key, self._rows)
            if type(value) not in _SCALAR_TYPES and value is not _MISSING:
                return value  # a fresh copy for every reader
            self._values[key] = value
        return default if value is _MISSING else value

    def source(self, key: str) -> Literal["env", "db"] | None:
        """Where :meth:`get` reads ``key`` from (as :meth:`Settings.source`)."""
        return self._settings.source(key)
