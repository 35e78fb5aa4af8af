"""survivability_warnings: what the redundancy levels in use cannot survive with a placement."""
import pytest

from hpcckpt.topology import survivability_warnings

ONE_NODE = (0, 0, 0, 0)
UNEVEN = (0, 0, 0, 1)          # groups: [0, 3] (2 ranks), rank 1 and rank 2 alone; rank 3 holds 3 partner copies
TWO_NODES = (0, 1)             # one group of 2 ranks: rs can use only 1 parity block


def one_node(names):
    return (f"all ranks are on one node: the {names} cannot survive the loss of that node "
            "(set ranks_per_node, or run on several nodes)")


def loner(rank, names, those):
    return (f"rank {rank} has no rank on another node to share an {names} group with: "
            f"{those} cannot protect it against losing its node")


SMALL_RS = "the group [0, 3] has 2 ranks: rs can use only 1 parity block(s) there instead of rs_parity=2"
UNEVEN_PARTNER = "uneven nodes: a rank holds up to 3 partner copies"


def test_default_is_all_three_levels_as_before():
    assert survivability_warnings(ONE_NODE, 4, 2) == [one_node("partner, xor and rs levels")]
    assert survivability_warnings(UNEVEN, 4, 2) == [
        SMALL_RS, loner(1, "xor/rs", "those levels"), loner(2, "xor/rs", "those levels"), UNEVEN_PARTNER]
    assert survivability_warnings(TWO_NODES, 4, 2) == [
        "the group [0, 1] has 2 ranks: rs can use only 1 parity block(s) there instead of rs_parity=2"]


@pytest.mark.parametrize("levels,names", [
    (("partner",), "partner level"),
    (("local", "xor", "pfs"), "xor level"),
    (("rs", "partner"), "partner and rs levels"),
    (("partner", "xor", "rs"), "partner, xor and rs levels"),
])
def test_one_node_names_only_the_levels_in_use(levels, names):
    assert survivability_warnings(ONE_NODE, 4, 2, levels=levels) == [one_node(names)]


def test_partner_only_hears_nothing_about_groups():
    assert survivability_warnings(UNEVEN, 4, 2, levels=("local", "partner")) == [UNEVEN_PARTNER]
    assert survivability_warnings(TWO_NODES, 4, 2, levels=("partner",)) == []


def test_xor_only_hears_about_lonely_ranks_but_not_rs_parity_or_partner_copies():
    assert survivability_warnings(UNEVEN, 4, 2, levels=("xor",)) == [
        loner(1, "xor", "that level"), loner(2, "xor", "that level")]
    assert survivability_warnings(TWO_NODES, 4, 2, levels=("xor", "pfs")) == []


def test_rs_only():
    assert survivability_warnings(UNEVEN, 4, 2, levels=("rs",)) == [
        SMALL_RS, loner(1, "rs", "that level"), loner(2, "rs", "that level")]


def test_no_redundant_level_means_no_warning():
    assert survivability_warnings(ONE_NODE, 4, 2, levels=("local", "pfs")) == []
    assert survivability_warnings(UNEVEN, 4, 2, levels=()) == []


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="'parity'"):
        survivability_warnings(UNEVEN, 4, 2, levels=("partner", "parity"))
    with pytest.raises(ValueError):
        survivability_warnings(UNEVEN, 4, 2, levels="partner")   # a string, not a tuple of names
