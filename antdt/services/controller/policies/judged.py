"""What the batch policies read of a job's health: per-rank speeds and step-time models,
as the detector judges them. A rank the detector does not hold deviating counts as the
typical rank: its measured difference is within the detector's noise band. Pure.
Rules: docs/architecture.md, "The lb-bsp policy"."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import cast

import numpy as np

from antdt.schemas import Cause, Incident, IncidentKind, IncidentState, RankColumns, RankState
from antdt.services.controller.balance import StepModel, step_models
from antdt.services.controller.columns import HealthColumns
from antdt.services.controller.policies.fitted import model_rows, split_models
from antdt.services.controller.policies.incident_facts import facts_of, incident_facts
from antdt.services.controller.splits import Floats
from antdt.services.controller.view import JobView

_USABLE = (RankState.OK, RankState.SLOW, RankState.LEADER)


def measured_speeds(view: JobView) -> tuple[float | None, ...]:
    """Per-rank speed (samples/s) before the barrier: compute, plus the data wait of a
    data-bound rank (`data_per_sample`); None where unknown or stalled."""
    return view.remembered("measured_speeds", None, lambda: _measured_speeds(view))


def _measured_speeds(view: JobView) -> tuple[float | None, ...]:
    data = data_per_sample(view)
    columns = view.health_columns
    if columns.complete and not data:  # the usual job: one row per rank, in order
        return columns.speeds
    speeds: list[float | None] = [None] * view.spec.world_size
    table = _table(view)
    for i in _usable(view):
        rank, rate = table.rank[i], table.samples_per_s[i]
        if rate > 0:
            speeds[rank] = 1.0 / (1.0 / rate + (data.get(rank, 0.0) if data else 0.0))
    return tuple(speeds)


def measured_models(view: JobView) -> tuple[StepModel | None, ...]:
    """Per-rank step-time model from health (`fixed_s`, `per_sample_s`), a data-bound
    rank's data wait per sample added; None where the monitor has not fitted one, the
    rank is unusable (as for speeds), or it has no speed."""
    models: list[StepModel | None] = [None] * view.spec.world_size
    data = data_per_sample(view)
    table = _table(view)
    for i in _usable(view):
        fixed, per_sample = table.fixed_s[i], table.per_sample_s[i]  # finite: the contract
        rate = table.samples_per_s[i]
        if fixed is not None and per_sample is not None and per_sample > 0 < rate:
            rank = table.rank[i]
            models[rank] = StepModel(fixed, per_sample + data.get(rank, 0.0))
    return tuple(models)


def data_per_sample(view: JobView) -> dict[int, float]:
    """Seconds of data wait per sample of each rank held slow for its data (an open SLOW
    incident, cause data): its loader's work grows with its batch, so a plan counts it
    as that rank's own time before the barrier. The models fit compute only."""
    if view.health is None:
        return {}
    return view.remembered("data_per_sample", None, lambda: _data_per_sample(view))


def _data_per_sample(view: JobView) -> dict[int, float]:
    assert view.health is not None
    bound = incident_facts(view).data_bound
    if not bound:
        return {}
    step_s, table = view.health.step_s, view.health.ranks
    return {
        rank: share * step_s / batch
        for rank, share, batch in zip(
            table.rank, table.data_wait_share, table.local_batch, strict=True
        )
        if rank in bound and batch > 0
    }


def held_ranks(view: JobView, deviating: AbstractSet[int]) -> set[int]:
    """Ranks held deviating: `deviating`, and those of an open SLOW or LEADER incident
    (with the ranks of its host when the host slowed as one)."""
    return set(deviating) | incident_facts(view).held


def link_bound(incident: Incident) -> bool:
    """An open SLOW incident whose cause is the rank's communication (its link): no
    batch plan helps it, and its long steps say nothing of its compute speed."""
    return _open_slow(incident, Cause.COMMUNICATION)


def _open_slow(incident: Incident, cause: Cause) -> bool:
    return (
        incident.kind == IncidentKind.SLOW
        and incident.cause == cause
        and incident.state != IncidentState.RESOLVED
    )


def without_link_bound(
    view: JobView, speeds: Sequence[float | None], event: object = None
) -> tuple[float | None, ...]:
    """`speeds` with the ranks of link-bound incidents (the view's, and `event` when it
    is one) unknown: a plan keeps their batches, never cuts them for a slow link."""
    bound = incident_facts(view).link_bound
    if isinstance(event, Incident):
        bound = bound | facts_of((event,)).link_bound
    if not bound:
        return tuple(speeds)
    return tuple(None if r in bound else s for r, s in enumerate(speeds))


def judged_speeds(
    view: JobView, speeds: Sequence[float | None], deviating: AbstractSet[int]
) -> list[float | None]:
    """Measured speeds, except that a rank not held deviating (`held_ranks`) counts as
    typical, the median of such ranks: a plan built on their differences would outlive
    the straggler it was for."""
    held = ranks_within(held_ranks(view, deviating), len(speeds))
    typical = _others_median(view, speeds, held)
    if typical is None:
        return list(speeds)
    judged: list[float | None]
    if any_unknown(view, speeds):
        judged = [None if s is None else typical for s in speeds]
    else:
        judged = [typical] * len(speeds)
    for rank in held:
        judged[rank] = speeds[rank]
    return judged


def any_unknown(view: JobView, speeds: Sequence[float | None]) -> bool:
    """`None in speeds`, read from the health's columns when `speeds` are its measured
    ones (at 10,000 ranks a scan comparing each float with None costs ~0.3 ms)."""
    columns = view.health_columns if view.health is not None else None
    if columns is not None and columns.complete and speeds is columns.speeds:
        return columns.sorted_speeds is None  # sorted when every rank has a speed
    return None in speeds


def _others_median(view: JobView, speeds: Sequence[float | None], held: list[int]) -> float | None:
    """The median of the known speeds of the ranks not `held` (None: none is known); from
    the health's sorted column when `speeds` are its measured ones."""
    columns = view.health_columns if view.health is not None else None
    if columns is not None and speeds is columns.speeds and columns.sorted_speeds is not None:
        return _median_without(columns.sorted_speeds, list(map(speeds.__getitem__, held)))
    others = list(speeds)
    for rank in held:
        others[rank] = None
    known = [s for s in others if s is not None] if None in others else cast(list[float], others)
    return statistics.median(known) if known else None


def judged_models(
    view: JobView, speeds: Sequence[float | None], deviating: AbstractSet[int]
) -> list[StepModel | None] | None:
    """Per-rank models to plan with, None for a rank of unknown speed (it keeps its
    batch); None in all when no rank has a model (plan from `judged_speeds` as before).

    A held rank keeps its own model, a rank not held gets the median model of those (as
    `judged_speeds`); a rank without a model counts at its per-sample speed (no fixed
    part), and so does the typical rank when no rank not held has a model."""
    held = held_ranks(view, deviating)
    key = (frozenset(held), tuple(speeds))
    plan = view.remembered("judged_models", key, lambda: _judged_models(view, speeds, held))
    return None if plan is None else list(plan)


def _judged_models(
    view: JobView, speeds: Sequence[float | None], held: AbstractSet[int]
) -> list[StepModel | None] | None:
    own, typical = _fitted(view, held)
    if not own and typical is None:
        return None
    judged = judged_speeds(view, speeds, held)
    flat: dict[float, StepModel] = {}  # one object per speed: balanced_batches' classes

    def flat_at(speed: float) -> StepModel:
        return flat.get(speed) or flat.setdefault(speed, _flat(speed))

    if typical is None:
        plan = [None if s is None else flat_at(s) for s in judged]
    elif any_unknown(view, speeds):  # `judged` is unknown where `speeds` is
        plan = [None if s is None else typical for s in judged]
    else:
        plan = [typical] * len(judged)
    for rank in held:
        speed = judged[rank] if 0 <= rank < len(judged) else None
        if speed is not None:
            plan[rank] = own.get(rank) or flat_at(speed)
    return plan


def _fitted(view: JobView, held: AbstractSet[int]) -> tuple[dict[int, StepModel], StepModel | None]:
    """`measured_models` split: the held ranks' models by rank, and the others' median
    model (None: none has one; no model object per rank is built for it)."""
    data = data_per_sample(view)
    columns = view.health_columns
    if columns.complete and not data and columns.all_fitted:
        return _fitted_columns(columns, held)
    rows = model_rows(_table(view), _usable(view), data)
    return split_models(rows, held, view.spec.world_size)


def _fitted_columns(
    columns: HealthColumns, held: AbstractSet[int]
) -> tuple[dict[int, StepModel], StepModel | None]:
    """`_fitted` of a job whose ranks all have a model, from its columns: the others'
    parts come sorted, the held ranks' left out of their medians."""
    mine = ranks_within(held, len(columns.fixed))
    fixed = list(map(cast(list[float], columns.fixed).__getitem__, mine))
    per_sample = list(map(cast(list[float], columns.per_sample).__getitem__, mine))
    own = dict(zip(mine, step_models(fixed, per_sample), strict=True))
    typical_fixed = _median_without(cast(Floats, columns.sorted_fixed), fixed)
    if typical_fixed is None:
        return own, None
    typical_per_sample = _median_without(cast(Floats, columns.sorted_per_sample), per_sample)
    return own, StepModel(typical_fixed, cast(float, typical_per_sample))


def ranks_within(ranks: AbstractSet[int], world_size: int) -> list[int]:
    """`ranks` in [0, world_size), ascending (those outside cut off by bisection)."""
    ordered = sorted(ranks)
    return ordered[bisect.bisect_left(ordered, 0) : bisect.bisect_left(ordered, world_size)]


def _median_without(ordered: Floats, values: Sequence[float]) -> float | None:
    """`statistics.median` of `ordered` (ascending) less one occurrence of each of
    `values` (all in it); None when nothing is left. Equal values take places one after
    the other."""
    left = len(ordered) - len(values)
    if left <= 0:
        return None
    gone = np.sort(np.array(values, dtype=np.float64))
    places = np.searchsorted(ordered, gone) + np.arange(len(gone)) - np.searchsorted(gone, gone)
    kept = np.ones(len(ordered), dtype=bool)
    kept[places] = False
    rest = ordered[kept]
    if left % 2:
        return float(rest[left // 2])
    return (float(rest[left // 2 - 1]) + float(rest[left // 2])) / 2


def _flat(samples_per_s: float) -> StepModel:
    """A rank's per-sample speed as a model without a fixed part (today's assumption)."""
    return StepModel(0.0, 1.0 / samples_per_s)


def _table(view: JobView) -> RankColumns:
    assert view.health is not None
    return view.health.ranks


def _usable(view: JobView) -> range | list[int]:
    """The indices of the health's usable ranks (ok, slow or leader; in the job)."""
    return view.remembered("usable", None, lambda: _usable_indices(view))


def _usable_indices(view: JobView) -> range | list[int]:
    table, world = _table(view), view.spec.world_size
    if view.health_columns.complete:
        return range(len(table))  # every rank, in order, each usable
    rows = zip(table.state, table.rank, strict=True)
    return [i for i, (state, rank) in enumerate(rows) if state in _USABLE and rank < world]


__all__ = [
    "any_unknown",
    "data_per_sample",
    "held_ranks",
    "judged_models",
    "judged_speeds",
    "link_bound",
    "measured_models",
    "measured_speeds",
    "ranks_within",
    "without_link_bound",
]
