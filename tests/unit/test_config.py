"""Config: layering, typed environment values, unknown keys, validation."""

import pytest

from hpcckpt import Config, ConfigError
from hpcckpt.config import expand_cache_dir
from hpcckpt.units import parse_duration, parse_size


def test_defaults():
    cfg = Config.load(environ={})
    assert cfg.keep == 2 and cfg.ranks_per_node == "auto" and cfg.level == "local"
    assert cfg.cache_dir == "/dev/shm/hpcckpt-{user}/node{node}"


def test_cache_dir_default_follows_slurm_tmpdir_then_tmpdir():
    assert Config.load(environ={"TMPDIR": "/scratch"}).cache_dir.startswith("/scratch/")
    assert Config.load(environ={"TMPDIR": "/t", "SLURM_TMPDIR": "/s"}).cache_dir.startswith("/s/")


def test_precedence_defaults_file_env_kwargs(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('name = "fromfile"\nkeep = 3\ngroup_size = 6\nschedule = { local = 4, pfs = "1h" }\n')
    env = {"HPCCKPT_KEEP": "5", "HPCCKPT_GROUP_SIZE": "8"}
    cfg = Config.load(str(f), environ=env, group_size=3)
    assert cfg.name == "fromfile"          # file beats default
    assert cfg.keep == 5                    # environment beats file
    assert cfg.group_size == 3              # keyword beats environment
    assert cfg.schedule == {"local": ("steps", 4), "pfs": ("seconds", 3600.0)}


def test_environment_values_are_typed():
    env = {"HPCCKPT_REUSE_FILES": "false", "HPCCKPT_RANKS_PER_NODE": "2", "HPCCKPT_MTBF": "1d",
           "HPCCKPT_SCHEDULE": "local=10, partner=2h", "HPCCKPT_LEVEL_MTBF": '{ local = "1h" }',
           "HPCCKPT_FILE_MODE": "0640", "HPCCKPT_IO_CHUNK": "4MiB", "HPCCKPT_EXIT_SAFETY": "1.5",
           "HPCCKPT_WRITE_METHOD": "pwrite"}
    cfg = Config.load(environ=env)
    assert cfg.reuse_files is False and cfg.ranks_per_node == 2 and cfg.mtbf == 86400.0
    assert cfg.schedule == {"local": ("steps", 10), "partner": ("seconds", 7200.0)}
    assert cfg.level_mtbf == {"local": 3600.0}
    assert cfg.file_mode == 0o640 and cfg.io_chunk == 4 << 20 and cfg.exit_safety == 1.5
    assert cfg.write_method == "pwrite" and Config.load(environ={}).write_method == "mmap"


def test_end_margin_is_a_duration_of_zero_or_more():
    assert Config.load(environ={}).end_margin == 0.0
    assert Config.load(environ={"HPCCKPT_END_MARGIN": "2min"}).end_margin == 120.0
    assert Config.load(environ={}, end_margin=90).end_margin == 90.0
    with pytest.raises(ConfigError, match="end_margin: must be a finite, non-negative duration"):
        Config.load(environ={}, end_margin=-1)
    with pytest.raises(ConfigError, match="end_margin"):
        Config.load(environ={"HPCCKPT_END_MARGIN": "soon"})


def test_pfs_direct_io_auto_follows_reuse_files():
    assert Config.load(environ={}).pfs_direct_io == "auto"
    assert Config.load(environ={}).direct_io is False                       # reuse_files: overwrite spares
    assert Config.load(environ={}, reuse_files=False).direct_io is True     # new files at every step
    assert Config.load(environ={"HPCCKPT_PFS_DIRECT_IO": "on"}).direct_io is True
    assert Config.load(environ={"HPCCKPT_PFS_DIRECT_IO": "Auto", "HPCCKPT_REUSE_FILES": "0"}).direct_io is True
    assert Config.load(environ={}, reuse_files=False, pfs_direct_io=False).direct_io is False
    with pytest.raises(ConfigError, match="pfs_direct_io must be true, false or 'auto', got 'yes'"):
        Config.load(environ={}, pfs_direct_io="yes")
    with pytest.raises(ConfigError, match="HPCCKPT_PFS_DIRECT_IO: expected true or false or auto"):
        Config.load(environ={"HPCCKPT_PFS_DIRECT_IO": "sometimes"})


@pytest.mark.parametrize("env,needle", [
    ({"HPCCKPT_KEEP": "two"}, "HPCCKPT_KEEP: expected an integer"),
    ({"HPCCKPT_REUSE_FILES": "maybe"}, "expected true or false"),
    ({"HPCCKPT_NOPE": "1"}, "HPCCKPT_NOPE"),
    ({"HPCCKPT_SCHEDULE": "local"}, "expected 'level=value"),
    ({"HPCCKPT_SCHEDULE": "local=5,local=7"}, "'local' is given twice"),
])
def test_bad_environment_values(env, needle):
    with pytest.raises(ConfigError, match=needle):
        Config.load(environ=env)


@pytest.mark.parametrize("kwargs,needle", [
    ({"kepp": 3}, "unknown config key.*kepp"),
    ({"keep": 0}, "keep must be at least 1"),
    ({"keep": "2"}, "keep must be an integer"),
    ({"keep": True}, "keep must be an integer"),
    ({"name": "../evil"}, "name"),
    ({"name": "a/b"}, "name"),
    ({"cache_dir": "/x/{rank}"}, "unknown placeholder"),
    ({"ranks_per_node": 0}, "ranks_per_node"),
    ({"ranks_per_node": "two"}, "ranks_per_node"),
    ({"level": "tape"}, "level 'tape'"),
    ({"policy": "often"}, "policy"),
    ({"schedule": {"disk": 3}}, "not a level"),
    ({"schedule": {"local": 0}}, "N >= 1"),
    ({"schedule": {"local": "soon"}}, "duration"),
    ({"stop_signals": "TERM,SEGV"}, "SIGSEGV reports a fault"),
    ({"stop_signals": ["BUS"]}, "SIGBUS reports a fault"),
    ({"file_mode": 0}, "must give the owner rw"),
    ({"file_mode": "0400"}, "must give the owner rw"),
    ({"dir_mode": 0o600}, "must give the owner rwx"),
    ({"mtbf": "-1h"}, "mtbf"),
    ({"io_chunk": 10}, "io_chunk"),
    ({"write_method": "splice"}, "write_method 'splice' is not one of mmap, pwrite"),
    ({"file_mode": "rwx"}, "octal"),
])
def test_bad_values_are_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        Config.load(environ={}, **kwargs)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Config.load(str(tmp_path / "missing.toml"), environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("keep = = 2")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(str(bad), environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("kep = 2")
    with pytest.raises(ConfigError, match="unknown config key.*kep"):
        Config.load(str(unknown), environ={})
    with pytest.raises(ConfigError, match="config must be"):
        Config.load(42, environ={})


def test_config_object_and_replace():
    cfg = Config.load(environ={}, keep=3)
    assert Config.load(cfg, environ={}).keep == 3
    assert cfg.replace(keep=4).keep == 4
    with pytest.raises(ConfigError):
        cfg.replace(keep=-1)


def test_expand_cache_dir():
    cfg = Config.load(environ={}, cache_dir="/dev/shm/x/{name}/n{node}", name="job")
    assert expand_cache_dir(cfg, 3) == "/dev/shm/x/job/n3"


@pytest.mark.parametrize("text,seconds", [
    (90, 90.0), ("90", 90.0), ("30min", 1800.0), ("24h", 86400.0), ("1h30m", 5400.0), ("2d", 172800.0),
    ("1.5h", 5400.0), ("01:00:00", 3600.0), ("1-00:00:00", 86400.0), ("10:30", 630.0), ("500ms", 0.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 parsecs", "-3", True, None, "1:2:3:4"])
def test_bad_durations(text):
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_sizes():
    assert parse_size("64MiB") == 64 << 20 and parse_size("2GB") == 2 * 10**9 and parse_size(4096) == 4096
    with pytest.raises(ConfigError):
        parse_size("lots")


# -- config files: regular files only, at most 1 MiB, UTF-8 ------------------------------------

def test_fifo_config_is_refused_without_blocking(tmp_path):
    import os
    import threading
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    result = {}

    def load():
        try:
            Config.load(str(fifo), environ={})
        except ConfigError as e:
            result["error"] = str(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5.0)
    if t.is_alive():                       # unblock the reader so the test process can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("Config.load blocked on a FIFO")
    assert result["error"] == f"config file {str(fifo)!r} is not a regular file (a FIFO)"


def test_character_device_is_refused():
    with pytest.raises(ConfigError, match=r"^config file '/dev/zero' is not a regular file \(a character device\)$"):
        Config.load("/dev/zero", environ={})


def test_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"is not a regular file \(a directory\)$"):
        Config.load(str(tmp_path), environ={})


def test_file_larger_than_one_mib_is_refused(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(ConfigError, match=r"^config file '.*big\.toml' is larger than 1 MiB$"):
        Config.load(str(big), environ={})


def test_file_of_exactly_one_mib_is_read(tmp_path):
    from hpcckpt.config import CONFIG_FILE_MAX
    line = b'name = "edge"\n'
    f = tmp_path / "edge.toml"
    f.write_bytes(line + b"#" * (CONFIG_FILE_MAX - len(line) - 1) + b"\n")
    assert f.stat().st_size == CONFIG_FILE_MAX
    assert Config.load(str(f), environ={}).name == "edge"
    f.write_bytes(f.read_bytes() + b"\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        Config.load(str(f), environ={})


def test_growing_file_is_read_only_up_to_the_cap(tmp_path, monkeypatch):
    """A file whose size says small but that yields more (e.g. it grows) is cut at cap + 1 bytes."""
    import os
    from hpcckpt import config as config_mod
    f = tmp_path / "grows.toml"
    f.write_text('name = "x"\n')
    reads = []
    real_read = os.read

    def endless(fd, n):
        reads.append(n)
        return b"#" * n
    monkeypatch.setattr(config_mod.os, "read", endless)
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        Config.load(str(f), environ={})
    monkeypatch.setattr(config_mod.os, "read", real_read)
    assert sum(reads) == config_mod.CONFIG_FILE_MAX + 1


def test_non_utf8_file_is_a_config_error(tmp_path):
    f = tmp_path / "latin.toml"
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"^config file '.*latin\.toml' is not UTF-8 text \(byte 0xff at offset 0\)$"):
        Config.load(str(f), environ={})


def test_symlink_to_a_regular_file_is_fine(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text('name = "linked"\n')
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert Config.load(str(link), environ={}).name == "linked"


def test_unreadable_file_is_a_config_error(tmp_path):
    import os
    f = tmp_path / "secret.toml"
    f.write_text('name = "x"\n')
    f.chmod(0)
    if os.access(f, os.R_OK):
        pytest.skip("running as root: permissions are not enforced")
    with pytest.raises(ConfigError, match="cannot be read: Permission denied"):
        Config.load(str(f), environ={})


# -- start and abort_on_error ------------------------------------------------------------------

def test_start_and_abort_on_error_defaults():
    cfg = Config.load(environ={})
    assert cfg.start == "resume" and cfg.abort_on_error is True


def test_start_and_abort_on_error_from_every_layer(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('start = "fresh"\nabort_on_error = false\n')
    cfg = Config.load(str(f), environ={})
    assert cfg.start == "fresh" and cfg.abort_on_error is False
    cfg = Config.load(environ={"HPCCKPT_START": "fresh", "HPCCKPT_ABORT_ON_ERROR": "no"})
    assert cfg.start == "fresh" and cfg.abort_on_error is False
    cfg = Config.load(str(f), environ={"HPCCKPT_START": "resume", "HPCCKPT_ABORT_ON_ERROR": "1"})
    assert cfg.start == "resume" and cfg.abort_on_error is True
    assert Config.load(str(f), environ={}, start="resume").start == "resume"


@pytest.mark.parametrize("kwargs,env,needle", [
    ({"start": "again"}, {}, r"^start 'again' is not one of resume, fresh$"),
    ({"start": 1}, {}, "start must be a string"),
    ({}, {"HPCCKPT_START": "Fresh"}, "start 'Fresh' is not one of resume, fresh"),
    ({"abort_on_error": "yes"}, {}, "abort_on_error must be true or false"),
    ({"abort_on_error": 1}, {}, "abort_on_error must be true or false"),
    ({}, {"HPCCKPT_ABORT_ON_ERROR": "sometimes"}, "HPCCKPT_ABORT_ON_ERROR: expected true or false"),
])
def test_bad_start_and_abort_on_error(kwargs, env, needle):
    with pytest.raises(ConfigError, match=needle):
        Config.load(environ=env, **kwargs)


def test_rs_parity_is_not_checked_against_group_size():
    """A group of k ranks uses min(rs_parity, k - 1) parity blocks (the rs level clamps and warns),
    so a small group_size for the xor level needs no change of rs_parity."""
    assert Config.load(environ={}, group_size=2).rs_parity == 2


def test_run_sh_variables_are_not_configuration_keys():
    """HPCCKPT_MPI / HPCCKPT_VENV* choose run.sh's MPI and virtual environments; exported in a
    user's shell they must not stop every application with an unknown-key ConfigError."""
    env = {"HPCCKPT_MPI": "mpich", "HPCCKPT_VENV": "/x", "HPCCKPT_VENV_OPENMPI": "/y", "HPCCKPT_KEEP": "3"}
    assert Config.load(environ=env).keep == 3


def test_stall_timeout_and_stall_action(tmp_path):
    cfg = Config.load(environ={})
    assert cfg.stall_timeout == 600.0 and cfg.stall_action == "warn"
    f = tmp_path / "run.toml"
    f.write_text('stall_timeout = "2min"\nstall_action = "abort"\n')
    cfg = Config.load(str(f), environ={})
    assert cfg.stall_timeout == 120.0 and cfg.stall_action == "abort"
    f.write_text('stall_timeout = "off"\n')
    assert Config.load(str(f), environ={}).stall_timeout == 0.0
    assert Config.load(environ={"HPCCKPT_STALL_TIMEOUT": "5min"}).stall_timeout == 300.0
    assert Config.load(environ={"HPCCKPT_STALL_TIMEOUT": "1.5"}).stall_timeout == 1.5
    assert Config.load(environ={}, stall_timeout=30).stall_timeout == 30.0
    for off in ("off", "None", "0", "false", 0, False, None):       # every way of saying "no watchdog"
        assert Config.load(environ={}, stall_timeout=off).stall_timeout == 0.0, off
    assert Config.load(environ={"HPCCKPT_STALL_TIMEOUT": "OFF"}).stall_timeout == 0.0
    assert Config.load(environ={"HPCCKPT_STALL_ACTION": "abort"}).stall_action == "abort"
    with pytest.raises(ConfigError, match="stall_timeout: must be a finite, non-negative duration"):
        Config.load(environ={}, stall_timeout=-1)
    with pytest.raises(ConfigError, match="stall_timeout: cannot read 'soon' as a duration"):
        Config.load(environ={"HPCCKPT_STALL_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="stall_action 'kill' is not one of warn, abort"):
        Config.load(environ={}, stall_action="kill")
    with pytest.raises(ConfigError, match="stall_action must be a string"):
        Config.load(environ={}, stall_action=1)


def test_the_watchdog_settings_may_differ_between_ranks():
    """They shape no message: like log_level they are left out of the cross-rank comparison."""
    from hpcckpt.process_hooks import settings_digest as _settings_digest
    base = Config.load(environ={})
    assert _settings_digest(base) == _settings_digest(base.replace(stall_timeout=5, stall_action="abort",
                                                                   log_level="DEBUG"))
    assert _settings_digest(base) != _settings_digest(base.replace(keep=3))


# ---------------------------------------------------------------------- a level's own settings
from hpcckpt.levels import registry                      # noqa: E402
from hpcckpt.levels.base import Level                    # noqa: E402
from hpcckpt.levels.options import Setting               # noqa: E402


@pytest.fixture
def plugin():
    """Register a level of a plug-in (as HPCCKPT_LEVEL_MODULES would); unregistered afterwards."""
    made = []

    def make(name, order, **settings):
        cls = type(f"Plugin_{name}", (Level,), {"name": name, "order": order, "settings": settings})
        registry.register(cls)
        made.append(name)
        return cls
    registry.classes()
    yield make
    for name in made:
        registry.unregister(name)


def test_level_tables_in_a_file_are_the_flat_keys(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[rs]\nparity = 3\n[xor]\ngroup_size = 6\n[pfs]\ndir = "/lustre/x"\ndirect_io = false\n'
                 'async_flush = true\n')
    cfg = Config.load(str(f), environ={})
    assert (cfg.rs_parity, cfg.group_size, cfg.pfs_dir, cfg.pfs_direct_io, cfg.async_flush) == \
        (3, 6, "/lustre/x", False, True)
    assert cfg.level_options("rs") == {"group_size": 6, "parity": 3}
    assert cfg.level_options("xor") == {"group_size": 6}
    assert cfg.level_options("pfs") == {"dir": "/lustre/x", "direct_io": False, "async_flush": True}
    assert cfg.level_options("local") == {} and cfg.level_options("partner") == {}


def test_level_settings_from_the_environment_and_keywords():
    env = {"HPCCKPT_RS_PARITY": "3", "HPCCKPT_XOR_GROUP_SIZE": "5", "HPCCKPT_PFS_ASYNC_FLUSH": "yes",
           "HPCCKPT_PFS_DIRECT_IO": "auto"}
    cfg = Config.load(environ=env)
    assert (cfg.rs_parity, cfg.group_size, cfg.async_flush, cfg.pfs_direct_io) == (3, 5, True, "auto")
    cfg = Config.load(environ={}, rs={"parity": 4}, pfs={"dir": "/p"})
    assert (cfg.rs_parity, cfg.pfs_dir) == (4, "/p")
    with pytest.raises(ConfigError, match="HPCCKPT_PFS_ASYNC_FLUSH: expected true or false"):
        Config.load(environ={"HPCCKPT_PFS_ASYNC_FLUSH": "maybe"})
    with pytest.raises(ConfigError, match="rs_parity must be an integer"):
        Config.load(environ={}, rs={"parity": "two"})


def test_a_flat_key_and_a_level_key_in_one_source_must_agree(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('rs_parity = 3\n[rs]\nparity = 3\n')
    assert Config.load(str(f), environ={}).rs_parity == 3                 # the same value twice: fine
    f.write_text('rs_parity = 2\n[rs]\nparity = 3\n')
    with pytest.raises(ConfigError, match=r"config file .*: rs_parity = 2 and rs.parity = 3 are the same setting "
                                          r"\(rs_parity\) with different values; give it once"):
        Config.load(str(f), environ={})
    f.write_text('[xor]\ngroup_size = 4\n[rs]\ngroup_size = 8\n')           # xor and rs share group_size
    with pytest.raises(ConfigError, match="xor.group_size = 4 and rs.group_size = 8"):
        Config.load(str(f), environ={})
    with pytest.raises(ConfigError, match="the environment: HPCCKPT_(XOR_)?GROUP_SIZE = .* and "
                                          "HPCCKPT_(XOR_)?GROUP_SIZE = "):
        Config.load(environ={"HPCCKPT_GROUP_SIZE": "4", "HPCCKPT_XOR_GROUP_SIZE": "6"})
    assert Config.load(environ={"HPCCKPT_GROUP_SIZE": "6", "HPCCKPT_XOR_GROUP_SIZE": "06"}).group_size == 6
    with pytest.raises(ConfigError, match="keyword arguments: pfs_dir = 'a' and pfs.dir = 'b'"):
        Config.load(environ={}, pfs_dir="a", pfs={"dir": "b"})


def test_across_sources_the_later_layer_wins(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('rs_parity = 5\n[pfs]\ndir = "/file"\n')
    assert Config.load(str(f), environ={}).rs_parity == 5
    assert Config.load(str(f), environ={"HPCCKPT_RS_PARITY": "4"}).rs_parity == 4              # environment > file
    assert Config.load(str(f), environ={"HPCCKPT_RS_PARITY": "4"}, rs={"parity": 3}).rs_parity == 3   # keywords
    assert Config.load(str(f), environ={"HPCCKPT_PFS_DIR": "/env"}).pfs_dir == "/env"
    assert Config.load(str(f), environ={}, pfs_dir="/kw").pfs_dir == "/kw"


def test_bad_level_tables(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[rs]\nparty = 3\n')
    with pytest.raises(ConfigError, match=r"config file .*: the rs level has no setting 'party'; "
                                          r"its settings are group_size, parity"):
        Config.load(str(f), environ={})
    f.write_text('[local]\ndir = "/x"\n')
    with pytest.raises(ConfigError, match="the local level has no setting 'dir'; it declares none"):
        Config.load(str(f), environ={})
    f.write_text('[mirror]\ndir = "/x"\n')
    with pytest.raises(ConfigError, match="a table 'mirror', but no level 'mirror' is registered; levels are "
                                          "local, partner, xor, rs, pfs"):
        Config.load(str(f), environ={})
    with pytest.raises(ConfigError, match="keyword arguments: rs must be a table of the rs level's settings"):
        Config.load(environ={}, rs=3)
    with pytest.raises(ConfigError, match="unknown config key in environment variable HPCCKPT_RS_PARTY"):
        Config.load(environ={"HPCCKPT_RS_PARTY": "3"})
    with pytest.raises(ConfigError, match="unknown config key in environment variable HPCCKPT_MIRROR_DIR"):
        Config.load(environ={"HPCCKPT_MIRROR_DIR": "/x"})


def test_a_plug_in_level_gets_its_own_settings_from_every_layer(tmp_path, plugin):
    plugin("mirror", 45, dir=Setting("mirror-dir", str, doc="where"), copies=Setting(1, int),
           verify=Setting(True, bool), ratio=Setting(0.5, float))
    defaults = {"dir": "mirror-dir", "copies": 1, "verify": True, "ratio": 0.5}
    assert Config.load(environ={}).level_options("mirror") == defaults
    assert Config().level_options("mirror") == defaults                   # a Config not built by load
    f = tmp_path / "run.toml"
    f.write_text('[mirror]\ndir = "/file"\ncopies = 2\nratio = 1\n')
    cfg = Config.load(str(f), environ={})
    assert cfg.level_options("mirror") == {"dir": "/file", "copies": 2, "verify": True, "ratio": 1.0}
    env = {"HPCCKPT_MIRROR_COPIES": "3", "HPCCKPT_MIRROR_VERIFY": "no", "HPCCKPT_MIRROR_RATIO": "0.25"}
    cfg = Config.load(str(f), environ=env, mirror={"dir": "/kw"})
    assert cfg.level_options("mirror") == {"dir": "/kw", "copies": 3, "verify": False, "ratio": 0.25}
    assert Config.load(cfg, environ={}).level_options("mirror") == cfg.level_options("mirror")
    assert cfg.replace(mirror={"copies": 4}).level_options("mirror") == {**cfg.level_options("mirror"), "copies": 4}
    assert cfg.replace(keep=3).level_options("mirror") == cfg.level_options("mirror")
    f.write_text('[mirror]\ncopies = "two"\n')
    with pytest.raises(ConfigError, match=r"config file .*: mirror.copies must be an integer, got 'two'"):
        Config.load(str(f), environ={})
    with pytest.raises(ConfigError, match="mirror.copies must be an integer, got True"):
        Config.load(environ={}, mirror={"copies": True})
    with pytest.raises(ConfigError, match="HPCCKPT_MIRROR_COPIES: expected an integer, got 'two'"):
        Config.load(environ={"HPCCKPT_MIRROR_COPIES": "two"})
    with pytest.raises(ConfigError, match="HPCCKPT_MIRROR_VERIFY: expected true or false"):
        Config.load(environ={"HPCCKPT_MIRROR_VERIFY": "perhaps"})


def test_level_settings_are_in_as_dict_so_the_ranks_compare_them(plugin):
    plugin("mirror", 45, dir=Setting("mirror-dir", str))
    a, b = Config.load(environ={}), Config.load(environ={}, mirror={"dir": "/elsewhere"})
    assert a.as_dict()["level_settings"] == {"mirror": {"dir": "mirror-dir"}}
    assert b.as_dict()["level_settings"] == {"mirror": {"dir": "/elsewhere"}}
    assert a.as_dict() != b.as_dict()
    assert Config.load(environ={}, mirror={"dir": "mirror-dir"}).as_dict() == a.as_dict()   # default given: same


def test_a_variable_that_names_two_settings_is_refused(plugin):
    plugin("io", 46, chunk=Setting(1, int))
    with pytest.raises(ConfigError, match="HPCCKPT_IO_CHUNK names io_chunk and io.chunk"):
        Config.load(environ={"HPCCKPT_IO_CHUNK": "4MiB"})
    assert Config.load(environ={}, io={"chunk": 3}).level_options("io") == {"chunk": 3}


def test_flat_settings_match_their_config_fields():
    import dataclasses
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    for name in registry.LEVELS:
        for key, s in registry.level_class(name).settings.items():
            if s.flat is not None:
                assert s.flat in fields and fields[s.flat] == s.default, (name, key)


def test_a_level_declares_settings_as_settings():
    for settings in ({"Dir": Setting("x", str)}, {"dir": "x"}, {"a-b": Setting(1, int)}):
        cls = type("Bad", (Level,), {"name": "bad", "order": 48, "settings": settings})
        with pytest.raises(ValueError, match="level 'bad': settings must map lower-case identifiers"):
            registry.register(cls)
    assert "bad" not in registry.LEVELS


def test_the_level_modules_variable_is_not_a_configuration_key():
    assert Config.load(environ={"HPCCKPT_LEVEL_MODULES": "", "HPCCKPT_KEEP": "3"}).keep == 3
