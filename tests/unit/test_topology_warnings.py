"""Level.placement_warnings: what each level cannot survive with a placement, asked of the level."""
import pytest

from hpcckpt import Config
from hpcckpt.levels.base import Level
from hpcckpt.levels.registry import LEVELS, level_class

ONE_NODE = (0, 0, 0, 0)
UNEVEN = (0, 0, 0, 1)          # groups: [0, 3] (2 ranks), rank 1 and rank 2 alone; rank 3 holds 3 partner copies
TWO_NODES = (0, 1)             # one group of 2 ranks: rs can use only 1 parity block


def warnings(node_of, *levels, **settings):
    """The warnings of ``levels``, in that order, as the start-up asks them (Context.warn_placement)."""
    cfg = Config.load(environ={}, **settings)
    return [w for lv in levels for w in level_class(lv).placement_warnings(node_of, cfg.level_options(lv), cfg)]


def one_node(name):
    return (f"all ranks are on one node: the {name} level cannot survive the loss of that node "
            "(set ranks_per_node, or run on several nodes)")


def loner(rank, name):
    return (f"rank {rank} has no rank on another node to share its {name} group: "
            f"the {name} level cannot protect it against losing its node")


def small_rs(group, parity=2):
    return (f"the group {group} has {len(group)} ranks: rs can use only {len(group) - 1} parity block(s) there "
            f"instead of {parity}")


UNEVEN_PARTNER = "uneven nodes: a rank holds up to 3 partner copies"


@pytest.mark.parametrize("level", ["partner", "xor", "rs"])
def test_one_node_each_redundant_level_names_itself_once(level):
    assert warnings(ONE_NODE, level) == [one_node(level)]


def test_one_node_names_only_the_levels_in_use():
    assert warnings(ONE_NODE, "local", "xor", "pfs") == [one_node("xor")]
    assert warnings(ONE_NODE, "partner", "rs") == [one_node("partner"), one_node("rs")]


def test_partner_only_hears_nothing_about_groups():
    assert warnings(UNEVEN, "local", "partner") == [UNEVEN_PARTNER]
    assert warnings(TWO_NODES, "partner") == []


def test_xor_only_hears_about_lonely_ranks_but_not_rs_parity_or_partner_copies():
    assert warnings(UNEVEN, "xor") == [loner(1, "xor"), loner(2, "xor")]
    assert warnings(TWO_NODES, "xor", "pfs") == []


def test_rs_only():
    assert warnings(UNEVEN, "rs") == [small_rs([0, 3]), loner(1, "rs"), loner(2, "rs")]
    assert warnings(TWO_NODES, "rs") == [small_rs([0, 1])]


def test_all_three_levels():
    assert warnings(UNEVEN, "partner", "xor", "rs") == [
        UNEVEN_PARTNER, loner(1, "xor"), loner(2, "xor"), small_rs([0, 3]), loner(1, "rs"), loner(2, "rs")]


def test_the_levels_own_settings_decide():
    assert warnings(TWO_NODES, "rs", rs_parity=1) == []
    assert warnings(TWO_NODES, "rs", rs={"parity": 3}) == [small_rs([0, 1], 3)]
    # four nodes, group_size 2: groups [0, 1] and [2, 3]; xor and rs share the setting (xor.group_size)
    assert warnings((0, 1, 2, 3), "xor", group_size=2) == []
    assert warnings((0, 1, 2, 3), "rs", xor={"group_size": 2}) == [small_rs([0, 1]), small_rs([2, 3])]


def test_no_redundant_level_means_no_warning():
    assert warnings(ONE_NODE, "local", "pfs") == []
    assert warnings(UNEVEN) == []


def test_every_registered_level_answers_without_raising():
    """No list of names: whatever is registered is asked, and says what it says."""
    cfg = Config.load(environ={})
    for name in LEVELS:
        assert isinstance(level_class(name).placement_warnings(UNEVEN, cfg.level_options(name), cfg), list)


def test_a_level_the_library_does_not_know_answers_for_itself():
    class Mirror(Level):            # not registered: the other tests' registry stays as it is
        name, order = "mirror", 99

    class Copier(Mirror):
        name, redundant = "copier", True

    cfg = Config.load(environ={})
    assert Mirror.placement_warnings(ONE_NODE, {}, cfg) == []
    assert Copier.placement_warnings(ONE_NODE, {}, cfg) == [one_node("copier")]
    assert Copier.placement_warnings(UNEVEN, {}, cfg) == []
