"""A DataLoader step's batch cut into its micro-batches: `micro.batch` in `step.claims()`.

A micro-batch of this rank's own ids is its rows of the batch the loader delivered (the
loader's workers read it, in the order of the step's ids); one of another rank's ids,
taken over under work sharing, is read here from the loader's dataset and collated by
its `collate_fn`, in the training thread (the loader's workers read ahead only this
rank's own lots). torch is imported inside the functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from antdt.agent.errors import LoaderError
from antdt.agent.shared_work import MicroBatch


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows [start, stop) of a collated batch: tensors and arrays sliced on their first
    dimension, mappings and tuples (named too) of fields cut field by field, a list cut
    field by field when it holds tensors or containers, else as one value a sample (a
    collated list of strings). Anything else (a scalar the collate kept) stays whole."""
    import torch

    if isinstance(batch, torch.Tensor) or _is_array(batch):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return type(batch)({k: take_rows(v, start, stop) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(take_rows(v, start, stop) for v in batch))
    if isinstance(batch, (tuple, list)):
        if any(_is_field(v) for v in batch):
            return type(batch)(take_rows(v, start, stop) for v in batch)
        return batch[start:stop]
    return batch


def _is_array(value: Any) -> bool:
    return hasattr(value, "__array__") and hasattr(value, "shape") and len(value.shape) > 0


def _is_field(value: Any) -> bool:
    import torch

    return isinstance(value, (torch.Tensor, Mapping, tuple, list)) or _is_array(value)


@dataclass(frozen=True)
class LoadedBatch:
    """A step's batch as its loader delivered it, and how to read other ids the same way
    (`load`: ids -> a collated batch)."""

    batch: Any
    ids: list[int]
    load: Callable[[list[int]], Any]

    def attach(self, micro_batches: Iterator[MicroBatch], rank: int) -> Iterator[MicroBatch]:
        """Each micro-batch with its data: rows of the batch for this rank's own ids,
        read from the dataset for another rank's. Own ones come in the order of the
        step's ids (cut in order, drawn from the front), each from where the last ended;
        another run of rows is looked up, anything else refused."""
        cursor = 0
        for mb in micro_batches:
            if mb.owner != rank:
                yield replace(mb, batch=self.load(mb.ids))
                continue
            n = len(mb.ids)
            start = cursor if self.ids[cursor : cursor + n] == mb.ids else self._row(mb)
            cursor = start + n
            yield replace(mb, batch=take_rows(self.batch, start, cursor))

    def _row(self, mb: MicroBatch) -> int:
        """The first row of `mb`'s ids, when they are a run of the step's rows."""
        try:
            start = self.ids.index(mb.ids[0])
        except ValueError:
            start = -1
        if start < 0 or self.ids[start : start + len(mb.ids)] != mb.ids:
            raise LoaderError(f"micro-batch {mb.index} is not a run of the step's rows")
        return start


def loader_reader(loader: Any) -> Callable[[list[int]], Any]:
    """Read ids as `loader` would: its dataset's samples, collated by its collate_fn."""
    dataset, collate = loader.dataset, loader.collate_fn

    def load(ids: list[int]) -> Any:
        return collate([dataset[i] for i in ids])

    return load


__all__ = ["LoadedBatch", "loader_reader", "take_rows"]
