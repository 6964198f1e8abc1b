"""Which persistent stragglers a restart could pay for, without planning the job once per
straggler. Pure.

antdt-nd's estimate of a restart plans the whole job twice (now, and with the rank
healed). At 10,000 ranks with hundreds of persistent stragglers that was one balanced
plan per straggler, seconds per decision, and nearly every estimate said "no saving":
in a large balanced job many ranks sit at the slowest predicted time, and one healed
rank cannot take a sample from each of them. `RestartBound` says so exactly, once per
decision: the balanced plan's step time now (T), and how many samples the known ranks
lack to run a step faster than T (the deficit, from each rank's most samples under T).
Healing rank r gives it at most the samples under T of the fastest model the others'
median can be; when what that adds is below the deficit the healed plan still takes T,
and the model saves nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from antdt.services.controller.balance import StepModel
from antdt.services.controller.guardrails import batch_bounds
from antdt.services.controller.policies.judged import held_ranks, judged_models, ranks_within
from antdt.services.controller.policies.targets import balanced_target
from antdt.services.controller.splits import Floats, Ints, ints
from antdt.services.controller.view import JobView


@dataclass(frozen=True)
class RestartBound:
    """The balanced plan's predicted step now, and what healing one rank could change."""

    step_s: float  # the balanced plan's predicted step time now, seconds
    deficit: int  # samples the known ranks lack to run a step faster than `step_s`
    held: frozenset[int]  # ranks held deviating: the models were planned with these
    blocked: frozenset[int]  # ranks whose fewest samples already take `step_s`
    most: dict[int, int]  # per held rank planned: its most samples under `step_s`
    healed_most: dict[int, int]  # per upper bound: a healed rank's most samples under it
    upper: tuple[int, ...]  # per rank, its batch bound

    def model_may_save(self, rank: int) -> bool:
        """Whether healing `rank` could shorten the balanced step at all (else the
        model's estimate saves 0): an exact test, not a guess. A rank not planned with
        these models (not held, no model) is estimated in full."""
        if rank in self.blocked:
            return len(self.blocked) == 1  # another rank blocked holds the step at T
        most = self.most.get(rank)
        if rank not in self.held or most is None:
            return True
        room = self.healed_most[self.upper[rank]] - most
        return not self.blocked and room >= self.deficit


def restart_bound(view: JobView, speeds: Sequence[float | None]) -> RestartBound | None:
    """The bound for this view's decision, or None when the estimate plans by speed
    (no fitted models) or no plan fits: then every straggler is estimated in full."""
    held = frozenset(held_ranks(view, frozenset()))
    models = judged_models(view, speeds, deviating=held)
    if models is None:
        return None
    now = balanced_target(view, models)
    if now is None or now.models is None:
        return None
    step_s = now.planned_step_s
    if not step_s > 0:
        return None
    _, upper = batch_bounds(view)
    lower = view.spec.min_local_batch
    known = _positions(now.known)
    fixed, per_sample = now.parts
    caps = ints(upper)[known]
    most = _most_under(fixed, per_sample, caps, step_s)
    under = most >= lower  # None in most_samples_under: not even `lower` fits under T
    typical = StepModel(_nth(fixed, (len(known) - 3) // 2), _nth(per_sample, (len(known) - 3) // 2))
    healed_most = {cap: most_samples_under(typical, lower, cap, step_s) or 0 for cap in set(upper)}
    blocked = frozenset(known[~under].tolist())
    capacity = int(most[under].sum())
    deficit = int(ints(now.plan)[known].sum()) - capacity
    at = np.full(len(upper), -1, dtype=np.int64)
    at[known] = np.arange(len(known))
    ranks = np.array(ranks_within(held, len(upper)), dtype=np.int64)
    ranks = ranks[at[ranks] >= 0]  # held, and planned with these models
    ranks = ranks[under[at[ranks]]]
    most_of = dict(zip(ranks.tolist(), most[at[ranks]].tolist(), strict=True))
    return RestartBound(step_s, deficit, held, blocked, most_of, healed_most, tuple(upper))


def _positions(known: Sequence[int]) -> Ints:
    """The known ranks as an array (every rank: a range, made at C speed)."""
    if isinstance(known, range):
        return np.arange(known.start, known.stop, known.step, dtype=np.int64)
    return np.asarray(known, dtype=np.int64)


def _most_under(fixed: Floats, per_sample: Floats, caps: Ints, limit_s: float) -> Ints:
    """`most_samples_under` of every rank at once (its lower bound not applied): the
    most samples up to its cap whose predicted time is under `limit_s`."""
    most = np.maximum(0, np.minimum(caps, np.ceil((limit_s - fixed) / per_sample) - 1))
    most = most.astype(np.int64)
    while True:  # as most_samples_under's loops: the ceiling's float may be one off
        over = (most >= 1) & (fixed + per_sample * most >= limit_s)
        if not over.any():
            break
        most[over] -= 1
    while True:
        room = (most + 1 <= caps) & (fixed + per_sample * (most + 1) < limit_s)
        if not room.any():
            return most
        most[room] += 1


def _nth(parts: Floats, at: int) -> float:
    """The `at`-th smallest (0 at least) of `parts`: the order statistic the median of
    the others' models, any one rank left out, can fall to. Sorted, not partitioned:
    the parts of a job are mostly one value (every rank not held shares the typical
    model), where numpy's introselect takes 15x a sort (1 ms at 10,000 ranks)."""
    return float(np.sort(parts)[max(0, at)])


def most_samples_under(model: StepModel, lower: int, upper: int, limit_s: float) -> int | None:
    """The most samples in [lower, upper] whose predicted time is under `limit_s` (a
    rank given 0 samples waits: its time is 0); None when there is none."""
    fixed, per_sample = model.fixed_s, model.per_sample_s
    most = max(0, min(upper, math.ceil((limit_s - fixed) / per_sample) - 1))
    while most >= 1 and fixed + per_sample * most >= limit_s:
        most -= 1
    while most + 1 <= upper and fixed + per_sample * (most + 1) < limit_s:
        most += 1
    return most if most >= lower else None


__all__ = ["RestartBound", "most_samples_under", "restart_bound"]
