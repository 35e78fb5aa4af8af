"""Checkpoint intervals from the failure rate (local, pure functions; no MPI, no I/O).

All durations are in one unit of your choice (seconds everywhere else in hpcckpt); what comes out
is in the same unit. "Period" and "interval" mean *compute* time between two checkpoints (the
time spent writing the checkpoint is not part of it), as in Young (1974) and Daly (2006).

Sources
-------
- J. W. Young, "A first order approximation to the optimum checkpoint interval",
  Communications of the ACM 17(9), 1974: T = sqrt(2 C M).
- J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006, eq. (37).
- A. Benoit, A. Cavelan, V. Le Fevre, Y. Robert, H. Sun, "Towards optimal multi-level
  checkpointing", IEEE Transactions on Computers 66(7), 2017 (first-order model of nested
  multi-level patterns; see multilevel_plan()).
"""
import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

from .levels.registry import LEVELS  # noqa: E402 - one definition of the level names
"""Checkpoint levels, cheapest -> most resilient. A checkpoint of a level also protects against
every failure that a lower level protects against."""


def _positive(value, what):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a positive number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{what}: must be a positive finite number, got {value!r}")
    return x


def _non_negative(value, what):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x) or x < 0:
        raise ConfigError(f"{what}: must be a finite number >= 0, got {value!r}")
    return x


def young(cost, mtbf):
    """Young's first-order optimum interval sqrt(2 C M) (pure). Raises ConfigError on bad input.

    Young 1974, CACM 17(9). ``cost`` C: time to write one checkpoint; ``mtbf`` M: mean time
    between failures. Same unit in and out.
    """
    c = _positive(cost, "checkpoint cost")
    m = _positive(mtbf, "MTBF")
    return math.sqrt(2.0 * c * m)


def daly(cost, mtbf):
    """Daly's higher-order optimum interval (pure). Raises ConfigError on bad input.

    Daly 2006, FGCS 22(3), eq. (37), exponential failures with mean M, checkpoint cost C:
    tau = sqrt(2CM) * [1 + (1/3) sqrt(C/(2M)) + (1/9) (C/(2M))] - C   when C < 2M, else tau = M.
    Examples from the paper (M = 24 h, C = 5 min) -> 116.7 min; (6 h, 5 min) -> 56.7 min;
    (15 min, 5 min) -> 9.14 min.
    """
    c = _positive(cost, "checkpoint cost")
    m = _positive(mtbf, "MTBF")
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def waste(period, cost, mtbf, restart=0.0):
    """First-order expected waste fraction of one periodic level (pure).

    W = C/T + (T/2 + R)/M: checkpoint overhead per unit of compute, plus for each failure
    (rate 1/M) on average half a period of lost work and one restart R. Valid when T, C, R << M;
    its minimum over T is at young(C, M).
    """
    t = _positive(period, "period")
    c = _non_negative(cost, "checkpoint cost")
    m = _positive(mtbf, "MTBF")
    r = _non_negative(restart, "restart cost")
    return c / t + (t / 2.0 + r) / m


def expected_efficiency_exponential(period, cost, mtbf, restart=0.0):
    """Exact expected efficiency (work / wall time) of one periodic level under exponential
    failures, in the limit of long runs (pure).

    Each segment needs T + C seconds without a failure; a failure loses the segment and costs a
    restart R that itself must run R seconds without a failure. The expected wall time of one
    segment is then M e^(R/M) (e^((T+C)/M) - 1) (Daly 2006, the exact model behind eq. 37),
    so the efficiency is T / [M e^(R/M) (e^((T+C)/M) - 1)].
    """
    t = _positive(period, "period")
    c = _non_negative(cost, "checkpoint cost")
    m = _positive(mtbf, "MTBF")
    r = _non_negative(restart, "restart cost")
    return t / (m * math.exp(r / m) * math.expm1((t + c) / m))


def _level_index(level):
    if level not in LEVELS:
        raise ConfigError(f"unknown checkpoint level {level!r}; expected one of {', '.join(LEVELS)}")
    return LEVELS.index(level)


def ordered_levels(levels):
    """The given level names sorted cheapest -> most resilient (pure). ConfigError on unknown."""
    levels = list(levels)
    for lv in levels:
        _level_index(lv)
    if len(set(levels)) != len(levels):
        raise ConfigError(f"levels repeated in {levels!r}")
    return sorted(levels, key=LEVELS.index)


def multilevel_waste(periods, costs, rates, restarts=None, inclusive=False):
    """First-order expected waste fraction of a nested multi-level schedule (pure).

    ``periods``, ``costs``, ``rates`` (and optional ``restarts``) are dicts keyed by level.
    ``rates[l]`` is the rate (1/MTBF) of the failures for which level l is the cheapest level
    able to recover. A level with period ``math.inf`` is never checkpointed on its own.

    W = sum_l D_l / P_l + sum_l rates_l (P_l / 2 + R_l), where P_l is the compute time between two
    checkpoints that cover level l (a checkpoint of level l or higher) and D_l is the extra cost of
    going up to level l. With ``inclusive=False`` (hpcckpt's behaviour: only the most resilient
    level due is written, its cost replaces the lower ones) D_l = C_l - C_(l-1); with
    ``inclusive=True`` (Benoit et al.'s assumption: a level-l checkpoint is written after all
    lower levels) D_l = C_l. The rate of failures none of the levels can survive is not
    included.
    """
    names = ordered_levels(periods)
    total, prev_cost = 0.0, 0.0
    restarts = restarts or {}
    for lv in names:
        p = float(periods[lv])
        c = _non_negative(costs[lv], f"cost of {lv}")
        lam = _non_negative(rates.get(lv, 0.0), f"failure rate of {lv}")
        r = _non_negative(restarts.get(lv, c), f"restart cost of {lv}")
        d = c if inclusive else c - prev_cost
        prev_cost = c
        if math.isinf(p):
            if lam > 0:
                return math.inf
            continue
        p = _positive(p, f"period of {lv}")
        total += d / p + lam * (p / 2.0 + r)
    return total


@dataclass(frozen=True)
class MultilevelPlan:
    """Result of multilevel_plan(): periods (compute seconds) per level, the integer ratios
    (``ratios[l]`` = how many checkpoints covering level l per checkpoint of the next higher
    level), the pattern length (period of the highest level) and the first-order waste."""
    periods: dict
    ratios: dict
    pattern: float
    waste: float


def multilevel_plan(costs, rates, restarts=None, inclusive=False, max_ratio=10000):
    """First-order optimal nested multi-level periods (pure). Raises ConfigError on bad input.

    Model (Benoit, Cavelan, Le Fevre, Robert, Sun, IEEE Trans. Computers 66(7), 2017, first-order
    analysis): levels 1..L (in LEVELS order); a pattern of compute length P ends with a checkpoint
    of the top level L; level l is covered N_l times per pattern at equal spacing P/N_l with
    N_L = 1 and N_l = n_l * N_(l+1) for integers n_l >= 1 (nesting: every n_l-th checkpoint that
    covers level l is promoted to level l+1). A failure of rate lambda_l (the failures for which
    l is the cheapest level that recovers) loses on average half of P/N_l plus a restart R_l.
    The waste per unit of compute is

        W(P, N) = A(N)/P + P B(N) + sum_l lambda_l R_l,
        A(N) = sum_l N_l D_l,   B(N) = sum_l lambda_l / (2 N_l)

    with D_l as in multilevel_waste() (``inclusive`` chooses whether a higher checkpoint also
    pays for the lower ones). For fixed N the best P is sqrt(A/B) and W = 2 sqrt(A B) + sum
    lambda_l R_l. Relaxing N to reals gives N_l proportional to sqrt(lambda_l / D_l), i.e. each
    level at about its own Young period sqrt(2 D_l / lambda_l); we then search the integer ratios
    n_l exhaustively (vectorised) around that relaxation, or by coordinate descent when the grid
    is too large, and keep the N minimising W. Levels above the highest level with a positive
    rate protect against nothing in the model: they get period math.inf (never on their own).
    First-order: meaningful when periods and costs are small against the MTBFs.
    """
    if not costs:
        raise ConfigError("multilevel_plan: no levels given")
    for lv in rates:
        if lv not in costs:
            raise ConfigError(f"failure rate given for level {lv!r} but no checkpoint cost")
    names = ordered_levels(costs)
    restarts = restarts or {}
    c = np.array([_positive(costs[lv], f"cost of {lv}") for lv in names])
    lam = np.array([_non_negative(rates.get(lv, 0.0), f"failure rate of {lv}") for lv in names])
    r = np.array([_non_negative(restarts.get(lv, costs[lv]), f"restart cost of {lv}") for lv in names])
    if not np.any(lam > 0):
        raise ConfigError("multilevel_plan: at least one level needs a positive failure rate")
    top = int(np.nonzero(lam > 0)[0][-1])          # highest level that protects against anything
    act = top + 1
    d = c[:act].copy() if inclusive else np.diff(np.concatenate([[0.0], c[:act]]))
    lam_a = lam[:act]
    const = float(np.dot(lam_a, r[:act]))

    # Relaxed (real) optimum N_l ~ sqrt(lambda_l / D_l), clamped to the nesting N_l >= N_(l+1).
    with np.errstate(divide="ignore", invalid="ignore"):
        relaxed = np.sqrt(np.where(d > 0, lam_a / np.where(d > 0, d, 1.0), np.inf))
    hi = []
    for i in range(act - 1):
        a, b = relaxed[i], relaxed[i + 1]
        if not np.isfinite(a) or b <= 0 or not np.isfinite(b):
            guess = 8.0
        else:
            guess = max(1.0, a / b)
        hi.append(int(min(max_ratio, max(8, math.ceil(4 * guess)))))

    def evaluate(ratio_grid):
        # ratio_grid: shape (k, act-1) of integer ratios -> waste for each row
        k = ratio_grid.shape[0]
        n = np.ones((k, act))
        for i in range(act - 2, -1, -1):
            n[:, i] = n[:, i + 1] * ratio_grid[:, i]
        a_ = n @ d
        b_ = (lam_a / 2.0 / n).sum(axis=1)
        with np.errstate(invalid="ignore"):
            w = 2.0 * np.sqrt(np.maximum(a_, 0.0) * b_) + const
        w = np.where(a_ > 0, w, np.inf)
        return w, n, a_, b_

    if act == 1:
        best = np.zeros((0,), dtype=np.int64)
    else:
        sizes = [h for h in hi]
        if math.prod(sizes) <= 200_000:
            grids = np.meshgrid(*[np.arange(1, h + 1) for h in sizes], indexing="ij")
            grid = np.stack([g.ravel() for g in grids], axis=1)
            w, _, _, _ = evaluate(grid)
            best = grid[int(np.argmin(w))]
        else:
            best = np.array([min(h, max(1, round(relaxed[i] / relaxed[i + 1])))
                             if np.isfinite(relaxed[i] / relaxed[i + 1]) else 1
                             for i, h in enumerate(sizes)], dtype=np.int64)
            best_w = evaluate(best[None, :])[0][0]
            for _ in range(100):
                improved = False
                for i, h in enumerate(sizes):
                    cand = np.repeat(best[None, :], h, axis=0)
                    cand[:, i] = np.arange(1, h + 1)
                    w, _, _, _ = evaluate(cand)
                    j = int(np.argmin(w))
                    if w[j] < best_w - 1e-15:
                        best, best_w, improved = cand[j].copy(), w[j], True
                if not improved:
                    break
    w, n, a_, b_ = evaluate(np.asarray(best, dtype=np.int64).reshape(1, act - 1))
    n = n[0]
    pattern = math.sqrt(a_[0] / b_[0]) if a_[0] > 0 else math.inf
    periods, ratios = {}, {}
    for i, lv in enumerate(names):
        if i < act:
            periods[lv] = float(pattern / n[i])
            ratios[lv] = int(best[i]) if i < act - 1 else 1
        else:
            periods[lv] = math.inf
            ratios[lv] = 1
    return MultilevelPlan(periods=periods, ratios=ratios, pattern=pattern, waste=float(w[0]))


def multilevel_periods(costs, rates, restarts=None, inclusive=False):
    """Periods (compute seconds) per level of multilevel_plan(); see there for the model (pure)."""
    return multilevel_plan(costs, rates, restarts=restarts, inclusive=inclusive).periods
