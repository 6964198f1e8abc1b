"""Ranks grouped by model for the balanced planner (`balance.py`). Pure.

The policies give every rank not held deviating one model object, so a job of 10,000
ranks is one large class and a few odd ones (a crowd: hundreds to thousands). The
planner works per class; this finds the classes at C speed: the common model by `count`
on a few candidates (an identical object matches without a comparison), the odd ranks
in one pass, a table of classes with no object per odd rank."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, repeat
from operator import eq, is_not
from typing import Protocol

import numpy as np

from antdt.services.controller.splits import Floats, Ints, one_value


class StepTimeModel(Protocol):
    """What a plan needs of a rank: its predicted compute time is fixed_s + per_sample_s x b."""

    @property
    def fixed_s(self) -> float: ...

    @property
    def per_sample_s(self) -> float: ...


@dataclass(frozen=True)
class ClassTable:
    """Classes in order of their first rank: each one's model, ranks and bounds. What
    the planner and the predictions read more than once (the largest class, the ranks
    of the others) is derived once."""

    models: list[StepTimeModel]
    ranks: list[list[int]]
    lo: list[int]
    hi: list[int]

    @cached_property
    def sizes(self) -> Ints:
        """Each class's number of ranks."""
        return np.fromiter(map(len, self.ranks), np.int64, len(self.ranks))

    @cached_property
    def largest(self) -> int:
        """The class with the most ranks (the first of them): the job's common model."""
        return int(self.sizes.argmax())

    @cached_property
    def others(self) -> list[int]:
        """The classes but the largest, in order."""
        largest = self.largest
        return [i for i in range(len(self.models)) if i != largest]

    @cached_property
    def others_ranks(self) -> list[int]:
        """The ranks of `others`, class after class."""
        return list(chain.from_iterable(map(self.ranks.__getitem__, self.others)))

    def odd_ranks(self, most: int) -> list[int] | None:
        """The ranks outside the largest class, ascending, when at most `most`."""
        if len(self.others_ranks) > most:
            return None
        return sorted(self.others_ranks)

    def parts(self) -> tuple[Floats, Floats]:
        """Every rank's model parts (fixed_s, per_sample_s) as arrays, by rank: the largest
        class's filled in at once, the others' placed rank by rank."""
        common, ranks = self.models[self.largest], int(self.sizes.sum())
        fixed = np.full(ranks, common.fixed_s, dtype=np.float64)
        per_sample = np.full(ranks, common.per_sample_s, dtype=np.float64)
        others = self.others
        if others:
            sizes, at = self.sizes[others], self.others_ranks
            fixed[at] = np.repeat([self.models[i].fixed_s for i in others], sizes)
            per_sample[at] = np.repeat([self.models[i].per_sample_s for i in others], sizes)
        return fixed, per_sample

    def with_model(self, at: int, model: StepTimeModel) -> ClassTable:
        """The same classes, class `at`'s model replaced: its ranks, bounds and what is
        derived from them (sizes, the largest, the others' ranks) kept."""
        models = list(self.models)
        models[at] = model
        table = ClassTable(models, self.ranks, self.lo, self.hi)
        for name in ("sizes", "largest", "others", "others_ranks"):
            if name in self.__dict__:  # a cached_property's value, as it stores it
                table.__dict__[name] = self.__dict__[name]
        return table

    @classmethod
    def of(cls, classes: list[RankClass], models: Sequence[StepTimeModel]) -> ClassTable:
        firsts = [c.ranks[0] for c in classes]
        return cls(
            [models[r] for r in firsts],
            [c.ranks for c in classes],
            [c.lo for c in classes],
            [c.hi for c in classes],
        )

    def classes(self) -> list[RankClass]:
        """The classes as objects, each at its lower bound."""
        found = []
        for model, ranks, lo, hi in zip(self.models, self.ranks, self.lo, self.hi, strict=True):
            c = RankClass(model, lo, hi)
            c.ranks = ranks
            found.append(c)
        return found


class RankClass:
    """Ranks of one model object and the same bounds, in rank order, at one batch."""

    __slots__ = ("batch", "fixed_s", "hi", "lo", "per_sample_s", "ranks")

    def __init__(self, model: StepTimeModel, lo: int, hi: int) -> None:
        self.fixed_s, self.per_sample_s = model.fixed_s, model.per_sample_s
        self.lo, self.hi, self.batch = lo, hi, lo
        self.ranks: list[int] = []

    def time_at(self, batch: int) -> float:
        return self.fixed_s + self.per_sample_s * batch


def group_by_model(
    models: Sequence[StepTimeModel], lower: Sequence[int], upper: Sequence[int]
) -> ClassTable:
    """The classes in order of their first rank."""
    if one_value(lower) and one_value(upper):
        mostly = _mostly_one(models, lower[0], upper[0])
        if mostly is not None:
            return mostly
        keys: list[object] = list(map(id, models))  # one bound for all: the model decides
    else:
        keys = list(zip(map(id, models), lower, upper, strict=True))
    distinct = set(keys)
    if len(distinct) <= FEW:  # a few scans per class, each at C speed
        found: dict[int, RankClass] = {}
        for ranks in _positions(keys, distinct).values():
            first = ranks[0]
            c = RankClass(models[first], lower[first], upper[first])
            c.ranks = ranks
            found[first] = c
        return ClassTable.of([found[first] for first in sorted(found)], models)
    by_key: dict[object, RankClass] = {}
    for rank, key in enumerate(keys):
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = RankClass(models[rank], lower[rank], upper[rank])
        group.ranks.append(rank)
    return ClassTable.of(list(by_key.values()), models)


#: Up to this many classes are gathered one pass each (else one pass over the ranks).
FEW = 16
#: A class of up to this many ranks is found by search, not by a pass over every rank.
_SCATTERED = 64


def _mostly_one(models: Sequence[StepTimeModel], lo: int, hi: int) -> ClassTable | None:
    """The classes when at least half the ranks share one model object (the usual
    job: one model for the ranks not held deviating); else None. The common class is
    gathered at C speed, the others rank by rank. When every model equals the common
    one they are one class: equal models plan as one (a tie of classes hands out its
    units by rank, as one class does), and the per-rank reference holds it."""
    n = len(models)
    common = common_model(models)
    if common is None:
        return None
    if models.count(common) == n:  # every rank's model equals it: one class, as planned
        return ClassTable([common], [list(range(n))], [lo], [hi])
    rare = list(compress(range(n), map(is_not, models, repeat(common))))
    if 2 * (n - len(rare)) < n:
        return None
    rare_models = list(map(models.__getitem__, rare))
    ids = list(map(id, rare_models))
    if len(set(ids)) == len(ids):  # each odd rank its own model (a crowd of held ranks)
        found, ranks_of = rare_models, [[rank] for rank in rare]
    else:
        found, ranks_of = [], []
        at: dict[int, int] = {}  # model id -> its class
        for rank, model, key in zip(rare, rare_models, ids, strict=True):
            if key in at:
                ranks_of[at[key]].append(rank)
            else:
                at[key] = len(found)
                found.append(model)
                ranks_of.append([rank])
    if len(rare) <= _SCATTERED:
        main = list(range(n))
        for rank in reversed(rare):  # few: each a memmove, not a pass over every rank
            del main[rank]
    else:  # the rest, found from the odd ranks in arrays, not by a second pass over all
        common_ranks = np.ones(n, dtype=bool)
        common_ranks[rare] = False
        main = np.flatnonzero(common_ranks).tolist()
    place = bisect.bisect_left([ranks[0] for ranks in ranks_of], main[0])
    found.insert(place, common)
    ranks_of.insert(place, main)
    return ClassTable(found, ranks_of, [lo] * len(found), [hi] * len(found))


def common_model(models: Sequence[StepTimeModel]) -> StepTimeModel | None:
    """A model object that may be at least half of `models` (None: none is). The first,
    middle and last ranks' are tried with `count` (identical objects match at C speed,
    without a comparison; equal ones count too, so the caller counts identity), else
    the most common object."""
    n = len(models)
    for candidate in (models[0], models[n // 2], models[-1]):
        if 2 * models.count(candidate) >= n:
            return candidate
    common_id, count = Counter(map(id, models)).most_common(1)[0]
    if 2 * count < n:
        return None
    return next(m for m in models if id(m) == common_id)


def _positions(keys: list[object], distinct: set[object]) -> dict[object, list[int]]:
    """The positions of each distinct key, in order: the largest class as every position
    less the others' (a job is mostly one class: the ranks not held deviating)."""
    counts = {key: keys.count(key) for key in distinct}
    top = max(counts.values())
    tied = [key for key in distinct if counts[key] == top]
    largest = tied[0] if len(tied) == 1 else min(tied, key=keys.index)
    found: dict[object, list[int]] = {}
    for key in distinct - {largest}:
        if counts[key] <= _SCATTERED:
            at, ranks = -1, []
            for _ in range(counts[key]):
                at = keys.index(key, at + 1)
                ranks.append(at)
        else:
            ranks = list(compress(range(len(keys)), map(eq, keys, repeat(key))))
        found[key] = ranks
    rest = list(range(len(keys)))
    for rank in sorted((r for ranks in found.values() for r in ranks), reverse=True):
        del rest[rank]
    found[largest] = rest
    return found


__all__ = ["FEW", "ClassTable", "RankClass", "StepTimeModel", "common_model", "group_by_model"]
