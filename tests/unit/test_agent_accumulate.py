"""`accumulate` without a process group (a world of one): the chunks as given, and one
empty chunk for a rank with no samples, so it still runs forward and backward."""

from __future__ import annotations

import torch

from antdt.agent import accumulate


def test_a_world_of_one_yields_the_chunks_as_given() -> None:
    model = torch.nn.Linear(2, 1)
    assert list(accumulate(model, [[0, 1], [2]])) == [[0, 1], [2]]


def test_a_rank_without_samples_gets_one_empty_chunk() -> None:
    model = torch.nn.Linear(2, 1)
    assert list(accumulate(model, [])) == [[]]
