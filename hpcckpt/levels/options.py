"""A level's own settings (local, pure): ``Setting``, declared in ``Level.settings``.

In the TOML file a level's settings are a table named after the level (``[rs]`` ``parity = 2``);
the environment has ``HPCCKPT_<LEVEL>_<KEY>`` (``HPCCKPT_RS_PARITY``); a setting that was a flat
key before levels declared their own (``rs_parity``) keeps that key too (``flat``), file and
environment. docs/CONFIG.md says which wins when both are given.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a level: its default, its type (bool, int, float, str), the flat config key
    it is also known by (or None), and one line of documentation."""
    default: object
    type: type
    flat: str = None
    doc: str = ""
