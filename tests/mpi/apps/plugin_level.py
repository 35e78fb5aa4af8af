"""A plug-in level for the tests (``HPCCKPT_LEVEL_MODULES=plugin_level``, importable from the
apps' directory): a setting of its own without a flat key, and nothing more to do than the node
cache does (a step at this level is a local one)."""
from hpcckpt.levels.base import Level
from hpcckpt.levels.options import Setting
from hpcckpt.levels.registry import register


@register
class PluginLevel(Level):
    """Declares ``[plugin]`` ``dir``; protects nothing beyond the node cache (the full example of
    a level of one's own is tests/mpi/test_mirror_level.py)."""
    name, order = "plugin", 46
    settings = {"dir": Setting("mirror", str, doc="a directory of its own (unused)")}
