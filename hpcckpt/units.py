"""Parsing of human-friendly durations and sizes (local, pure)."""
import math
import re

from .errors import ConfigError

_DURATION_UNITS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}
_NUMBER_UNIT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_duration(value, what="duration"):
    """Return seconds (float) from a number of seconds or a string like '24h', '30min', '1h30m'.

    Also accepts SLURM's '[D-]HH:MM:SS' / 'MM:SS'. Raises ConfigError on anything else.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a number of seconds or a string like '30min', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_duration_text(value.strip(), what)
    else:
        raise ConfigError(f"{what}: expected a number of seconds or a string like '30min', got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{what}: must be a finite, non-negative duration, got {value!r}")
    return seconds


def _parse_duration_text(text, what):
    if ":" in text:
        days = 0
        if "-" in text:
            day_text, text = text.split("-", 1)
            if not day_text.isdigit():
                raise ConfigError(f"{what}: cannot read {text!r} as [D-]HH:MM:SS")
            days = int(day_text)
        parts = text.split(":")
        if len(parts) > 3 or not all(p.isdigit() for p in parts):
            raise ConfigError(f"{what}: cannot read {text!r} as [D-]HH:MM:SS")
        seconds = 0
        for p in parts:
            seconds = seconds * 60 + int(p)
        return days * 86400.0 + seconds
    total, pos = 0.0, 0
    if not text:
        raise ConfigError(f"{what}: empty duration")
    while pos < len(text):
        m = _NUMBER_UNIT.match(text, pos)
        if not m or m.end() == pos:
            raise ConfigError(f"{what}: cannot read {text!r} as a duration (examples: 90, '30min', '1h30m', '2d')")
        unit = m.group(2).lower()
        if unit not in _DURATION_UNITS:
            raise ConfigError(f"{what}: unknown unit {m.group(2)!r} in {text!r}; use s, min, h, d or w")
        total += float(m.group(1)) * _DURATION_UNITS[unit]
        pos = m.end()
    return total


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value, what="size"):
    """Return bytes (int) from an int or a string like '64MiB', '1.5GB'. Raises ConfigError."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size, got {value!r}")
    if isinstance(value, int):
        nbytes = value
    elif isinstance(value, str):
        m = _NUMBER_UNIT.fullmatch(value)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"{what}: cannot read {value!r} as a size (examples: 4096, '64MiB', '2GB')")
        nbytes = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    else:
        raise ConfigError(f"{what}: expected a size, got {value!r}")
    if nbytes < 0:
        raise ConfigError(f"{what}: must not be negative, got {value!r}")
    return nbytes


def format_size(n):
    """A short human form of a byte count: '100 B', '256.0 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def format_duration(seconds):
    """A short human form of a duration in seconds: '2.5 s', '12.0 min', '3.20 h'."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.4g} min"
    if seconds < 172800:
        return f"{seconds / 3600:.4g} h"
    return f"{seconds / 86400:.4g} d"
