"""The health's fitted step-time models as arrays: the held ranks' own models and the
median model of the others, read at C speed. Pure.

`judged_models` asks for them at every decision; when some rank has no model yet (a
newcomer, a rank restarted), reading them row by row cost ~8 ms at 10,000 ranks. The
medians are `statistics.median`'s to the bit: the middle of the values in ascending
order (equal ones in row order), or the mean of the two middle ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from antdt.schemas import RankColumns
from antdt.services.controller.balance import StepModel, step_models
from antdt.services.controller.splits import Floats

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ModelRows:
    """The rows with a model: rank, fixed part, per-sample part (data wait added)."""

    ranks: Ints
    fixed: Floats
    per_sample: Floats


def model_rows(
    table: RankColumns, rows: range | Sequence[int], data: Mapping[int, float]
) -> ModelRows:
    """The rows `rows` of `table` with a model: `fixed_s` and `per_sample_s` known,
    `per_sample_s` and `samples_per_s` > 0. A rank in `data` (data wait per sample)
    has it added to its per-sample part, as its own time before the barrier."""
    every = rows == range(len(table))
    index: slice | npt.NDArray[np.intp] = slice(None) if every else np.asarray(rows, np.intp)
    fixed = _floats(table.fixed_s)[index]
    per_sample = _floats(table.per_sample_s)[index]
    keep = ~np.isnan(fixed) & (per_sample > 0) & (_floats(table.samples_per_s)[index] > 0)
    ranks = np.asarray(table.rank, dtype=np.int64)[index][keep]
    per_sample = per_sample[keep]
    if data:
        waits = list(map(data.get, ranks.tolist(), repeat(0.0)))
        per_sample = per_sample + np.array(waits, dtype=np.float64)
    return ModelRows(ranks, fixed[keep], per_sample)


def split_models(
    models: ModelRows, held: AbstractSet[int], world_size: int
) -> tuple[dict[int, StepModel], StepModel | None]:
    """The held ranks' models by rank (in row order), and the median model of the
    others (None: no other has one). Every rank of `models` is below `world_size`."""
    marked = np.zeros(world_size, dtype=bool)
    marked[[r for r in held if 0 <= r < world_size]] = True
    mine = marked[models.ranks]
    fixed, per_sample = models.fixed[mine].tolist(), models.per_sample[mine].tolist()
    own = dict(zip(models.ranks[mine].tolist(), step_models(fixed, per_sample), strict=True))
    others = ~mine
    if not others.any():
        return own, None
    typical = StepModel(median(models.fixed[others]), median(models.per_sample[others]))
    return own, typical


def median(values: Floats) -> float:
    """`statistics.median` of `values` (not empty, no NaN), to the bit: the middle ones
    selected, not sorted; a zero among them is read from the stable order, where its
    sign is that of the row it comes from (-0.0 and 0.0 compare equal)."""
    middle = len(values) // 2
    wanted = [middle] if len(values) % 2 else [middle - 1, middle]
    picked = np.partition(values, wanted)[wanted]
    if not picked.all():
        picked = np.sort(values, kind="stable")[wanted]
    if len(picked) == 1:
        return float(picked[0])
    return (float(picked[0]) + float(picked[1])) / 2


def _floats(column: Sequence[float | None]) -> Floats:
    """A health column as float64, None as NaN."""
    return np.array(column, dtype=np.float64)


__all__ = ["ModelRows", "median", "model_rows", "split_models"]
