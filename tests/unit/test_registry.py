"""The level registry (hpcckpt/levels/registry.py): registration, its checks, the live LEVELS."""
import pytest

from hpcckpt.errors import ConfigError
from hpcckpt.levels import registry
from hpcckpt.levels.base import Level


def level(name, order, **attrs):
    return type(f"Test_{name}", (Level,), {"name": name, "order": order, **attrs})


def test_builtin_levels_cheapest_first():
    assert tuple(registry.LEVELS) == ("local", "partner", "xor", "rs", "pfs")
    assert registry.redundant() == ("partner", "xor", "rs") and registry.restoring() == ("pfs",)
    assert registry.LEVELS.index("xor") == 2 and "pfs" in registry.LEVELS and "tape" not in registry.LEVELS


def test_a_registered_level_joins_levels_in_its_order_and_leaves_again():
    cls = registry.register(level("tape", 45, restores=True))
    try:
        assert tuple(registry.LEVELS) == ("local", "partner", "xor", "rs", "tape", "pfs")
        assert registry.level_class("tape") is cls and registry.restoring() == ("tape", "pfs")
        assert registry.register(cls) is cls                   # the same class again: harmless
    finally:
        registry.unregister("tape")
    assert "tape" not in registry.LEVELS
    with pytest.raises(ConfigError, match="unknown level 'tape'; levels are local, partner"):
        registry.level_class("tape")


@pytest.mark.parametrize("cls, message", [
    (level("Tape", 45), "lower-case identifier"),
    (level("tape", None), "numeric order"),
    (level("tape", 30), "the order 30 of level 'xor'"),
    (level("partner", 46), "registered already"),
    (level("tape", 46, redundant=True, restores=True), "both redundant and restoring"),
])
def test_a_bad_level_is_refused_by_name(cls, message):
    registry.classes()
    with pytest.raises(ValueError, match=message):
        registry.register(cls)
    assert tuple(registry.LEVELS) == ("local", "partner", "xor", "rs", "pfs")


def test_only_levels_register_and_builtins_stay():
    with pytest.raises(TypeError, match="not a subclass"):
        registry.register(object)
    with pytest.raises(ValueError, match="built-in level"):
        registry.unregister("pfs")
    with pytest.raises(KeyError):
        registry.unregister("never-registered")
