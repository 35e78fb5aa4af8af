"""Config: a frozen dataclass and its layered loader (local, pure apart from reading a file).

Precedence: defaults < TOML file < ``HPCCKPT_<KEY>`` environment variables < keyword arguments.
Unknown keys are an error wherever they come from. A level's own settings (levels/options.py) are
a table per level (``[rs]``) and ``HPCCKPT_<LEVEL>_<KEY>``, layered the same way.
"""
import dataclasses
import fcntl
import getpass
import os
import re
import stat
import string
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .errors import ConfigError
from .units import parse_duration, parse_size

from .levels import options
from .levels.registry import LEVELS, MODULES_ENV  # noqa: E402 - one definition of the level names
POLICIES = ("auto", "fixed", "young", "daly", "multilevel")
WRITE_METHODS = ("mmap", "pwrite")       # how the local level writes its data files (data_file.write_arrays)
STARTS = ("resume", "fresh")             # what restart() does: restore the newest checkpoint, or none
STALL_ACTIONS = ("warn", "abort")        # what the stall watchdog does after reporting (hpcckpt.watchdog)
LOCAL_KEYS = ("log_level", "stall_timeout", "stall_action")   # may differ between ranks (no message depends on them)
CONFIG_FILE_MAX = 1 << 20                # a TOML config file larger than this (bytes) is refused
ENV_PREFIX = "HPCCKPT_"
CACHE_PLACEHOLDERS = ("node", "user", "name")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_cache_dir(environ=None):
    """Node-local default: $SLURM_TMPDIR, else $TMPDIR, else /dev/shm; one folder per virtual node."""
    environ = os.environ if environ is None else environ
    base = environ.get("SLURM_TMPDIR") or environ.get("TMPDIR") or "/dev/shm"
    return os.path.join(base, "hpcckpt-{user}", "node{node}")


@dataclasses.dataclass(frozen=True)
class Config:
    """All settings of a Checkpointer. Build it with ``Config.load``; fields are validated."""
    name: str = "hpcckpt"
    cache_dir: str = ""                 # "" -> default_cache_dir(); placeholders {node} {user} {name}
    pfs_dir: str = "hpcckpt-pfs"
    ranks_per_node: Any = "auto"        # "auto" (MPI shared-memory split) or an int
    group_size: int = 4
    rs_parity: int = 2
    keep: int = 2
    level: str = "local"                # level of checkpoint(step) when nothing else is due
    policy: str = "auto"
    schedule: Any = None                # {level: ("steps", n) | ("seconds", s)}
    mtbf: Any = None                    # seconds or None
    level_mtbf: Any = None              # {level: seconds}
    end_time: Any = None                # absolute epoch seconds of the job's end, or None
    exit_safety: float = 2.0
    end_margin: Any = 0.0               # seconds before end_time (or the SLURM job's end) to end by
    stop_signals: Any = "auto"          # signals that request a final pfs checkpoint and exit
    async_flush: bool = False           # pfs: return once staged in the cache, flush in the background
    background: bool = False            # partner/xor/rs and pfs: return once the local level is committed
    io_chunk: int = 1 << 20             # bytes hashed and written per step (fault hooks, pwrite calls)
    incremental: bool = False           # partner/xor/rs: send and write only the blocks changed since a full base
    incremental_block: int = 1 << 20    # bytes per block compared between checkpoints (incremental)
    incremental_full_every: int = 8     # a full redundant checkpoint after this many incremental ones
    incremental_max_changed: float = 0.5  # a full one when a rank changed more than this fraction of its blocks
    pfs_direct_io: Any = "auto"         # pfs: write large arrays with O_DIRECT, laid out before the cache write;
                                        # "auto": when reuse_files is off (new files at every step)
    write_method: str = "mmap"          # local data files: "mmap" (copy+checksum in one pass) or "pwrite"
    reuse_files: bool = True            # overwrite retired files instead of creating new ones
    cache_fsync: bool = False           # fsync node-local data files (not needed on tmpfs)
    file_mode: int = 0o600
    dir_mode: int = 0o700
    log_level: str = "WARNING"
    events_file: str = ""               # rank 0 appends one JSON line per checkpoint/restart/... ("" none; events.py)
    start: str = "resume"               # "resume": restart() restores the newest checkpoint; "fresh": none
    abort_on_error: bool = True         # MPI_Abort when an exception leaves the block on some ranks only
    stall_timeout: float = 600.0        # seconds a wait inside an hpcckpt call may last before it is reported; 0: off
    stall_action: str = "warn"          # after reporting a stall: "warn" (go on waiting) or "abort" (MPI_Abort)
    level_settings: Any = None          # {level: {key: value}}: the levels' settings without a flat key
                                        # (levels/options.py); None: their defaults

    @classmethod
    def load(cls, config=None, environ=None, **overrides):
        """Layer defaults < file/dict/Config < environment < overrides (in each, flat keys and the
        levels' own settings: levels/options.py); validate; return a Config."""
        environ = os.environ if environ is None else environ
        layers = []
        if isinstance(config, Config):
            layer = options.Layer("the Config")
            layer.flat = config.as_dict()
            layer.own = layer.flat.pop("level_settings") or {}
            layers.append(layer)
        elif isinstance(config, dict):
            layers.append(_layer(config, "config dict"))
        elif isinstance(config, (str, os.PathLike)):
            layers.append(_layer(_read_toml(config), f"config file {os.fspath(config)!r}"))
        elif config is not None:
            raise ConfigError(f"config must be a TOML path, a dict or a Config, not {type(config).__name__}")
        layers.append(_from_environ(environ))
        layers.append(_layer(overrides, "keyword arguments"))
        values, own = {}, {}
        for layer in layers:
            values.update(layer.flat)
            for name, table in layer.own.items():
                own.setdefault(name, {}).update(table)
        if not values.get("cache_dir"):
            values["cache_dir"] = default_cache_dir(environ)
        return cls(**{k: _parse_value(k, v) for k, v in values.items()},
                   level_settings=options.own_values(own))._validated()

    @property
    def direct_io(self):
        """pfs_direct_io resolved: "auto" is on without reuse_files (a new pfs file at every step,
        where direct I/O and the early layout measured faster) and off with it (overwriting the
        spares through the page cache measured faster)."""
        return self.pfs_direct_io is True or (self.pfs_direct_io == "auto" and not self.reuse_files)

    def level_options(self, name):
        """Local: {key: value} of the settings level ``name`` declares (levels/options.py): a
        setting with a flat key from that field, the others from ``level_settings``."""
        from .levels.registry import level_class
        own = (self.level_settings or {}).get(name, {})
        return {key: getattr(self, s.flat) if s.flat else own.get(key, s.default)
                for key, s in level_class(name).settings.items()}

    def as_dict(self):
        """The fields as a plain dict; ``level_settings`` holds the levels' settings that have no
        flat key (the settings digest compares it between ranks)."""
        return dataclasses.asdict(self)

    def replace(self, **changes):
        """A copy with some settings changed, as keyword arguments of ``load`` (validated)."""
        return Config.load(self, environ={}, **changes)

    def _validated(self):
        if not _NAME_RE.match(self.name) or ".." in self.name:
            raise ConfigError(f"name {self.name!r}: use 1-128 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit (it becomes a directory name)")
        _check_placeholders(self.cache_dir)
        if not self.pfs_dir:
            raise ConfigError("pfs_dir must not be empty")
        if self.ranks_per_node != "auto" and (not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1):
            raise ConfigError(f"ranks_per_node must be 'auto' or a positive integer, got {self.ranks_per_node!r}")
        for key, low in (("group_size", 2), ("rs_parity", 1), ("keep", 1)):
            if getattr(self, key) < low:
                raise ConfigError(f"{key} must be at least {low}, got {getattr(self, key)}")
        if self.level not in LEVELS:
            raise ConfigError(f"level {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if not (1 <= self.exit_safety <= 100):
            raise ConfigError(f"exit_safety must be between 1 and 100, got {self.exit_safety}")
        if not (4096 <= self.io_chunk <= 1 << 30):
            raise ConfigError(f"io_chunk must be between 4 KiB and 1 GiB, got {self.io_chunk}")
        if not (4096 <= self.incremental_block <= 1 << 30) or self.incremental_block % 4096:
            raise ConfigError(f"incremental_block must be a multiple of 4 KiB between 4 KiB and 1 GiB, "
                              f"got {self.incremental_block}")
        if self.incremental_full_every < 1:
            raise ConfigError(f"incremental_full_every must be at least 1, got {self.incremental_full_every}")
        if not (0.0 <= self.incremental_max_changed <= 1.0):
            raise ConfigError(f"incremental_max_changed must be between 0 and 1, got {self.incremental_max_changed}")
        if self.write_method not in WRITE_METHODS:
            raise ConfigError(f"write_method {self.write_method!r} is not one of {', '.join(WRITE_METHODS)}")
        if self.start not in STARTS:
            raise ConfigError(f"start {self.start!r} is not one of {', '.join(STARTS)}")
        if self.stall_action not in STALL_ACTIONS:
            raise ConfigError(f"stall_action {self.stall_action!r} is not one of {', '.join(STALL_ACTIONS)}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"log_level must be DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}")
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "level_settings"}   # the flat keys
_FAULT_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS")
_INT_KEYS = ("group_size", "rs_parity", "keep", "incremental_full_every")
_BOOL_KEYS = ("reuse_files", "cache_fsync", "async_flush", "background", "abort_on_error", "incremental")
_AUTO_BOOL_KEYS = ("pfs_direct_io",)      # "auto", true or false
_STR_KEYS = ("name", "cache_dir", "pfs_dir", "level", "policy", "write_method", "log_level", "start", "stall_action",
             "events_file")
_TABLE_KEYS = ("schedule", "level_mtbf")


def _layer(mapping, where):
    """The options.Layer of a file, a dict or keyword arguments: flat keys and level tables."""
    unknown = sorted(str(k) for k, v in mapping.items() if k not in _FIELDS and not isinstance(v, dict)
                     and k not in LEVELS)
    if unknown:
        raise ConfigError(f"unknown config key(s) in {where}: {', '.join(unknown)}; "
                          f"known keys: {', '.join(_FIELDS)}, and a table per level")
    return options.split(mapping, where, _FIELDS)


def _read_toml(path):
    """The table of a TOML config file: a regular file (or a symlink to one) of at most
    CONFIG_FILE_MAX bytes of UTF-8. Opened without blocking, so a FIFO cannot hang the check."""
    where = f"config file {os.fspath(path)!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where} is not a regular file ({_file_kind(st.st_mode)})")
        if st.st_size > CONFIG_FILE_MAX:
            raise ConfigError(f"{where} is larger than {CONFIG_FILE_MAX >> 20} MiB")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        chunks, total = [], 0
        while total <= CONFIG_FILE_MAX:        # at most CONFIG_FILE_MAX + 1 bytes, even if it grows
            chunk = os.read(fd, CONFIG_FILE_MAX + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror}") from None
    finally:
        os.close(fd)
    if total > CONFIG_FILE_MAX:
        raise ConfigError(f"{where} is larger than {CONFIG_FILE_MAX >> 20} MiB")
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where} is not valid TOML: {e}") from None


def _file_kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "another kind of file"


TOOL_VARIABLES = ("HPCCKPT_MPI", "HPCCKPT_VENV", "HPCCKPT_VENV_OPENMPI",   # run.sh's, not configuration keys
                  MODULES_ENV)                                               # the plug-in level modules


def _from_environ(environ):
    layer = options.Layer("the environment")
    for var, text in environ.items():
        if not var.startswith(ENV_PREFIX) or var in TOOL_VARIABLES:
            continue
        key = var[len(ENV_PREFIX):].lower()
        found = options.environ_setting(key, _FIELDS)
        if key in _FIELDS:
            layer.put(key, _env_text(key, text, var), var)
        elif found is not None:
            level, name, setting = found
            value = _env_text(setting.flat, text, var) if setting.flat else setting.from_text(text, var)
            layer.put_level(level, name, setting, value, var)
        else:
            raise ConfigError(f"unknown config key in environment variable {var}; "
                              f"known keys: {', '.join(_FIELDS)}, and HPCCKPT_<LEVEL>_<KEY> of a level's settings")
    return layer


def _env_text(key, text, var):
    """Environment values are text: turn them into what a TOML file would hold."""
    text = text.strip()
    if key in _TABLE_KEYS:
        if text.startswith("{"):
            try:
                return tomllib.loads(f"v = {text}")["v"]
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{var}: not a TOML inline table: {e}") from None
        table = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in item:
                raise ConfigError(f"{var}: expected 'level=value,...', got {text!r}")
            k, v = (s.strip() for s in item.split("=", 1))
            if k in table:
                raise ConfigError(f"{var}: {k!r} is given twice in {text!r}")
            table[k] = int(v) if v.isdigit() else v
        return table
    if key in _AUTO_BOOL_KEYS and text.lower() == "auto":
        return "auto"
    if key in _BOOL_KEYS + _AUTO_BOOL_KEYS:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{var}: expected true or false{' or auto' if key in _AUTO_BOOL_KEYS else ''}, "
                          f"got {text!r}")
    if key in _INT_KEYS:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{var}: expected an integer, got {text!r}") from None
    if key == "ranks_per_node":
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{var}: expected 'auto' or an integer, got {text!r}") from None
    if key in ("exit_safety", "end_time"):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{var}: expected a number, got {text!r}") from None
    if key in ("file_mode", "dir_mode"):
        try:
            return int(text, 8)
        except ValueError:
            raise ConfigError(f"{var}: expected an octal mode like 0600, got {text!r}") from None
    return text


def _parse_value(key, value):
    """Type-check one value (from any layer) and normalise it."""
    if key in _STR_KEYS:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    if key in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if key in _AUTO_BOOL_KEYS:
        if not isinstance(value, bool) and value != "auto":
            raise ConfigError(f"{key} must be true, false or 'auto', got {value!r}")
        return value
    if key == "ranks_per_node":
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ConfigError(f"ranks_per_node must be 'auto' or a positive integer, got {value!r}")
    if key in ("file_mode", "dir_mode"):
        if isinstance(value, str):
            try:
                value = int(value, 8)
            except ValueError:
                raise ConfigError(f"{key} must be an octal mode like '0600', got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
            raise ConfigError(f"{key} must be a permission mode between 0 and 0777, got {value!r}")
        owner = 0o600 if key == "file_mode" else 0o700        # the library reads back what it writes
        if value & owner != owner:
            raise ConfigError(f"{key} {value:#o} must give the owner {'rw' if key == 'file_mode' else 'rwx'} "
                              f"({owner:#o}): the library reads back and replaces what it writes")
        return value
    if key == "stop_signals":
        if value == "auto":
            return value
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"stop_signals must be 'auto' or a list of signal names, got {value!r}")
        import signal as _signal
        out = []
        for v in value:
            name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
            if name not in _signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
                raise ConfigError(f"stop_signals: {v!r} is not a signal that can be caught")
            if name in _FAULT_SIGNALS:
                raise ConfigError(f"stop_signals: {name} reports a fault of the process itself (a crash): a process "
                                  "that only notes it and returns runs into the fault again; use TERM, USR1, USR2, "
                                  "INT, HUP, XCPU or ALRM")
            out.append(name)
        return tuple(out)
    if key in ("io_chunk", "incremental_block"):
        return parse_size(value, key)
    if key == "incremental_max_changed":
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"incremental_max_changed must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"incremental_max_changed must be a number, got {value!r}")
        return float(value)
    if key == "exit_safety":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"exit_safety must be a number, got {value!r}")
        return float(value)
    if key == "mtbf":
        return None if value is None else parse_duration(value, "mtbf")
    if key == "end_margin":
        return parse_duration(value, "end_margin")       # refuses negative durations
    if key == "stall_timeout":      # seconds or a duration; 0, "off", "none" or false: no watchdog
        if value is None or value is False or (isinstance(value, str)
                                               and value.strip().lower() in ("off", "none", "false", "no")):
            return 0.0
        return parse_duration(value, "stall_timeout")
    if key == "end_time":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"end_time must be epoch seconds, got {value!r}")
        return float(value)
    if key == "level_mtbf":
        return None if value is None else {lv: parse_duration(v, f"level_mtbf.{lv}")
                                           for lv, v in _level_table(key, value).items()}
    if key == "schedule":
        return None if value is None else {lv: _schedule_entry(lv, v)
                                           for lv, v in _level_table(key, value).items()}
    raise ConfigError(f"unknown config key {key!r}")  # unreachable: keys were checked


def _level_table(key, value):
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table of level = value, got {value!r}")
    for lv in value:
        if lv not in LEVELS:
            raise ConfigError(f"{key}: {lv!r} is not a level; levels are {', '.join(LEVELS)}")
    return value


def _schedule_entry(level, value):
    """int -> every N steps; duration string or ("seconds", s) -> every s seconds."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] in ("steps", "seconds"):
        kind, amount = value
        return _schedule_entry(level, amount if kind == "steps" else f"{float(amount)}s")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"schedule.{level}: every N steps needs N >= 1, got {value}")
        return ("steps", value)
    if isinstance(value, str):
        seconds = parse_duration(value, f"schedule.{level}")
        if seconds <= 0:
            raise ConfigError(f"schedule.{level}: the period must be positive, got {value!r}")
        return ("seconds", seconds)
    raise ConfigError(f"schedule.{level}: expected a number of steps or a duration like '10min', got {value!r}")


def _check_placeholders(template):
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(f"cache_dir {template!r}: {e}") from None
    for f in fields:
        if f not in CACHE_PLACEHOLDERS:
            raise ConfigError(f"cache_dir {template!r}: unknown placeholder {{{f}}}; "
                              f"allowed: {', '.join('{%s}' % p for p in CACHE_PLACEHOLDERS)}")


def expand_cache_dir(cfg, node):
    """The cache directory of one node (local)."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return os.path.abspath(cfg.cache_dir.format(node=node, user=user, name=cfg.name))
