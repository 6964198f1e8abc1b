"""Plan arithmetic and the one plan builder. Pure.

Every function keeps the invariant the training side relies on: per-rank local batches
sum to the global batch, each within its rank's bounds (min batch, max batch, memory
cap), whenever such a plan exists; otherwise it says so with ValueError."""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import compress, islice, repeat

from antdt.schemas import JobHealth, JobSpec, Plan
from antdt.schemas.plan import check_accumulation
from antdt.services.controller.actions import AdjustBatchAction


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
    ordered = all(map(operator.le, lower, upper))
    for rank, (lo, hi) in enumerate(() if ordered else zip(lower, upper, strict=True)):
        if hi < lo:
            raise ValueError(f"rank {rank}: largest batch {hi} is below the smallest {lo}")
    if sum(lower) > global_batch:
        raise ValueError(f"minimum batches sum to {sum(lower)} > global batch {global_batch}")
    if sum(upper) < global_batch:
        raise ValueError(
            f"ranks hold at most {sum(upper)} samples (max batch, memory caps) "
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
    real = _water_fill(global_batch, speeds, lower, upper)
    return _round_keeping_sum(real, global_batch, lower, upper)


def _water_fill(
    total: int, speeds: Sequence[float], lower: Sequence[int], upper: Sequence[int]
) -> list[float]:
    """Real-valued proportional shares with ranks pinned at their bounds where needed."""
    n = len(speeds)
    pinned: dict[int, float] = {}
    while True:
        if pinned:
            free: Sequence[int] = [r for r in range(n) if r not in pinned]
            if not free:
                return [pinned[r] for r in range(n)]
            weight = sum(speeds[r] for r in free)
        else:
            free, weight = range(n), sum(speeds)  # the same sum, in the same order
        remaining = total - sum(pinned.values())
        rates = map(speeds.__getitem__, free) if pinned else speeds
        shares = list(
            map(operator.truediv, map(operator.mul, repeat(remaining), rates), repeat(weight))
        )
        if not pinned and max(lower) <= min(shares) and max(shares) <= min(upper):
            return shares  # within every rank's bounds: nothing to pin
        share = dict(zip(free, shares, strict=True)) if pinned else shares  # by rank
        tops, bottoms = (map(upper.__getitem__, free), map(lower.__getitem__, free))
        over = list(compress(free, map(operator.gt, shares, tops)))
        under = list(compress(free, map(operator.lt, shares, bottoms)))
        if not over and not under:
            if not pinned:
                return shares
            return [pinned[r] if r in pinned else share[r] for r in range(n)]
        # Pin the side that is further out: pinning it can only push the others back
        # towards their bounds, so the loop ends within len(speeds) rounds.
        excess = sum(share[r] - upper[r] for r in over)
        deficit = sum(lower[r] - share[r] for r in under)
        if excess >= deficit:
            pinned.update((r, float(upper[r])) for r in over)
        else:
            pinned.update((r, float(lower[r])) for r in under)


def _round_keeping_sum(
    real: Sequence[float], total: int, lower: Sequence[int], upper: Sequence[int]
) -> tuple[int, ...]:
    """Largest-remainder rounding within bounds; the sum comes out exactly `total`."""
    if not len(real) == len(lower) == len(upper):
        raise ValueError("shares and bounds must name the same ranks")
    shares = list(map(math.floor, real))
    low, high = max(lower, default=0), min(upper, default=0)
    if not (low <= min(shares, default=0) and max(shares, default=0) <= high):
        shares = list(map(min, map(max, shares, lower), upper))
    remainders = list(map(operator.sub, shares, real))
    by_remainder = sorted(range(len(real)), key=remainders.__getitem__)  # stable: ties by rank
    missing = total - sum(shares)
    while missing:
        # One unit per rank per pass, largest remainder first (smallest when taking).
        order = by_remainder if missing > 0 else by_remainder[::-1]
        step = 1 if missing > 0 else -1
        if _all_can_move(shares, step, lower, upper):
            movable = order[: abs(missing)]
        else:
            can_move = (r for r in order if lower[r] <= shares[r] + step <= upper[r])
            movable = list(islice(can_move, abs(missing)))
        if not movable:
            raise ValueError("no plan within the bounds sums to the global batch")
        moved = map(operator.add, map(shares.__getitem__, movable), repeat(step))
        deque(map(shares.__setitem__, movable, moved), maxlen=0)  # each moves once a pass
        missing -= step * len(movable)
    return tuple(shares)


def _all_can_move(
    shares: Sequence[int], step: int, lower: Sequence[int], upper: Sequence[int]
) -> bool:
    """Whether every rank may move by `step` within its bounds (a cheap sufficient test)."""
    low, high = max(lower, default=0), min(upper, default=0)
    return low <= min(shares, default=0) + step and max(shares, default=0) + step <= high


def bounded_change(old: Sequence[int], new: Sequence[int], max_fraction: float) -> tuple[int, ...]:
    """Move from `old` towards `new`, every rank by the same fraction of its way, so that
    none moves more than max(1, floor(max_fraction x max(old_i, mean batch))). The sum
    stays, and each value lies between old_i and new_i (within any bounds both respect);
    the mean term lets a rank starved to a tiny batch grow back in a few moves."""
    if len(old) != len(new) or sum(old) != sum(new):
        raise ValueError("old and new plans must have the same ranks and the same sum")
    if not max_fraction > 0:
        raise ValueError("max_fraction must be > 0")
    if math.isinf(max_fraction):
        return tuple(new)
    mean = sum(old) / len(old)
    limit_of = {b: max(1, math.floor(max_fraction * max(b, mean))) for b in set(old)}
    limits = list(map(limit_of.__getitem__, old))
    deltas = list(map(operator.sub, new, old))
    num, den = _scale(deltas, limits)
    if num >= den:
        return tuple(new)
    # Each rank moves d x num / den: `steps` truncated towards old, `leftover` the rest
    # (x den, so that integers order them as the fractions).
    steps, leftover = _moves(deltas, num, den)
    missing = -sum(steps)
    # Hand the rounding units to the ranks that were cut the most, in their direction.
    if missing > 0:  # stable sorts: ties by rank
        negated = list(map(operator.neg, leftover))
        order = sorted(range(len(old)), key=negated.__getitem__)[:missing]
    else:
        order = sorted(range(len(old)), key=leftover.__getitem__)[:-missing]
    for r in order:
        steps[r] += 1 if missing > 0 else -1
    return tuple(map(operator.add, old, steps))


def _moves(deltas: list[int], num: int, den: int) -> tuple[list[int], list[int]]:
    """Each delta x num / den as `steps` truncated towards 0 and `leftover` the rest (x den,
    so that integers order them as the fractions): once per distinct delta when few."""

    def step(d: int) -> int:
        return d * num // den if d >= 0 else -(-d * num // den)

    distinct = set(deltas)
    if len(distinct) * 4 > len(deltas):
        steps = [step(d) for d in deltas]
        return steps, [d * num - s * den for d, s in zip(deltas, steps, strict=True)]
    step_of = {d: step(d) for d in distinct}
    left_of = {d: d * num - s * den for d, s in step_of.items()}
    return list(map(step_of.__getitem__, deltas)), list(map(left_of.__getitem__, deltas))


def _scale(deltas: Sequence[int], limits: Sequence[int]) -> tuple[int, int]:
    """The smallest limit / |delta| over the ranks that move, as num / den (1 / 1 when it
    is larger), exactly: the float ratios pick the few candidates, integers decide."""
    moving = list(map(bool, deltas))
    sizes = list(map(abs, compress(deltas, moving)))
    caps = list(compress(limits, moving))
    if not sizes:
        return 1, 1
    ratios = list(map(operator.truediv, caps, sizes))
    near = min(ratios) * (1.0 + 1e-9)
    num, den = 1, 1
    for lim, d in compress(zip(caps, sizes, strict=True), map(operator.le, ratios, repeat(near))):
        if lim * den < num * d:
            num, den = lim, d
    return num, den


def predicted_step_time(local_batch: Sequence[int], speeds: Sequence[float]) -> float:
    """Under BSP a step lasts as long as the slowest rank: max_i b_i / speed_i."""
    if len(local_batch) != len(speeds):
        raise ValueError("a plan and its speeds must name the same ranks")
    if 0 not in local_batch and min(speeds, default=1.0) > 0:  # the same, at C speed
        return max(map(operator.truediv, local_batch, speeds), default=0.0)
    times = [b / s if s > 0 else math.inf for b, s in zip(local_batch, speeds, strict=True) if b]
    return max(times, default=0.0)


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
    try:
        check_accumulation(tuple(local_batch), micro, accum)
    except ValueError as exc:
        return str(exc)
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
