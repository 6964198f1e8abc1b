"""lb-bsp and antdt-nd from the ranks' step-time models (RankHealth.fixed_s/per_sample_s):
the plan equalising predicted step times within the bounds, table-style (time is a value)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from antdt.schemas import Incident, IncidentState, JobSpec, RankColumns, RankState
from antdt.services.controller.balance import StepModel, balanced_batches, predicted_step_s
from antdt.services.controller.policies import AdjustBatchAction, JobView, LbBspPolicy
from antdt.services.controller.policies.judged import judged_models, measured_speeds
from antdt.services.controller.policies.nd import estimate_restart
from tests.unit.test_policies import JOB, incident, spec, view
from tests.unit.test_policy_nd import nd_view

HEALTHY = StepModel(0.032, 0.001)  # 32 samples' work per step is fixed


def slowed(factor: float, model: StepModel = HEALTHY) -> StepModel:
    """Contention slows both parts alike."""
    return StepModel(model.fixed_s * factor, model.per_sample_s * factor)


def slow_incident(rank: int, host_ranks: tuple[int, ...] | None = None, step: int = 50) -> Incident:
    """Opened at `step`: by default long enough before the view (step 100) for the
    models to hold `fit_steps` steps of the rank at its slow speed."""
    return incident().model_copy(
        update={
            "id": f"{JOB}-r{rank}-slow-1",
            "rank": rank,
            "host_ranks": host_ranks,
            "step": step,
        }
    )


def speed_at(model: StepModel | None, batch: int) -> float | None:
    """Samples/s a rank shows at `batch` (None: it ran no samples)."""
    if model is None:
        return 1000.0
    return batch / model.predict(batch) if batch else None


def model_view(
    models: tuple[StepModel | None, ...],
    batch: tuple[int, ...] | None = None,
    *,
    slow: tuple[int, ...] = (),
    speeds: dict[int, float | None] | None = None,
    incidents: tuple[Incident, ...] | None = None,
    job_spec: JobSpec | None = None,
    **overrides: Any,
) -> JobView:
    """A view whose health rows carry `models` (None: not fitted); each row's speed is
    what its model gives at its batch (1000/s without one), unless `speeds` says."""
    world = len(models)
    job_spec = job_spec or spec(world, 32 * world)
    batch = batch or job_spec.equal_shares()
    measured = {r: speed_at(m, b) for r, (m, b) in enumerate(zip(models, batch, strict=True))}
    measured.update(speeds or {})
    if incidents is None:
        incidents = tuple(slow_incident(r) for r in slow)
    base = view(
        tuple(measured.values()), batch, job_spec=job_spec, incidents=incidents, **overrides
    )
    assert base.health is not None
    rows = tuple(
        row.model_copy(
            update={
                "local_batch": b,
                "fixed_s": None if m is None else m.fixed_s,
                "per_sample_s": None if m is None else m.per_sample_s,
            }
        )
        for row, m, b in zip(base.health.ranks, models, batch, strict=True)
    )
    return JobView(
        spec=base.spec,
        plan=base.plan,
        health=base.health.model_copy(update={"ranks": RankColumns.of_rows(rows)}),
        open_incidents=base.open_incidents,
        memory_caps=base.memory_caps,
        last_action_at=base.last_action_at,
        now=base.now,
    )


def decide(v: JobView) -> list[AdjustBatchAction]:
    assert v.health is not None
    actions = LbBspPolicy().decide(v, v.health)
    assert all(isinstance(a, AdjustBatchAction) for a in actions)
    return [a for a in actions if isinstance(a, AdjustBatchAction)]


def plan_of(v: JobView) -> tuple[int, ...] | None:
    actions = decide(v)
    return actions[0].local_batch if actions else None


# ------------------------------------------------------------------------ the plans

SLOW_HOST = (HEALTHY,) * 4 + (slowed(2.0),) * 4
ONE_SLOW = (HEALTHY,) * 3 + (slowed(1.5),)  # balanced at 69.8 ms: 37.8 x 3 + 14.5 samples


@pytest.mark.parametrize(
    ("case", "kwargs", "expected"),
    [
        (
            "2 ranks, one 2x slower: equal step times (85.3 ms), not 2x fewer samples",
            {"models": (HEALTHY, slowed(2.0)), "slow": (1,)},
            (54, 10),
        ),
        (
            "2 ranks, one 1.5x slower: at most 20% to gain, min_gain holds it",
            {"models": (HEALTHY, slowed(1.5)), "slow": (1,)},
            None,
        ),
        (
            "2 ranks, one 1.5x slower, min_gain 0.1: equal step times (76.8 ms)",
            {
                "models": (HEALTHY, slowed(1.5)),
                "slow": (1,),
                "job_spec": spec(2, 64, policy_params={"min_gain": 0.1}),
            },
            (45, 19),
        ),
        (
            "4 ranks, one 1.5x slower",
            {"models": ONE_SLOW, "slow": (3,)},
            (38, 38, 38, 14),
        ),
        (
            "8 ranks, a slow host of 4 2x slower (one incident per rank): 86 ms each",
            {"models": SLOW_HOST, "slow": (4, 5, 6, 7)},
            (54, 54, 54, 54, 10, 10, 10, 10),
        ),
        (
            "8 ranks, a slow host of 4 (one incident naming the host's ranks)",
            {"models": SLOW_HOST, "incidents": (slow_incident(4, (4, 5, 6, 7)),)},
            (54, 54, 54, 54, 10, 10, 10, 10),
        ),
        (
            "ranks not held slow count as the median of them, their noise aside",
            {"models": (HEALTHY, slowed(1.1), slowed(0.9), slowed(1.5)), "slow": (3,)},
            (38, 38, 38, 14),
        ),
        (
            "a rank not held, no model: the typical model",
            {"models": (HEALTHY, None, HEALTHY, slowed(1.5)), "slow": (3,)},
            (38, 38, 38, 14),
        ),
        (
            "a held rank with no model yet: its per-sample speed (250/s), no fixed part",
            {
                "models": (HEALTHY,) * 3 + (None,),
                "speeds": {3: 250.0},
                "slow": (3,),
            },
            (37, 37, 37, 17),
        ),
        (
            "a rank of unknown speed keeps its batch, the others share the rest",
            {"models": ONE_SLOW, "states": {1: RankState.STALLED}, "slow": (3,)},
            (40, 32, 40, 16),
        ),
        (
            "a memory cap binds: the capped rank is full, the others take the rest",
            {"models": ONE_SLOW, "slow": (3,), "caps": {0: 36}},
            (36, 39, 38, 15),
        ),
        (
            "the smallest batch binds a 3x straggler (its fixed part alone is 96 ms)",
            {
                "models": (HEALTHY,) * 3 + (slowed(3.0),),
                "slow": (3,),
                "job_spec": spec(4, 128, min_local_batch=8, policy_params={"max_change": 10.0}),
            },
            (40, 40, 40, 8),
        ),
        (
            "no model anywhere: today's per-sample plan exactly",
            {"models": (None,) * 4, "speeds": {3: 1000.0 / 3}, "slow": (3,)},
            (39, 38, 38, 13),
        ),
        (
            "a model with no per-sample part is no model",
            {
                "models": (StepModel(0.01, 0.0),) * 4,
                "speeds": {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: 1000.0 / 3},
                "slow": (3,),
            },
            (39, 38, 38, 13),
        ),
    ],
)
def test_plans_from_models(
    case: str, kwargs: dict[str, Any], expected: tuple[int, ...] | None
) -> None:
    v = model_view(**kwargs)
    assert plan_of(v) == expected, case
    assert expected is None or sum(expected) == v.spec.global_batch


def test_the_plan_is_the_balanced_one_and_says_so() -> None:
    [action] = decide(model_view(ONE_SLOW, slow=(3,)))
    assert action.local_batch == balanced_batches(ONE_SLOW, 128, [1] * 4, [128] * 4)
    before = predicted_step_s(ONE_SLOW, (32,) * 4)
    after = predicted_step_s(ONE_SLOW, action.local_batch)
    assert action.reason == (
        "lb-bsp cpu: batches balancing the ranks' step-time models; "
        f"predicted step {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms"
    )


def test_after_a_per_sample_cut_the_models_correct_at_once_per_sample_speeds_chase() -> None:
    """A 2x straggler cut by per-sample speeds to 18 (its fixed part unknown then) runs
    100 ms to the others' 69: its model moves it to the balanced 5 in one move; its
    per-sample speed, which rose as its batch shrank, only to 13 (and then on)."""
    models = (HEALTHY,) * 3 + (slowed(2.0),)
    first_cut = (37, 37, 36, 18)
    balanced = balanced_batches(models, 128, [1] * 4, [128] * 4)
    assert balanced == (41, 41, 41, 5)
    assert plan_of(model_view(models, first_cut, slow=(3,), version=1)) == balanced
    per_sample = {r: speed_at(m, b) for r, (m, b) in enumerate(zip(models, first_cut, strict=True))}
    chase = plan_of(model_view((None,) * 4, first_cut, slow=(3,), version=1, speeds=per_sample))
    assert chase is not None and chase[3] == 13


@pytest.mark.parametrize(
    ("current", "acts"),
    [
        ((37, 37, 37, 17), False),  # gain below min_gain under the models
        ((32, 32, 32, 32), True),
    ],
)
def test_the_gate_uses_the_models_predictions(current: tuple[int, ...], acts: bool) -> None:
    models = (HEALTHY,) * 3 + (slowed(1.4),)  # balanced: (37, 37, 37, 17)
    v = model_view(models, current, slow=(3,), version=1)
    assert (plan_of(v) is not None) is acts


@pytest.mark.parametrize(
    ("overrides", "acts"),
    [
        ({"version": 1, "effective_step": 85}, False),  # 100 < 85 + 16: models behind
        ({"version": 1, "effective_step": 84}, True),
        ({"version": 1, "effective_step": 85, "policy_params": {"fit_steps": 8}}, True),
        ({"version": 1, "effective_step": 85, "caps": {0: 30}}, True),  # a cap is fixed at once
        ({"version": 0, "effective_step": 90}, True),  # the first plan: no switch to wait for
        ({"version": 1, "effective_step": 50, "opened": 85}, False),  # turned slow 15 ago
        ({"version": 1, "effective_step": 50, "opened": 84}, True),
        # past fit_wait_steps (64) the young straggler keeps its batch: nothing to move
        ({"version": 1, "effective_step": 36, "opened": 85}, False),
        ({"opened": 85}, False),
    ],
)
def test_the_models_get_fit_steps_after_a_switch_and_an_onset(
    overrides: dict[str, Any], acts: bool
) -> None:
    params = overrides.pop("policy_params", {})
    opened = overrides.pop("opened", 50)
    v = model_view(
        ONE_SLOW,
        incidents=(slow_incident(3, step=opened),),
        job_spec=spec(policy_params=params),
        **overrides,
    )
    assert (plan_of(v) is not None) is acts


@pytest.mark.parametrize(
    ("step", "slow_for_steps", "state", "acts"),
    [
        (95, 11.0, IncidentState.OPENED, True),  # its history holds 11 + 5 slow steps
        (95, 10.0, IncidentState.OPENED, False),  # 10 + 5 < 16
        (95, 40.0, IncidentState.ESCALATED, True),  # an escalation restarts no history
        (95, 0.0, IncidentState.ESCALATED, False),  # no run known: from the state's step
    ],
)
def test_the_models_hold_the_slow_run_the_monitor_kept(
    step: int, slow_for_steps: float, state: IncidentState, acts: bool
) -> None:
    """The monitor keeps a rank's slow run (`slow_for_steps` steps) in its history when
    it turns slow: the wait counts from the run's start, not from the incident's state."""
    held = slow_incident(3, step=step).model_copy(
        update={"state": state, "evidence": {"slow_for_steps": slow_for_steps}}
    )
    v = model_view(ONE_SLOW, incidents=(held,))
    assert (plan_of(v) is not None) is acts


@pytest.mark.parametrize("effective_step", [37, 36, 20])
def test_young_slow_runs_hold_the_job_fit_wait_steps_then_keep_their_batch(
    effective_step: int,
) -> None:
    """A crowd of stragglers turns slow at different steps: while one's slow run is
    under `fit_steps` old (its model lacks its new speed) the job waits, but only
    `fit_wait_steps` past the plan's effective step (at 10,000 ranks some rank turns slow
    every step or two and the wait never ended); then that one keeps its batch and the
    job is balanced around it."""
    models = (HEALTHY,) * 4 + (slowed(2.0), slowed(2.0))
    old, new = slow_incident(4, step=50), slow_incident(5, step=95)
    new = new.model_copy(update={"id": f"{JOB}-r5-slow-2"})
    at = {"version": 1, "effective_step": effective_step}
    plan = plan_of(model_view(models, incidents=(old, new), **at))
    if effective_step + 64 > 100:
        assert plan is None
        return
    assert plan is not None
    assert plan[5] == 32 and plan[4] < 32  # the new one waits, the old one is relieved
    assert sum(plan) == 6 * 32 and min(plan[:4]) > 32
    settled = new.model_copy(update={"step": 80})
    both = plan_of(model_view(models, incidents=(old, settled), **at))
    assert both is not None and both[5] < 32 and both[4] == both[5]


def test_per_sample_plans_need_no_fit_steps() -> None:
    v = view(version=1, effective_step=90)  # no models: settle_steps alone, as before
    assert v.open_incidents[0].step == 90 and decide(v)


def test_judged_models_read_only_usable_rows_with_a_speed() -> None:
    models = (HEALTHY, slowed(2.0), HEALTHY, HEALTHY)
    v = model_view(models, slow=(1,), states={2: RankState.STALLED})
    judged = judged_models(v, measured_speeds(v), deviating=set())
    assert judged == [HEALTHY, slowed(2.0), None, HEALTHY]
    assert judged_models(model_view((None,) * 4), (1000.0,) * 4, set()) is None


# ------------------------------------------------------------------------- antdt-nd


def test_restart_estimate_from_the_models() -> None:
    """Now: the balanced plan under the models; after: the rank as the typical one."""
    models = (HEALTHY,) * 3 + (slowed(3.0),)
    base = nd_view(remaining=1_280_000)
    v = model_view(models, slow=(3,))
    v = replace(base, health=v.health)
    assert v.health is not None
    estimate = estimate_restart(v, 3, measured_speeds(v))
    assert estimate is not None
    now = balanced_batches(models, 128, [1] * 4, [128] * 4)
    assert estimate.step_now_s == pytest.approx(predicted_step_s(models, now))
    assert estimate.step_after_s == pytest.approx(HEALTHY.predict(32))
    assert estimate.plan_after is None  # equal shares: the plan in force
    assert estimate.steps_left == 10_000


# ----------------------------------------------------------------------- properties


@st.composite
def model_views(draw: st.DrawFn) -> JobView:
    n = draw(st.integers(2, 8))
    min_b = draw(st.integers(0, 4))
    global_batch = draw(st.integers(max(1, n * min_b), n * min_b + 300))
    caps = draw(st.dictionaries(st.integers(0, n - 1), st.integers(1, 300), max_size=n))
    max_change = draw(st.sampled_from([0.1, 0.5, 0.75, 1.0, 10.0]))
    job_spec = spec(
        n, global_batch, min_local_batch=min_b, policy_params={"max_change": max_change}
    )
    part = st.floats(0.0, 0.1) | st.just(0.0)
    models = draw(
        st.lists(
            st.none() | st.builds(StepModel, part, st.floats(1e-5, 1e-2)), min_size=n, max_size=n
        )
    )
    assume(any(m is not None for m in models))
    weights = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    batch = [max(min_b, global_batch * w // sum(weights)) for w in weights]
    batch[0] += global_batch - sum(batch)
    assume(batch[0] >= min_b)
    slow = tuple(draw(st.sets(st.integers(0, n - 1), max_size=n)))
    return model_view(tuple(models), tuple(batch), slow=slow, job_spec=job_spec, caps=caps)


@settings(max_examples=200, deadline=None)
@given(model_views())
def test_model_plans_keep_the_global_batch_bounds_and_bounded_change(v: JobView) -> None:
    actions = decide(v)
    assume(actions)
    [action] = actions
    spec_ = v.spec
    assert sum(action.local_batch) == spec_.global_batch
    old = v.plan.local_batch
    mean = sum(old) / len(old)
    max_change = float(spec_.policy_params["max_change"])
    broke_a_cap = any(b > v.memory_caps.get(r, b) for r, b in enumerate(old))
    for rank, (before, after) in enumerate(zip(old, action.local_batch, strict=True)):
        assert spec_.min_local_batch <= after <= v.memory_caps.get(rank, spec_.global_batch)
        if not broke_a_cap:
            assert abs(after - before) <= max(1, math.floor(max_change * max(before, mean)))


@pytest.mark.parametrize("seed", range(30))
def test_the_median_without_some_values_is_statistics_median(seed: int) -> None:
    """The others' median from the sorted column, the held ranks' values left out (equal
    values among them too): the same float as the median of the list without them."""
    import random
    import statistics

    import numpy as np

    from antdt.services.controller.policies.judged import _median_without

    rng = random.Random(seed)
    values = [rng.choice([0.5, 1.0, 1.5, rng.random()]) for _ in range(rng.randint(1, 60))]
    held = rng.sample(range(len(values)), rng.randint(0, len(values)))
    left = [v for i, v in enumerate(values) if i not in set(held)]
    expected = statistics.median(left) if left else None
    ordered = np.sort(np.array(values))
    assert _median_without(ordered, [values[i] for i in held]) == expected
