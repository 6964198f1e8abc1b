"""antdt-nd's restart screen (policies/restart_bound.py): it skips only the stragglers
whose full estimate would not pay, so decisions are the same as estimating every one,
and in a large job with many persistent stragglers it skips them without planning."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from antdt.schemas import (
    Cause,
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    JobSpec,
    Plan,
    RankHealth,
    RankState,
    StragglerClass,
)
from antdt.services.controller.balance import StepModel
from antdt.services.controller.policies import JobView, nd
from antdt.services.controller.policies.judged import measured_speeds
from antdt.services.controller.policies.restart_bound import most_samples_under, restart_bound

JOB = "bound"


def _incident(rank: int, ratio: float, before: float | None) -> Incident:
    return Incident(
        id=f"{JOB}-{rank}",
        job=JOB,
        rank=rank,
        host=f"h{rank}",
        kind=IncidentKind.SLOW,
        straggler_class=StragglerClass.PERSISTENT,
        cause=Cause.COMPUTE,
        state=IncidentState.ESCALATED,
        step=50,
        opened_at=10.0,
        updated_at=20.0,
        ratio=ratio,
        windows=4,
        evidence={} if before is None else {"step_s_before": before},
    )


def _view(rng: random.Random, ranks: int, slow_share: float) -> tuple[JobView, JobHealth]:
    """A job at step 200 with a share of its ranks persistently slow, each its model."""
    local = rng.choice([8, 32, 64])
    slow = {r: rng.uniform(1.2, 6.0) for r in range(ranks) if rng.random() < slow_share}
    slow.setdefault(ranks - 1, 3.0)
    fixed = rng.choice([0.0, 0.002, 0.03])
    rows = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=RankState.SLOW if r in slow else RankState.OK,
            last_step=200,
            local_batch=local,
            samples_per_s=1000.0 / slow.get(r, 1.0),
            compute_s_per_sample=1e-3 * slow.get(r, 1.0),
            ratio=slow.get(r, 1.0),
            data_wait_share=0.0,
            comm_share=0.1,
            fixed_s=fixed * slow.get(r, 1.0),
            per_sample_s=1e-3 * slow.get(r, 1.0) * (1 + (r % 5) * 1e-3),
        )
        for r in range(ranks)
    )
    step_s = (fixed + 1e-3 * local) * max(slow.values())
    health = JobHealth(
        job=JOB,
        at=999.0,
        step=200,
        step_s=step_s,
        samples_per_s=local * ranks / step_s,
        balance_efficiency=0.5,
        plan_version=0,
        ranks=rows,
    )
    spec = JobSpec(
        job=JOB,
        world_size=ranks,
        dataset_size=local * ranks * 100_000,
        shard_size=local,
        global_batch=local * ranks,
        policy="antdt-nd",
        min_local_batch=rng.choice([0, 1, 4]),
        max_local_batch=rng.choice([None, 2 * local, 4 * local]),
        policy_params={
            "restart_cost_s": rng.choice([1.0, 30.0, 300.0]),
            "min_saving_ratio": rng.choice([0.0, 2.0]),
        },
    )
    measured = rng.random() < 0.5
    incidents = tuple(
        _incident(r, ratio, step_s / ratio * rng.uniform(0.9, 1.5) if measured else None)
        for r, ratio in sorted(slow.items())
    )
    view = JobView(
        spec=spec,
        plan=Plan(
            job=JOB, version=0, local_batch=spec.equal_shares(), effective_step=0, created_at=0.0
        ),
        health=health,
        open_incidents=incidents,
        memory_caps={},
        last_action_at=None,
        now=1000.0,
        hosts={r: f"h{r}" for r in range(ranks)},
        remaining_samples=local * ranks * rng.choice([20, 2_000, 200_000]),
    )
    return view, health


def _unscreened(view: JobView, health: JobHealth, monkeypatch: pytest.MonkeyPatch) -> object | None:
    with monkeypatch.context() as patched:
        patched.setattr(nd, "_may_pay", lambda *_: True)
        return nd.decide_restart(replace(view), health, _params(view))


def _params(view: JobView) -> nd.NdParams:
    return nd.NdParams.from_params(view.spec.policy_params)


@pytest.mark.parametrize("seed", range(120))
def test_the_screen_decides_as_every_straggler_estimated(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    view, health = _view(rng, rng.choice([4, 9, 40, 300]), rng.choice([0.0, 0.1, 0.5]))
    expected = _unscreened(view, health, monkeypatch)
    assert nd.decide_restart(replace(view), health, _params(view)) == expected


def test_many_persistent_stragglers_are_skipped_without_planning_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,000 ranks, ~300 persistently slow, no measured onset: healing any one cannot
    shorten the balanced step, and no straggler is estimated in full."""
    rng = random.Random(7)
    view, health = _view(rng, 2_000, 0.15)
    view = replace(view, open_incidents=tuple(replace_before(i) for i in view.open_incidents))
    estimated: list[int] = []
    full = nd.estimate_restart

    def counted(v: JobView, rank: int, *rest: Any) -> Any:
        estimated.append(rank)
        return full(v, rank, *rest)

    monkeypatch.setattr(nd, "estimate_restart", counted)
    assert nd.decide_restart(replace(view), health, _params(view)) is None
    assert estimated == []
    bound = restart_bound(replace(view), measured_speeds(view))
    assert bound is not None and bound.deficit > 0


def replace_before(incident: Incident) -> Incident:
    return incident.model_copy(update={"evidence": {}})


@pytest.mark.parametrize(
    ("model", "lower", "upper", "limit", "most"),
    [
        (StepModel(0.002, 0.001), 1, 100, 0.034, 31),  # 32 samples take 34 ms: not under
        (StepModel(0.002, 0.001), 1, 20, 0.034, 20),  # the upper bound
        (StepModel(0.002, 0.001), 0, 100, 0.002, 0),  # 0 samples wait: time 0
        (StepModel(0.002, 0.001), 1, 100, 0.003, None),  # 1 sample takes 3 ms
        (StepModel(0.0, 0.004), 2, 100, 0.0081, 2),
    ],
)
def test_most_samples_under_a_time(
    model: StepModel, lower: int, upper: int, limit: float, most: int | None
) -> None:
    assert most_samples_under(model, lower, upper, limit) == most


@pytest.mark.parametrize("seed", range(10))
def test_every_ranks_most_samples_at_once_as_one_by_one(seed: int) -> None:
    """The screen's arrays give each rank the most samples `most_samples_under` gives
    it (times that fall on a sample's boundary included)."""
    import numpy as np

    from antdt.services.controller.policies.restart_bound import _most_under

    rng = random.Random(seed)
    models = [
        StepModel(rng.choice([0.0, 0.002, 0.03]), rng.choice([0.001, 0.0007, rng.random() / 100]))
        for _ in range(200)
    ]
    caps = [rng.choice([1, 8, 64, 1000]) for _ in models]
    limit = rng.choice([0.034, 0.1, 0.0021, 0.03 + 0.001 * 7])
    most = _most_under(
        np.array([m.fixed_s for m in models]),
        np.array([m.per_sample_s for m in models]),
        np.array(caps),
        limit,
    )
    assert most.tolist() == [
        most_samples_under(m, 0, cap, limit) for m, cap in zip(models, caps, strict=True)
    ]
