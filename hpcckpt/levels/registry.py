"""The registered checkpoint levels (local, pure): ``register`` (a class decorator), ``level_class``
and ``LEVELS``, the live sequence of their names, cheapest first (by ``Level.order``).

Each level's module registers its class itself. The built-in level modules are imported on the
first question; more come from the modules named in ``HPCCKPT_LEVEL_MODULES`` (comma-separated,
imported on every rank and by the command line) and from the ``hpcckpt.levels`` entry points of
installed packages. Every rank must register the same levels (the settings digest includes them).
While those modules are imported, the registry answers with what is registered so far.
"""
import collections.abc
import importlib
import os
import threading

from ..errors import ConfigError

BUILTIN_MODULES = ("hpcckpt.levels.local", "hpcckpt.levels.partner", "hpcckpt.levels.encoded",
                   "hpcckpt.levels.pfs_level")
MODULES_ENV = "HPCCKPT_LEVEL_MODULES"
ENTRY_POINTS = "hpcckpt.levels"

_classes = {}
_loaded = False
_loading = threading.RLock()


def register(cls):
    """Class decorator: register a ``levels.base.Level`` subclass under ``cls.name``."""
    from .base import FAILURES, Level
    if not (isinstance(cls, type) and issubclass(cls, Level)):
        raise TypeError(f"register: {cls!r} is not a subclass of hpcckpt.levels.base.Level")
    name = cls.name
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"register: level name {name!r} must be a lower-case identifier")
    if not isinstance(cls.order, (int, float)) or isinstance(cls.order, bool):
        raise ValueError(f"register: level {name!r} needs a numeric order (cheapest first)")
    old = _classes.get(name)
    if old is not None and old is not cls and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"register: a level named {name!r} is registered already ({old.__module__}.{old.__qualname__})")
    clash = [c.name for c in _classes.values() if c.order == cls.order and c.name != name]
    if clash:
        raise ValueError(f"register: level {name!r} has the order {cls.order} of level {clash[0]!r}")
    from .options import Setting
    for key, setting in dict(cls.settings).items():
        if not (isinstance(key, str) and key.isidentifier() and key == key.lower()) or not isinstance(setting, Setting):
            raise ValueError(f"register: level {name!r}: settings must map lower-case identifiers to "
                             f"options.Setting, not {key!r}: {setting!r}")
    if cls.survives not in FAILURES:
        raise ValueError(f"register: level {name!r} survives {cls.survives!r}, not one of {', '.join(FAILURES)}")
    if cls.redundant and cls.restores:
        raise ValueError(f"register: level {name!r} cannot be both redundant and restoring")
    _classes[name] = cls
    return cls


def unregister(name):
    """Remove the level registered as ``name`` (a test's, a plug-in's); KeyError when there is none.
    Built-in levels cannot be removed."""
    cls = _classes[name]
    if cls.__module__ in BUILTIN_MODULES:
        raise ValueError(f"unregister: {name!r} is a built-in level")
    del _classes[name]


def _load():
    global _loaded
    if _loaded:
        return
    with _loading:
        if _loaded:
            return
        _loaded = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        for module in filter(None, (m.strip() for m in os.environ.get(MODULES_ENV, "").split(","))):
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"{MODULES_ENV}: cannot import level module {module!r}: {e}") from e
        try:
            from importlib.metadata import entry_points
            found = entry_points(group=ENTRY_POINTS)
        except Exception:  # noqa: BLE001 - broken package metadata: no plug-in levels
            found = ()
        for ep in found:
            ep.load()


def classes():
    """{name: Level subclass}, cheapest first."""
    _load()
    return dict(sorted(_classes.items(), key=lambda kv: kv[1].order))


def level_class(name):
    """The registered Level subclass called ``name``; ConfigError when there is none."""
    _load()
    cls = _classes.get(name)
    if cls is None:
        raise ConfigError(f"unknown level {name!r}; levels are {', '.join(LEVELS)}")
    return cls


def redundant():
    """Names of the redundant levels (copies or parity in other nodes' caches), cheapest first."""
    return tuple(n for n, c in classes().items() if c.redundant)


def restoring():
    """Names of the levels that keep a copy of their own and restore from it, cheapest first."""
    return tuple(n for n, c in classes().items() if c.restores)


def cheapest_surviving():
    """{failure (base.FAILURES): the cheapest level that survives it} (``Level.survives``; a
    failure no level survives is left out)."""
    from .base import FAILURES
    out = {}
    for name, cls in classes().items():
        for failure in FAILURES[:FAILURES.index(cls.survives) + 1]:
            out.setdefault(failure, name)
    return {f: out[f] for f in FAILURES if f in out}


class _Names(collections.abc.Sequence):
    """The registered level names, cheapest first, as a live tuple-like sequence."""

    def _names(self):
        return tuple(classes())

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self):
        return len(self._names())

    def __contains__(self, name):
        return name in self._names()

    def index(self, name, *args):
        return self._names().index(name, *args)

    def __eq__(self, other):
        return tuple(self) == tuple(other)

    def __hash__(self):
        return hash(self._names())

    def __repr__(self):
        return repr(self._names())


LEVELS = _Names()
