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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from antdt.services.controller.balance import StepModel
from antdt.services.controller.guardrails import batch_bounds
from antdt.services.controller.policies.judged import held_ranks, judged_models
from antdt.services.controller.policies.targets import balanced_target
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
    step_s = now.step_s(now.plan)
    if not step_s > 0:
        return None
    _, upper = batch_bounds(view)
    lower = view.spec.min_local_batch
    keys = list(zip(map(id, now.models), map(upper.__getitem__, now.known), strict=True))
    firsts = dict(zip(keys, now.models, strict=True))
    counts = Counter(keys)
    most_of = {
        key: most_samples_under(model, lower, key[1], step_s) for key, model in firsts.items()
    }
    typical = _fastest_typical([(firsts[k], n) for k, n in counts.items()], len(keys))
    healed_most = {cap: most_samples_under(typical, lower, cap, step_s) or 0 for cap in set(upper)}
    blocked = (
        frozenset(r for r, key in zip(now.known, keys, strict=True) if most_of[key] is None)
        if None in most_of.values()
        else frozenset()
    )
    capacity = sum(n * (most_of[k] or 0) for k, n in counts.items())
    deficit = sum(map(now.plan.__getitem__, now.known)) - capacity
    position = {r: i for i, r in enumerate(now.known)} if len(now.known) < len(upper) else None
    most = {}
    for rank in held:
        at = rank if position is None else position.get(rank)
        if at is not None and 0 <= at < len(keys) and most_of[keys[at]] is not None:
            most[rank] = cast(int, most_of[keys[at]])
    return RestartBound(step_s, deficit, held, blocked, most, healed_most, tuple(upper))


def _fastest_typical(models: list[tuple[StepModel, int]], ranks: int) -> StepModel:
    """A model no slower than the median of the others' models with any one rank left
    out (`_healed_by_model`): each part at the order statistic that median can fall to."""
    at = max(0, (ranks - 3) // 2)
    return StepModel(_nth(models, at, "fixed_s"), _nth(models, at, "per_sample_s"))


def _nth(models: list[tuple[StepModel, int]], at: int, part: str) -> float:
    """The `at`-th smallest `part` over the ranks, each model counted its number."""
    seen = 0
    for value, count in sorted((getattr(m, part), n) for m, n in models):
        seen += count
        if seen > at:
            return float(value)
    raise ValueError("no model")


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
