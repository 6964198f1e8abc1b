"""antdt-dd: decisions table-style with time as a value; plans keep the global batch, the
bounds and the memory caps whatever the input (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from antdt.services.controller.plans import plan_violations
from antdt.services.controller.policies import AdjustBatchAction, DdPolicy, JobView, load_policy
from antdt.services.controller.policies.dd import DdParams, plan_dd

JOB = "dd1"
NOW = 10_000.0
HETERO = (2000.0, 2000.0, 1000.0, 1000.0)  # two new devices, two old ones


def spec(world: int = 4, global_batch: int = 128, **fields: Any) -> JobSpec:
    return JobSpec(
        job=JOB,
        world_size=world,
        dataset_size=10_000,
        shard_size=100,
        global_batch=global_batch,
        policy="antdt-dd",
        **fields,
    )


def health(speeds: tuple[float | None, ...], *, step: int = 100, version: int = 0) -> JobHealth:
    ranks = tuple(
        RankHealth(
            rank=r,
            host=f"h{r}",
            state=RankState.OK if s else RankState.UNKNOWN,
            last_step=step,
            local_batch=32,
            samples_per_s=s or 0.0,
            compute_s_per_sample=1 / s if s else 0.0,
            ratio=1.0,
            data_wait_share=0.0,
            comm_share=0.1,
        )
        for r, s in enumerate(speeds)
    )
    return JobHealth(
        job=JOB,
        at=NOW - 0.5,
        step=step,
        step_s=0.1,
        samples_per_s=1000.0,
        balance_efficiency=0.6,
        plan_version=version,
        ranks=ranks,
    )


def view(
    speeds: tuple[float | None, ...] = HETERO,
    *,
    batch: tuple[int, ...] | None = None,
    micro: tuple[int, ...] | None = None,
    accumulation: tuple[int, ...] | None = None,
    job_spec: JobSpec | None = None,
    caps: dict[int, int] | None = None,
    version: int = 0,
    created_at: float = 0.0,
    reason: str = "",
    health_version: int | None = None,
    step: int = 100,
    last_action_at: float | None = None,
    now: float = NOW,
) -> JobView:
    job_spec = job_spec or spec(len(speeds))
    plan = Plan(
        job=JOB,
        version=version,
        local_batch=batch or job_spec.equal_shares(),
        micro_batch=micro,
        accumulation=accumulation,
        effective_step=10,
        created_at=created_at,
        reason=reason,
    )
    seen = version if health_version is None else health_version
    return JobView(
        spec=job_spec,
        plan=plan,
        health=health(speeds, step=step, version=seen),
        open_incidents=(),
        memory_caps=caps or {},
        last_action_at=last_action_at,
        now=now,
    )


def hardware_incident() -> Incident:
    return Incident(
        id="i-hw",
        job=JOB,
        rank=2,
        host="h2",
        kind=IncidentKind.SLOW,
        straggler_class=StragglerClass.DETERMINISTIC,
        cause=Cause.COMPUTE,
        state=IncidentState.OPENED,
        step=40,
        opened_at=NOW - 5,
        updated_at=NOW - 5,
        ratio=2.0,
        windows=3,
    )


def decide(v: JobView, event: JobHealth | Incident | None = None) -> list[AdjustBatchAction]:
    assert v.health is not None
    return DdPolicy().decide(v, event or v.health)


AFTER_DD = dict(
    batch=(43, 43, 21, 21),
    micro=(15, 15, 11, 11),
    accumulation=(3, 3, 2, 2),
    version=1,
    caps={0: 16, 1: 16, 2: 16, 3: 16},
)

PROVISIONAL_PLAN = dict(
    batch=(37, 37, 18, 36),
    micro=(10, 10, 9, 12),
    accumulation=(4, 4, 2, 3),
    version=1,
    caps={r: 12 for r in range(4)},
    reason="antdt-dd provisional (no speed yet: ranks 3): ...",
)

# (name, view, expected (local, micro, accumulation) or None for no action)
CASES: list[tuple[str, JobView, tuple[tuple[int, ...], ...] | None]] = [
    (
        "heterogeneous, no caps: proportional, one pass each",
        view(),
        ((43, 43, 21, 21), (43, 43, 21, 21), (1, 1, 1, 1)),
    ),
    (
        "heterogeneous, caps 16: micro-batches within the caps, accumulation",
        view(caps={0: 16, 1: 16, 2: 16, 3: 16}),
        ((43, 43, 21, 21), (15, 15, 11, 11), (3, 3, 2, 2)),
    ),
    (
        "fast device with a small memory still takes its share",
        view(caps={0: 8}),
        ((43, 43, 21, 21), (8, 43, 21, 21), (6, 1, 1, 1)),
    ),
    ("homogeneous, no caps: nothing to gain", view((1000.0,) * 4), None),
    (
        "homogeneous, caps below the equal share: accumulation at once",
        view((1000.0,) * 4, caps={r: 20 for r in range(4)}),
        ((32, 32, 32, 32), (16, 16, 16, 16), (2, 2, 2, 2)),
    ),
    ("a rank without a measured speed: wait", view((2000.0, 2000.0, 1000.0, None)), None),
    ("small heterogeneity (10%): below min_gain", view((1100.0, 1100.0, 1000.0, 1000.0)), None),
    (
        "dd plan running, speeds changed, within replan_s: quiet",
        view((1000.0, 2000.0, 2000.0, 1000.0), **AFTER_DD, created_at=NOW - 60),
        None,
    ),
    (
        "dd plan running, speeds changed, replan_s passed: re-plan",
        view((1000.0, 2000.0, 2000.0, 1000.0), **AFTER_DD, created_at=NOW - 601),
        ((21, 43, 43, 21), (11, 15, 15, 11), (2, 3, 3, 2)),
    ),
    (
        "dd plan running, same speeds, replan_s passed: it is the plan already",
        view(**AFTER_DD, created_at=NOW - 601),
        None,
    ),
    (
        "dd plan running, a smaller cap reported: fixed at once",
        view(**{**AFTER_DD, "caps": {0: 10, 1: 16, 2: 16, 3: 16}}, created_at=NOW - 60),
        ((43, 43, 21, 21), (9, 15, 11, 11), (5, 3, 2, 2)),
    ),
    (
        "a broken cap while a rank has no speed: provisional fix at once",
        view((2000.0, 2000.0, 1000.0, None), caps={r: 12 for r in range(4)}),
        ((37, 37, 18, 36), (10, 10, 9, 12), (4, 4, 2, 3)),  # rank 3 at the median speed
    ),
    (
        "provisional plan running, every speed known: the real plan, within replan_s",
        view(**PROVISIONAL_PLAN, created_at=NOW - 60),
        ((43, 43, 21, 21), (11, 11, 11, 11), (4, 4, 2, 2)),
    ),
    ("cooling down after the last action", view(last_action_at=NOW - 1.0), None),
    ("current plan not measured yet", view(version=1, health_version=0), None),
    ("settling after the plan switch (step < effective 10 + settle 8)", view(step=15), None),
    (
        "caps need more than max_accumulation micro-steps: no plan",
        view(job_spec=spec(policy_params={"max_accumulation": 2}), caps={0: 4, 1: 4, 2: 4, 3: 4}),
        None,
    ),
    (
        "max_local_batch bounds the step share, not the micro-batch",
        view(job_spec=spec(max_local_batch=40), caps={0: 16, 1: 16, 2: 16, 3: 16}),
        ((40, 40, 24, 24), (14, 14, 12, 12), (3, 3, 2, 2)),
    ),
]


@pytest.mark.parametrize(("name", "v", "expected"), CASES, ids=[c[0] for c in CASES])
def test_dd_decisions(name: str, v: JobView, expected: tuple[tuple[int, ...], ...] | None) -> None:
    actions = decide(v)
    if expected is None:
        assert actions == [], name
        return
    (action,) = actions
    assert (action.local_batch, action.micro_batch, action.accumulation) == expected
    assert action.action_id == f"{JOB}-plan-{v.plan.version + 1}"
    assert action.reason.startswith("antdt-dd")
    assert ("provisional" in action.reason) == ("no speed" in name)
    assert plan_violations(v.spec, v.memory_caps, *expected) == ""


def test_incidents_never_trigger_dd_but_health_names_the_hardware_incident() -> None:
    v = view(caps={0: 16, 1: 16, 2: 16, 3: 16})
    v = replace(v, open_incidents=(hardware_incident(),))
    assert decide(v, hardware_incident()) == []
    (action,) = decide(v)
    assert action.incident_id == "i-hw"


def test_one_plan_then_quiet_over_time() -> None:
    """Health ticks every second for an hour on a heterogeneous job: exactly one plan."""
    policy, current = DdPolicy(), view(caps={0: 16, 1: 16, 2: 16, 3: 16})
    plans = []
    for tick in range(3600):
        now = NOW + tick
        tick_health = health(HETERO, step=200 + 10 * tick, version=current.plan.version)
        v = replace(current, now=now, health=tick_health)
        for action in policy.decide(v, tick_health):
            plan = Plan(
                job=JOB,
                version=v.plan.version + 1,
                local_batch=action.local_batch,
                micro_batch=action.micro_batch,
                accumulation=action.accumulation,
                effective_step=tick_health.step + 3,
                created_at=now,
            )
            plans.append(plan)
            current = replace(v, plan=plan, last_action_at=now)
    assert len(plans) == 1 and plans[0].accumulation == (3, 3, 2, 2)


def test_between_plans_no_speed_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """While its own plan is young and within the rules, dd stays quiet before reading
    any speed (at 10,000 ranks reading them is most of a decision); a plan to fix, or
    an old one, reads them."""
    import antdt.services.controller.policies.dd as dd

    read: list[int] = []
    measured = dd.measured_speeds
    monkeypatch.setattr(dd, "measured_speeds", lambda v: read.append(1) or measured(v))
    ours = {"micro": (32,) * 4, "accumulation": (1,) * 4, "reason": "antdt-dd"}
    young = view((3000.0, None, 1000.0, 1000.0), created_at=NOW - 10, **ours)  # type: ignore[arg-type]
    assert decide(young) == [] and read == []
    assert decide(replace(young, now=NOW + 3600)) == [] and read == [1]  # a speed unknown
    broken = view(created_at=NOW - 10, caps={0: 16}, **ours)  # type: ignore[arg-type]
    assert decide(broken) and read == [1, 1]


def test_registered_and_params_checked() -> None:
    assert isinstance(load_policy("antdt-dd"), DdPolicy)
    assert DdParams.from_params({}).rails.max_change == 8.0
    assert DdParams.from_params({"max_change": 0.5}).rails.max_change == 0.5
    for bad in ({"replan_s": -1.0}, {"max_accumulation": 0}, {"max_accumulation": 2.5}):
        with pytest.raises(ValueError):
            DdParams.from_params(bad)


@st.composite
def dd_views(draw: st.DrawFn) -> JobView:
    world = draw(st.integers(1, 8))
    global_batch = draw(st.integers(world, 512))
    min_b = draw(st.integers(0, global_batch // world))
    max_b = draw(st.one_of(st.none(), st.integers(max(min_b, 1), global_batch)))
    speeds = tuple(draw(st.lists(st.floats(1.0, 1e4), min_size=world, max_size=world)))
    caps = draw(st.dictionaries(st.integers(0, world - 1), st.integers(1, 256), max_size=world))
    params = {
        "max_accumulation": draw(st.integers(1, 8)),
        "max_change": draw(st.sampled_from([0.25, 1.0, 8.0])),
    }
    job_spec = JobSpec(
        job=JOB,
        world_size=world,
        dataset_size=10_000,
        shard_size=100,
        global_batch=global_batch,
        policy="antdt-dd",
        min_local_batch=min_b,
        max_local_batch=max_b,
        policy_params=params,
    )
    return view(speeds, job_spec=job_spec, caps=caps)


@settings(max_examples=400, deadline=None)
@given(dd_views())
def test_dd_plans_keep_global_batch_bounds_and_caps(v: JobView) -> None:
    params = DdParams.from_params(v.spec.policy_params)
    plan = plan_dd(v, params)
    if plan is None:
        return
    assert sum(plan.local_batch) == v.spec.global_batch
    assert (
        plan_violations(
            v.spec, v.memory_caps, plan.local_batch, plan.micro_batch, plan.accumulation
        )
        == ""
    )
    assert max(plan.accumulation) <= params.max_accumulation
    for rank, cap in v.memory_caps.items():
        assert plan.micro_batch[rank] <= cap
    Plan(
        job=JOB,
        version=1,
        local_batch=plan.local_batch,
        micro_batch=plan.micro_batch,
        accumulation=plan.accumulation,
        effective_step=0,
        created_at=NOW,
    )
