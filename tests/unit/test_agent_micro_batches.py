"""antdt-dd's micro-batches on the rank's side: the step's ids in chunks of the plan's
micro-batch, and accumulating their gradients (each loss weighted by its share) equals
one backward pass over the whole local batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from antdt.agent.sampling import Taken
from antdt.agent.steps import Step
from antdt.schemas import Plan


def step_for(plan: Plan, ids: list[int], rank: int = 1) -> Step:
    driver: Any = SimpleNamespace(rank=rank)
    return Step(driver, 0, 0, plan, Taken(ids=ids), total=len(ids))


def plan(**kw: Any) -> Plan:
    return Plan(job="j", version=1, local_batch=(4, 10), effective_step=0, created_at=0.0, **kw)


def test_chunks_follow_the_plans_micro_batch() -> None:
    ids = list(range(10))
    assert step_for(plan(), ids).micro_batches == [ids]
    split = step_for(plan(micro_batch=(4, 4), accumulation=(1, 3)), ids)
    assert split.micro_batch == 4 and split.micro_batches == [ids[:4], ids[4:8], ids[8:]]
    assert step_for(plan(), []).micro_batches == []  # a rank with no data this step


def test_accumulated_micro_batches_equal_one_pass_over_the_batch() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(10, 5, dtype=torch.float64), torch.randint(0, 3, (10,))
    model = torch.nn.Linear(5, 3).double()
    full = torch.nn.functional.cross_entropy(model(x), y)
    full.backward()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    step = step_for(plan(micro_batch=(4, 3), accumulation=(1, 4)), list(range(10)))
    for chunk in step.micro_batches:
        index = torch.tensor(chunk)
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        (loss * (len(chunk) / len(step.sample_ids))).backward()
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        assert got is not None and torch.allclose(got, want, atol=1e-12)
