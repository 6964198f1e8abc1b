"""A DataLoader step's micro-batches carry their data (antdt/agent/loaded.py): rows of the
loaded batch for the rank's own ids, read from the dataset for another rank's."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest

from antdt.agent.errors import LoaderError
from antdt.agent.loaded import LoadedBatch, loader_reader, take_rows
from antdt.agent.shared_work import MicroBatch

torch = pytest.importorskip("torch")

Pair = namedtuple("Pair", "x y")


def test_rows_are_cut_field_by_field_whatever_the_collate_made() -> None:
    x = torch.arange(12).reshape(6, 2)
    assert torch.equal(take_rows(x, 2, 4), x[2:4])
    assert torch.equal(take_rows((x, x[:, 0]), 1, 3)[1], torch.tensor([2, 4]))
    cut = take_rows({"x": x, "names": ["a", "b", "c", "d", "e", "f"]}, 4, 6)
    assert cut["names"] == ["e", "f"] and torch.equal(cut["x"], x[4:6])
    pair = take_rows(Pair(x, [x, x]), 0, 1)
    assert isinstance(pair, Pair) and torch.equal(pair.y[1], x[:1])
    assert take_rows(7, 0, 1) == 7  # a value of the whole batch stays whole


class _Rows(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([float(i)]), i


def _loaded(ids: list[int]) -> LoadedBatch:
    loader = torch.utils.data.DataLoader(_Rows(), batch_sampler=[ids])
    (batch,) = list(loader)
    return LoadedBatch(batch, ids, loader_reader(loader))


def test_own_micro_batches_are_rows_of_the_batch_and_others_are_read_from_the_dataset() -> None:
    ids = [10, 11, 12, 13, 14]
    micro = [
        MicroBatch(owner=0, index=0, ids=[10, 11], weight=0.2),
        MicroBatch(owner=2, index=3, ids=[50, 51, 52], weight=0.3),
        MicroBatch(owner=0, index=1, ids=[12, 13, 14], weight=0.3),
        MicroBatch(owner=0, index=2, ids=[], weight=0.0),
    ]
    got = list(_loaded(ids).attach(iter(micro), rank=0))
    assert [mb.batch[1].tolist() for mb in got] == [[10, 11], [50, 51, 52], [12, 13, 14], []]
    assert [mb.batch[0][:, 0].tolist() for mb in got[:3]] == [[10, 11], [50, 51, 52], [12, 13, 14]]
    assert [(mb.owner, mb.index, mb.weight) for mb in got] == [
        (mb.owner, mb.index, mb.weight) for mb in micro
    ]


def test_own_ids_out_of_the_batch_order_are_refused() -> None:
    bad = MicroBatch(owner=0, index=0, ids=[12, 10], weight=1.0)
    with pytest.raises(LoaderError, match="not a run"):
        list(_loaded([10, 11, 12]).attach(iter([bad]), rank=0))


def test_a_rank_without_data_of_its_own_reads_what_it_takes_over() -> None:
    loader = torch.utils.data.DataLoader(_Rows(), batch_sampler=[[0]])
    empty = LoadedBatch(None, [], loader_reader(loader))  # an epoch's tail: no lot
    (got,) = empty.attach(iter([MicroBatch(owner=1, index=0, ids=[7, 8], weight=0.5)]), rank=0)
    assert got.batch[1].tolist() == [7, 8]


def test_an_own_run_out_of_turn_is_found_by_its_first_id() -> None:
    later = MicroBatch(owner=0, index=1, ids=[12, 13], weight=0.5)
    first = MicroBatch(owner=0, index=0, ids=[10, 11], weight=0.5)
    got = list(_loaded([10, 11, 12, 13]).attach(iter([later, first]), rank=0))
    assert [mb.batch[1].tolist() for mb in got] == [[12, 13], [10, 11]]
