"""A level's own settings (local, pure): ``Setting``, declared in ``Level.settings``, and how the
configuration layers give them (hpcckpt/config.py layers them; docs/CONFIG.md).

In the TOML file, a config dict and the keyword arguments a level's settings are a table named
after the level (``[rs]`` ``parity = 2``; ``Checkpointer(comm, rs={"parity": 2})``); the
environment has ``HPCCKPT_<LEVEL>_<KEY>`` (``HPCCKPT_RS_PARITY``). A setting that is also a flat
config key (``flat``: ``rs_parity``) keeps that key, file and environment, and its value lives in
the Config field of that name; within one layer the two may both be given only with the same
value. The settings without a flat key are ``Config.level_settings`` ({level: {key: value}}).
"""
import dataclasses

from ..errors import ConfigError
from . import registry

_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a level: its default, its type (bool, int, float, str), the flat config key
    it is also known by (or None: then the Config field of that key holds it, and checks it), and
    one line of documentation."""
    default: object
    type: type
    flat: str = None
    doc: str = ""

    def check(self, value, where):
        """Local: ``value`` as this setting's type (an int is a fine float); ConfigError naming
        ``where`` otherwise."""
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, self.type) and not (self.type is not bool and isinstance(value, bool)):
            return value
        raise ConfigError(f"{where} must be {_TYPE_NAMES.get(self.type, self.type.__name__)}, got {value!r}")

    def from_text(self, text, var):
        """Local: the text of environment variable ``var`` as this setting's type."""
        text = text.strip()
        if self.type is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
        elif self.type in (int, float):
            try:
                return self.type(text)
            except ValueError:
                pass
        else:
            return self.check(text, var)
        raise ConfigError(f"{var}: expected {_TYPE_NAMES[self.type]}, got {text!r}")


def declared():
    """Local: {level name: its settings} of the registered levels that declare any, cheapest first."""
    return {name: dict(cls.settings) for name, cls in registry.classes().items() if cls.settings}


class Layer:
    """One configuration layer (a file, a dict, the environment, keyword arguments): ``flat``
    {config key: value}, including the level settings that have a flat key, and ``own`` {level:
    {key: value}} of those that have none (type-checked)."""

    def __init__(self, where):
        self.where, self.flat, self.own, self._given = where, {}, {}, {}

    def put(self, key, value, given):
        """Local: flat ``key`` is ``value``, given as ``given`` (the key, a level's key, a variable);
        ConfigError when this layer gave it already with another value."""
        if key in self.flat and self.flat[key] != value:
            raise ConfigError(f"{self.where}: {self._given[key]} = {self.flat[key]!r} and {given} = {value!r} "
                              f"are the same setting ({key}) with different values; give it once")
        self.flat[key] = value
        self._given.setdefault(key, given)

    def put_level(self, level, key, setting, value, given):
        """Local: setting ``key`` of ``level`` is ``value`` (given as ``given``)."""
        if setting.flat is not None:
            self.put(setting.flat, value, given)
        else:
            self.own.setdefault(level, {})[key] = setting.check(value, f"{self.where}: {given}")


def split(mapping, where, fields):
    """Local: the Layer of a file, a dict or keyword arguments: keys in ``fields`` are flat, the
    others are level tables. ConfigError: a table of a level that is not registered (or not a
    table), a key its level does not declare, a flat key given twice with different values."""
    layer, settings = Layer(where), None
    for key, value in mapping.items():
        if key in fields:
            layer.put(key, value, key)
    for name, table in ((k, v) for k, v in mapping.items() if k not in fields):
        settings = declared() if settings is None else settings
        if name not in registry.LEVELS:
            raise ConfigError(f"{where}: a table {name!r}, but no level {name!r} is registered; levels are "
                              f"{', '.join(registry.LEVELS)} (a level of a plug-in module: {registry.MODULES_ENV})")
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {name} must be a table of the {name} level's settings "
                              f"([{name}] in a TOML file), got {table!r}")
        own = settings.get(name, {})
        for key, value in table.items():
            if key not in own:
                raise ConfigError(f"{where}: the {name} level has no setting {key!r}; "
                                  + (f"its settings are {', '.join(own)}" if own else "it declares none"))
            layer.put_level(name, key, own[key], value, f"{name}.{key}")
    return layer


def environ_setting(key, fields):
    """Local: (level, key, Setting) of the lower-cased variable suffix ``key`` (``rs_parity``), or
    None. ConfigError when it names two things (a flat key and another level's setting)."""
    found = [(name, key[len(name) + 1:], s[key[len(name) + 1:]]) for name, s in declared().items()
             if key.startswith(name + "_") and key[len(name) + 1:] in s]
    found = [f for f in found if key not in fields or f[2].flat != key]
    if found and (len(found) > 1 or key in fields):
        names = ([key] if key in fields else []) + [f"{n}.{k}" for n, k, _ in found]
        raise ConfigError(f"HPCCKPT_{key.upper()} names {' and '.join(names)}: rename a level or a setting")
    return found[0] if found else None


def own_values(own):
    """Local: ``Config.level_settings``: {level: {key: value}} of every registered level's
    settings without a flat key, the values of ``own`` (layered, checked) over the defaults."""
    out = {}
    for name, settings in declared().items():
        mine = {k: own.get(name, {}).get(k, s.default) for k, s in settings.items() if s.flat is None}
        if mine:
            out[name] = mine
    return out
