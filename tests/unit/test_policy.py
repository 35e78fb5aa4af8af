"""The online Policy, driven with a fake clock."""
import json
import math

import pytest

from hpcckpt.errors import ConfigError
from hpcckpt.interval import daly, multilevel_periods, young
from hpcckpt.policy import DEFAULT_FIXED, LEVELS, UNMEASURED_COST_GUESS, Policy


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def make(**kw):
    clock = Clock()
    p = Policy(clock=clock, **kw)
    p.start()
    return p, clock


def run_steps(policy, clock, steps, step_seconds, costs, first_step=0):
    """Drive the policy like the Checkpointer: compute, decide, checkpoint; returns [(step, level)]."""
    taken = []
    for step in range(first_step, first_step + steps):
        clock.t += step_seconds
        level = policy.decide(step)
        if level:
            clock.t += costs[level]
            policy.record_checkpoint(level, costs[level])
            taken.append((step, level))
        if policy.should_exit():
            break
    return taken


def test_levels_constant():
    assert LEVELS == ("local", "partner", "xor", "rs", "pfs")


def test_auto_kind():
    assert Policy().kind == "fixed"
    assert Policy(mtbf="24h").kind == "daly"
    assert Policy(level_mtbf={"local": "1h"}).kind == "daly"


def test_default_fixed_schedule_is_hourly_on_the_most_resilient_level():
    p, clock = make(levels=("pfs", "local"))
    assert p.levels == ("local", "pfs")
    assert p.schedule == {"pfs": DEFAULT_FIXED}
    clock.t += 3599
    assert p.decide(0) is None
    clock.t += 1
    assert p.decide(1) == "pfs"


def test_fixed_steps_rule_and_most_resilient_wins():
    p, clock = make(kind="fixed", levels=("local", "pfs"), schedule={"local": 5, "pfs": ("steps", 10)})
    taken = run_steps(p, clock, 30, 1.0, {"local": 0.1, "pfs": 1.0})
    assert taken == [(4, "local"), (9, "pfs"), (14, "local"), (19, "pfs"), (24, "local"), (29, "pfs")]


def test_fixed_steps_with_a_one_based_step_counter_fire_one_step_early():
    """The rule is (step + 1) % n == 0 (0-based steps): a loop counting from 1 that asks for
    "every 250" gets steps 249, 499, ... (docs/CONFIG.md, docs/PORTING.md)."""
    p, clock = make(kind="fixed", levels=("local",), schedule={"local": 250})
    taken = run_steps(p, clock, 1000, 1.0, {"local": 0.1}, first_step=1)
    assert [s for s, _ in taken] == [249, 499, 749, 999]


def test_fixed_seconds_counts_compute_time_only():
    p, clock = make(kind="fixed", levels=("local", "pfs"), schedule={"local": "60s", "pfs": ("seconds", 150)})
    taken = run_steps(p, clock, 40, 10.0, {"local": 5.0, "pfs": 20.0})
    # step s ends at 10 (s + 1) s of compute; checkpoint time does not count; a pfs checkpoint
    # also restarts the local timer (it covers local)
    assert taken == [(5, "local"), (11, "local"), (14, "pfs"), (20, "local"), (26, "local"), (29, "pfs"),
                     (35, "local")]
    assert p.compute_since("local") == pytest.approx(40.0)
    assert p.compute_since("pfs") == pytest.approx(100.0)


def test_formula_policy_probes_the_cheapest_level_first_then_uses_daly():
    p, clock = make(kind="daly", mtbf="6h", levels=("local",))
    clock.t += 1
    assert p.decide(0) == "local"                # nothing measured yet: measure the cheapest level
    clock.t += 30
    p.record_checkpoint("local", 30.0)
    period = daly(30.0, 6 * 3600)
    assert p.periods() == {"local": pytest.approx(period)}
    clock.t += period - 1
    assert p.decide(1) is None
    clock.t += 1
    assert p.decide(2) == "local"


def test_young_policy_and_moving_average_of_costs():
    p, clock = make(kind="young", mtbf=86400.0, levels=("local",))
    for c in (1, 2, 3, 4, 5, 10, 10, 10, 10, 10):
        clock.t += c
        p.record_checkpoint("local", c)
    assert p.cost("local") == 10.0               # last 5 measurements
    assert p.periods()["local"] == pytest.approx(young(10.0, 86400.0))


def test_unmeasured_higher_level_uses_the_largest_measured_cost_then_its_own():
    p, clock = make(level_mtbf={"local": "1h", "partner": "24h"},
                    levels=("local", "pfs"))
    # partner is not enabled: node losses are sized on pfs, the cheapest enabled level surviving them
    assert p.rates == pytest.approx({"local": 1 / 3600, "pfs": 1 / 86400})
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    assert p.periods()["pfs"] == pytest.approx(daly(2.0, 86400))
    p.record_checkpoint("pfs", 60.0, now=clock.t + 100)
    assert p.periods() == {"local": pytest.approx(daly(2.0, 3600)), "pfs": pytest.approx(daly(60.0, 86400))}


def test_nothing_measured_uses_the_guess():
    p, _ = make(kind="young", mtbf=3600.0, levels=("local",))
    assert p.periods()["local"] == pytest.approx(young(UNMEASURED_COST_GUESS, 3600.0))


def test_multilevel_policy_nests_the_periods_and_the_pfs_covers_local():
    p, clock = make(kind="multilevel", level_mtbf={"local": "1h", "pfs": "1d"}, levels=("local", "pfs"))
    costs = {"local": 2.0, "pfs": 60.0}
    taken = run_steps(p, clock, 2000, 10.0, costs)
    periods = multilevel_periods(costs, {"local": 1 / 3600, "pfs": 1 / 86400})
    assert p.periods() == pytest.approx(periods)
    ratio = round(periods["pfs"] / periods["local"])
    assert ratio > 5
    assert taken[0] == (0, "local")              # the probe
    steps = [s for s, _ in taken]
    levels = [lv for _, lv in taken]
    pfs_at = [i for i, lv in enumerate(levels) if lv == "pfs"]
    assert len(pfs_at) >= 3
    # the unmeasured pfs is guessed as costly as local, so the 2nd checkpoint is a pfs one (measuring
    # it); then exact nesting: every ratio-th checkpoint is a pfs one
    assert pfs_at[0] == 1
    assert {b - a for a, b in zip(pfs_at, pfs_at[1:])} == {ratio}
    # local period honoured to within one 10 s step
    for a, b in zip(steps[1:], steps[2:]):
        assert periods["local"] <= 10 * (b - a) < periods["local"] + 10


def test_final_checkpoint_requested_once_with_step_estimate():
    clock = Clock(0.0)
    p = Policy(kind="fixed", schedule={"local": 1000}, levels=("local", "pfs"), end_time=1000.0,
               exit_safety=2.0, clock=clock)
    p.start()
    p.record_checkpoint("pfs", 10.0, now=10.0)   # pfs cost known: 10 s
    decisions = []
    for step in range(100):
        clock.t += 50.0
        level = p.decide(step)
        decisions.append((clock.t, level))
        if level:
            clock.t += 10.0
            p.record_checkpoint(level, 10.0)
        if p.should_exit():
            break
    # steps of 50 s: final when now + 50 + 2 * 10 >= 1000 -> first decide at t >= 930: t = 950
    assert [d for d in decisions if d[1]] == [(950.0, "pfs")]
    assert p.final_taken and p.should_exit()
    assert decisions[-1][0] == 950.0
    assert p.decide(100) is None                 # never again


def test_a_final_checkpoint_asked_for_on_the_guessed_cost_does_not_end_a_short_job():
    """100 s left and no cost measured: the guess (60 s, twice) asks for the final checkpoint at
    once; measured at 0.5 s it leaves time, so the job goes on to its real final checkpoint."""
    clock = Clock(0.0)
    p = Policy(kind="fixed", schedule={"local": 1000}, levels=("local",), end_time=100.0, exit_safety=2.0,
               clock=clock)
    p.start()
    taken = []
    for step in range(200):
        clock.t += 1.0
        level = p.decide(step)
        if level:
            taken.append((clock.t, level))
            clock.t += 0.5
            p.record_checkpoint(level, 0.5)
        if p.should_exit():
            break
    assert UNMEASURED_COST_GUESS * 2 > 100
    assert taken[0] == (1.0, "local") and len(taken) == 2 and taken[1][0] >= 95.0, taken
    assert p.final_taken and p.should_exit() and clock.t < 100.0


def test_a_final_pfs_checkpoint_never_measured_is_assumed_to_cost_at_least_the_guess():
    """The application checkpoints only locally (0.01 s); the final checkpoint is pfs (it must
    outlive the job), never measured: assumed UNMEASURED_COST_GUESS, not the cheap local cost."""
    clock = Clock(0.0)
    p = Policy(kind="fixed", schedule={"local": 1}, levels=("local",), final_level="pfs", end_time=1000.0,
               exit_safety=2.0, clock=clock)
    p.start()
    finals = []
    for step in range(1000):
        clock.t += 1.0
        level = p.decide(step)
        if level == "pfs":
            finals.append(clock.t)
            break
        p.record_checkpoint(level, 0.01)
    # now + step (0.99 s: 1 s less the 0.01 s recorded) + 2 * 60 >= 1000 first at t = 880
    assert finals == [880.0]
    assert p.final_requested and not p.final_taken


def test_a_final_checkpoint_allows_for_its_background_time_and_a_level_outside_the_schedule_is_recorded():
    """pfs measured (1 s blocking + 10 s flushed in the background): the final checkpoint is due
    once now + step + 2 * 11 s reaches the end; its checkpoints also reset the local period."""
    clock = Clock(0.0)
    p = Policy(kind="fixed", schedule={"local": "100s"}, levels=("local",), final_level="pfs", end_time=1000.0,
               exit_safety=2.0, clock=clock)
    p.start()
    for seconds in (30.0, 1.0):                  # the first (one-time costs) is dropped at the second
        p.record_checkpoint("pfs", seconds)
        p.record_background("pfs", 10.0 * seconds)
    assert p.cost("pfs") == 1.0 and p.background_cost("pfs") == 10.0
    assert p.compute_since("local") == 0.0       # pfs covers local
    decisions = []
    while not decisions or decisions[-1][1] != "pfs":
        clock.t += 5.0
        decisions.append((clock.t, p.decide(len(decisions))))
        if decisions[-1][1] == "local":
            p.record_checkpoint("local", 0.0)
    # now + 5 + 2 * (1 + 10) >= 1000 -> t = 975; local every 100 s of compute before that
    assert decisions[-1] == (975.0, "pfs")
    assert [t for t, lv in decisions if lv == "local"][:2] == [100.0, 200.0]


def test_the_first_checkpoint_of_a_level_counts_only_until_a_second_is_measured():
    p, _ = make(kind="daly", mtbf="1h", levels=("local", "partner"))
    p.record_checkpoint("local", 2.0, now=1.0)           # the first: kernels loaded, files created
    assert p.cost("local") == 2.0
    p.record_checkpoint("local", 0.05, now=2.0)
    assert p.cost("local") == 0.05
    p.record_checkpoint("local", 0.07, now=3.0)
    assert p.cost("local") == pytest.approx(0.06)
    assert p.periods()["local"] == pytest.approx(daly(0.06, 3600.0))
    with pytest.raises(ConfigError, match="not enabled"):
        p.record_checkpoint("xor", 1.0, now=4.0)


def test_final_checkpoint_without_pfs_is_the_most_resilient_and_exit_without_it():
    clock = Clock(0.0)
    p = Policy(kind="fixed", schedule={"local": 1000}, levels=("local", "partner"), end_time=100.0, clock=clock)
    p.start()
    p.record_checkpoint("partner", 5.0, now=0.0)
    seen = []
    for step in range(20):
        clock.t += 10.0                          # 10 s steps, never recording the final checkpoint
        seen.append((clock.t, p.decide(step), p.should_exit()))
        if seen[-1][2]:
            break
    # final when now + 10 + 2 * 5 >= 100 (t = 80); exit when now + 10 + 5 >= 100 (t = 90)
    assert [(t, lv) for t, lv, _ in seen if lv] == [(80.0, "partner")]
    assert seen[-1] == (90.0, None, True)
    assert [t for t, _, ex in seen if ex] == [90.0]
    assert not p.final_taken


def test_no_end_time_never_exits():
    p, clock = make(mtbf="1h")
    clock.t += 1e7
    assert p.should_exit() is False


def test_describe_is_json_and_reports_state():
    p, clock = make(kind="daly", level_mtbf={"local": "1h", "pfs": "1d"}, levels=("local", "pfs"),
                    end_time=1e9)
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    d = p.describe()
    json.dumps(d)
    assert d["kind"] == "daly" and d["levels"] == ["local", "pfs"]
    assert d["costs"] == {"local": 2.0, "pfs": None}
    assert d["mtbf"] == {"local": 3600.0, "pfs": 86400.0}
    assert d["periods"]["local"] == pytest.approx(daly(2.0, 3600))
    assert d["final_level"] == "pfs" and d["final_requested"] is False


@pytest.mark.parametrize("kw", [
    dict(kind="magic"),
    dict(kind="young"),
    dict(kind="daly"),
    dict(kind="multilevel", mtbf="1h"),
    dict(levels=()),
    dict(levels=("local", "disk")),
    dict(mtbf="soon"),
    dict(mtbf=0),
    dict(level_mtbf={"disk": "1h"}),
    dict(level_mtbf={"pfs": "1h"}, levels=("local",)),       # nothing enabled survives those
    dict(kind="fixed", schedule={"pfs": 10}),                 # pfs not enabled
    dict(kind="fixed", schedule={"local": 0}),
    dict(kind="fixed", schedule={"local": 2.5}),
    dict(kind="fixed", schedule={"local": ("hours", 2)}),
    dict(exit_safety=0.5),
    dict(end_time=float("nan")),
])
def test_bad_configuration(kw):
    with pytest.raises(ConfigError):
        Policy(**kw)


def test_record_checkpoint_validation():
    p, _ = make()
    with pytest.raises(ConfigError):
        p.record_checkpoint("pfs", 1.0)
    with pytest.raises(ConfigError):
        p.record_checkpoint("local", -1.0)
    assert math.isfinite(p.compute_since("local"))


# -- monotonic clock for periods, wall clock for end_time --------------------------------------

def two_clocks(**kw):
    mono, wall = Clock(500.0), Clock(1.7e9)
    p = Policy(clock=mono, wall_clock=wall, **kw)
    p.start()
    return p, mono, wall


def test_default_clocks_are_monotonic_and_wall():
    import time
    p = Policy()
    assert p.clock is time.monotonic and p.wall_clock is time.time
    one = Clock()
    p = Policy(clock=one)                        # one injected clock drives both
    assert p.clock is one and p.wall_clock is one


def test_wall_clock_step_back_does_not_delay_a_30min_schedule():
    p, mono, wall = two_clocks(kind="fixed", levels=("local",), schedule={"local": "30min"})
    mono.t += 60.0
    wall.t += 60.0
    assert p.decide(0) is None
    wall.t -= 3600.0                             # the system clock is stepped back an hour
    mono.t += 1740.0 - 1.0
    wall.t += 1740.0 - 1.0
    assert p.decide(1) is None                   # 29 min 59 s of compute
    mono.t += 1.0
    wall.t += 1.0
    assert p.decide(2) == "local"                # 30 min of compute, as measured on the monotonic clock
    assert p.compute_since("local") == pytest.approx(1800.0)


def test_wall_clock_step_forward_neither_fires_the_schedule_nor_inflates_the_step_estimate():
    p, mono, wall = two_clocks(kind="fixed", levels=("local", "pfs"), schedule={"local": "30min"})
    p.set_end_time(wall.t + 3600.0)
    p.record_checkpoint("pfs", 60.0, now=mono.t)  # pfs cost known: 60 s
    for step in range(3):
        mono.t += 10.0
        wall.t += 10.0 + (2400.0 if step == 1 else 0.0)   # a 40 min step of the wall clock at step 1
        assert p.decide(step) is None
    assert p.describe()["step_estimate"] == pytest.approx(10.0)
    assert p.should_exit() is False
    # the job's end is wall time: 40 min 30 s + 10 s step + 2 x 60 s < 60 min, not due yet
    wall.t = p.end_time - 10.0 - 2 * 60.0 - 1.0
    mono.t += 10.0
    assert p.decide(3) is None
    wall.t += 1.0
    mono.t += 10.0
    assert p.decide(4) == "pfs"                  # final checkpoint, decided on the wall clock


def test_explicit_wall_reading_is_compared_with_end_time():
    p, mono, wall = two_clocks(kind="fixed", levels=("local",), schedule={"local": 1000}, end_time=2000.0)
    assert p.should_exit(wall=1000.0) is False
    assert p.should_exit(wall=1999.0) is True    # 60 s guessed cost: no time for another step + checkpoint
    assert p.decide(0, now=mono.t + 1, wall=1000.0) is None
    assert p.decide(1, now=mono.t + 2, wall=1900.0) == "local"


# -- summary(): the schedule in force, one line -------------------------------------------------

def test_summary_fixed_default():
    assert Policy(levels=("local",)).summary() == \
        "fixed schedule (default: no schedule or mtbf given): local every 60 min of compute"
    assert Policy(kind="fixed", levels=("local", "pfs")).summary() == \
        "fixed schedule (default: no schedule given): pfs every 60 min of compute"


def test_summary_fixed_explicit_steps_and_seconds():
    p = Policy(kind="fixed", levels=("pfs", "local", "partner"),
               schedule={"pfs": "2h", "local": 10, "partner": ("steps", 1)})
    assert p.summary() == "fixed schedule: local every 10 steps, partner every step, pfs every 2 h of compute"
    p = Policy(levels=("local",), schedule={"local": ("seconds", 90)})
    assert p.summary() == "fixed schedule: local every 90 s of compute"


def test_summary_daly_before_and_after_measuring():
    p, clock = make(kind="daly", mtbf="24h", levels=("local", "pfs"))
    guess = daly(UNMEASURED_COST_GUESS, 86400) / 60
    assert p.summary() == (f"daly, in compute time: local every {guess:.4g} min, pfs every {guess:.4g} min "
                           "(MTBF 24 h for every level; no cost measured yet: 60 s assumed until a first local "
                           "checkpoint measures it)")
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    t = daly(2.0, 86400) / 60
    assert p.summary() == (f"daly, in compute time: local every {t:.4g} min, pfs every {t:.4g} min "
                           "(MTBF 24 h for every level; costs measured so far: local 2 s, pfs not yet (assumed 2 s))")


def test_summary_young_with_level_mtbf_and_a_level_without_failures():
    p, clock = make(kind="young", level_mtbf={"local": "1h", "partner": "1d"}, levels=("local", "partner", "pfs"))
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    p.record_checkpoint("partner", 8.0, now=clock.t + 20)
    assert p.summary() == (
        f"young, in compute time: local every {young(2.0, 3600) / 60:.4g} min, "
        f"partner every {young(8.0, 86400) / 60:.4g} min, pfs never on its own "
        "(MTBF of the failures each level is the cheapest to survive: local 60 min, partner 24 h, pfs none; "
        "costs measured so far: local 2 s, partner 8 s, pfs not yet (assumed 8 s))")


def test_background_time_is_reported_but_the_interval_uses_the_blocking_time():
    p, clock = make(kind="young", mtbf="24h", levels=("local", "partner"))
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    p.record_checkpoint("partner", 3.0, now=clock.t + 20)
    before = p.periods()
    p.record_background("partner", 9.0)
    assert p.background_cost("partner") == 9.0 and p.background_cost("local") is None
    assert p.cost("partner") == 3.0 and p.periods() == before
    assert p.summary().endswith("costs measured so far: local 2 s, partner 3 s, partner 9 s more in the background)")


def test_summary_multilevel_names_the_nesting():
    p, clock = make(kind="multilevel", level_mtbf={"local": "1h", "pfs": "1d"}, levels=("local", "pfs"),
                    end_time=None)
    p.record_checkpoint("local", 2.0, now=clock.t + 2)
    p.record_checkpoint("pfs", 60.0, now=clock.t + 100)
    assert p.summary() == (
        "multilevel, in compute time: local every 2.015 min, pfs every 26th local checkpoint (52.4 min) "
        "(MTBF of the failures each level is the cheapest to survive: local 60 min, pfs 24 h; "
        "costs measured so far: local 2 s, pfs 60 s)")


def test_summary_names_the_final_checkpoint_when_the_end_is_known():
    import time
    end = 2e9
    p = Policy(levels=("local", "pfs"), schedule={"local": 5}, end_time=end)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end))
    assert p.summary() == f"fixed schedule: local every 5 steps; final pfs checkpoint before the job's end at {stamp}"
