"""Plan arithmetic and the one plan builder. Pure.

Every function keeps the invariant the training side relies on: per-rank local batches
sum to the global batch, each within its rank's bounds (min batch, max batch, memory
cap), whenever such a plan exists; otherwise it says so with ValueError."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat

import numpy as np

from antdt.schemas import JobHealth, JobSpec, Plan
from antdt.schemas.plan import check_accumulation
from antdt.services.controller.actions import AdjustBatchAction
from antdt.services.controller.splits import (
    Floats,
    bounded_moves,
    ints,
    one_value,
    round_keeping_sum,
    water_fill,
)


def upper_bounds(
    n: int, global_batch: int, max_b: int | None, caps: Mapping[int, int] | None
) -> tuple[int, ...]:
    """Per-rank largest batch: min(max_b, memory cap), never above the global batch."""
    top = global_batch if max_b is None else min(max_b, global_batch)
    if not caps:
        return (top,) * n
    return tuple(map(min, repeat(top, n), map(caps.get, range(n), repeat(top, n))))


def check_feasible(global_batch: int, lower: Sequence[int], upper: Sequence[int]) -> None:
    """Raise ValueError, saying why, when no plan within the bounds sums to global_batch."""
    if not lower:
        raise ValueError("a plan needs at least one rank")
    if len(lower) != len(upper):
        raise ValueError("lower and upper bounds must name the same ranks")
    one_each = one_value(lower) and one_value(upper)  # the usual bounds: one value for every rank
    ordered = lower[0] <= upper[0] if one_each else all(map(operator.le, lower, upper))
    for rank, (lo, hi) in enumerate(() if ordered else zip(lower, upper, strict=True)):
        if hi < lo:
            raise ValueError(f"rank {rank}: largest batch {hi} is below the smallest {lo}")
    least = lower[0] * len(lower) if one_each else sum(lower)
    most = upper[0] * len(upper) if one_each else sum(upper)
    if least > global_batch:
        raise ValueError(f"minimum batches sum to {least} > global batch {global_batch}")
    if most < global_batch:
        raise ValueError(
            f"ranks hold at most {most} samples (max batch, memory caps) "
            f"< global batch {global_batch}"
        )


def proportional_shares(
    global_batch: int,
    speeds: Sequence[float],
    min_b: int = 0,
    max_b: int | None = None,
    caps: Mapping[int, int] | None = None,
) -> tuple[int, ...]:
    """Split `global_batch` in proportion to `speeds` (samples/s) within the per-rank
    bounds [min_b, min(max_b, caps[rank])]: shares outside are pinned to the bound and the
    rest re-split (water-filling), then rounded by largest remainder so that the sum is
    exact. Ties go to the lower rank: the result is deterministic."""
    # A finite sum has no inf or nan among its terms: one C pass, the per-value one after.
    finite = math.isfinite(sum(speeds)) or all(map(math.isfinite, speeds))
    if not (finite and min(speeds, default=1.0) > 0):
        raise ValueError(f"speeds must be positive and finite, got {list(speeds)}")
    lower = (min_b,) * len(speeds)
    upper = upper_bounds(len(speeds), global_batch, max_b, caps)
    check_feasible(global_batch, lower, upper)
    low, high = ints(lower), ints(upper)
    real = water_fill(global_batch, speeds, low, high)
    return tuple(round_keeping_sum(real, global_batch, low, high).tolist())


def bounded_change(old: Sequence[int], new: Sequence[int], max_fraction: float) -> tuple[int, ...]:
    """Move from `old` towards `new`, every rank by the same fraction of its way, so that
    none moves more than max(1, floor(max_fraction x max(old_i, mean batch))). The sum
    stays, and each value lies between old_i and new_i (within any bounds both respect);
    the mean term lets a rank starved to a tiny batch grow back in a few moves."""
    total = sum(old)
    if len(old) != len(new) or total != sum(new):
        raise ValueError("old and new plans must have the same ranks and the same sum")
    if not max_fraction > 0:
        raise ValueError("max_fraction must be > 0")
    if math.isinf(max_fraction):
        return tuple(new)
    moved = bounded_moves(ints(old), ints(new), max_fraction, total)
    return tuple(new) if moved is None else tuple(moved.tolist())


def predicted_step_time(local_batch: Sequence[int], speeds: Sequence[float] | Floats) -> float:
    """Under BSP a step lasts as long as the slowest rank: max_i b_i / speed_i."""
    if len(local_batch) != len(speeds):
        raise ValueError("a plan and its speeds must name the same ranks")
    if not len(local_batch):
        return 0.0
    batches, rates = ints(local_batch), np.asarray(speeds, dtype=np.float64)
    busy = batches != 0  # a rank given no samples waits
    if not busy.any():
        return 0.0
    batches, rates = batches[busy], rates[busy]
    with np.errstate(divide="ignore", invalid="ignore"):  # a rank of no speed never ends
        times = np.where(rates > 0, batches / rates, np.inf)
    return float(times.max())


def initial_plan(spec: JobSpec, now: float) -> Plan:
    """Version 0 of a job's plan: equal shares from step 0."""
    return Plan(
        job=spec.job,
        version=0,
        local_batch=spec.equal_shares(),
        effective_step=0,
        reason="initial plan: equal shares",
        policy=spec.policy,
        created_at=now,
    )


def next_plan(
    current: Plan, action: AdjustBatchAction, *, policy: str, effective_step: int, now: float
) -> Plan:
    """The plan that carries `action` out, following `current` (version + 1)."""
    return Plan(
        job=current.job,
        version=current.version + 1,
        local_batch=action.local_batch,
        micro_batch=action.micro_batch,
        accumulation=action.accumulation,
        effective_step=effective_step,
        reason=action.reason[:512],
        policy=policy,
        created_at=now,
    )


def estimate_current_step(health: JobHealth | None, now: float) -> int:
    """Health is up to a period old: extrapolate the step from the measured step time."""
    if health is None:
        return 0
    if health.step_s <= 0:
        return health.step
    return health.step + math.ceil(max(0.0, now - health.at) / health.step_s)


# -- micro-batches and gradient accumulation ---------------------------------------------------


def plan_violations(
    spec: JobSpec,
    caps: Mapping[int, int],
    local_batch: Sequence[int],
    micro_batch: Sequence[int] | None = None,
    accumulation: Sequence[int] | None = None,
) -> str:
    """Why the plan breaks the rule every plan meets ('' when it does not): one batch per
    rank, summing to the global batch, each within [min_local_batch, max_local_batch];
    what a rank holds at once (its micro-batch, else its batch) within its memory cap;
    micro-batches consistent with the accumulation."""
    if len(local_batch) != spec.world_size:
        return f"plan has {len(local_batch)} ranks, job has {spec.world_size}"
    if sum(local_batch) != spec.global_batch:
        return f"plan sums to {sum(local_batch)}, global batch is {spec.global_batch}"
    micro = None if micro_batch is None else tuple(micro_batch)
    accum = None if accumulation is None else tuple(accumulation)
    wrong = _accumulation_violation(tuple(local_batch), micro, accum)
    if wrong:
        return wrong
    upper = spec.max_local_batch or spec.global_batch
    if not caps and spec.min_local_batch <= min(local_batch) and max(local_batch) <= upper:
        return ""  # every batch within bounds, and no cap to hold
    for rank, b in enumerate(local_batch):
        if not spec.min_local_batch <= b <= upper:
            return f"rank {rank}: batch {b} outside [{spec.min_local_batch}, {upper}]"
        cap = caps.get(rank)
        held = b if micro is None else micro[rank]
        if cap is not None and held > cap:
            what = "batch" if micro is None else "micro-batch"
            return f"rank {rank}: {what} {held} exceeds its memory cap {cap}"
    return ""


def _accumulation_violation(
    local: tuple[int, ...], micro: tuple[int, ...] | None, accum: tuple[int, ...] | None
) -> str:
    """`check_accumulation`'s complaint ('' when none). One micro-step of its whole batch
    per rank (the plan of a job without memory caps) holds, and is seen at C speed: the
    rank-by-rank check cost ~5 ms a decision at 10,000 ranks."""
    if micro == local and accum is not None and accum.count(1) == len(accum) == len(local):
        return ""
    try:
        check_accumulation(local, micro, accum)
    except ValueError as exc:
        return str(exc)
    return ""


def accumulation_upper_bounds(
    n: int,
    global_batch: int,
    max_b: int | None,
    caps: Mapping[int, int] | None,
    max_accumulation: int,
) -> tuple[int, ...]:
    """Per-rank largest local batch when gradients may be accumulated: the memory cap
    bounds the micro-batch only, so a rank holds up to cap x max_accumulation per step
    (and never more than max_b or the global batch)."""
    top = global_batch if max_b is None else min(max_b, global_batch)
    if not caps:
        return (top,) * n
    return tuple(
        min(top, caps[rank] * max_accumulation) if rank in caps else top for rank in range(n)
    )


def micro_batching(
    local_batch: Sequence[int], caps: Mapping[int, int], max_accumulation: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(micro_batch, accumulation) per rank: the fewest micro-steps that fit the memory
    cap, a = ceil(b / cap) (1 without a cap or for an empty batch), and m = ceil(b / a).
    ValueError when a rank would need more than `max_accumulation` micro-steps."""
    if not caps and max_accumulation >= 1:
        return tuple(local_batch), (1,) * len(local_batch)  # one micro-step of the batch
    micro: list[int] = []
    accumulation: list[int] = []
    for rank, b in enumerate(local_batch):
        cap = caps.get(rank)
        a = 1 if cap is None or b == 0 else -(-b // cap)
        if a > max_accumulation:
            raise ValueError(
                f"rank {rank}: batch {b} needs {a} micro-steps of at most {cap} "
                f"> max_accumulation {max_accumulation}"
            )
        accumulation.append(a)
        micro.append(-(-b // a))
    return tuple(micro), tuple(accumulation)
