"""The antdt-nd policy: ADJUST_BS at once, KILL_RESTART when the saving beats the restart
cost (time is a value here; the views are built as the controller shell builds them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from antdt.schemas import (
    Incident,
    IncidentKind,
    IncidentState,
    JobHealth,
    PendingRestart,
    RankState,
    RestartLedger,
    StragglerClass,
)
from antdt.services.controller.guardrails import Guardrails
from antdt.services.controller.plans import proportional_shares
from antdt.services.controller.policies import (
    AdjustBatchAction,
    AntDtNdPolicy,
    JobView,
    KillRestartAction,
    load_policy,
)
from antdt.services.controller.policies.lbbsp import LbBspPolicy
from antdt.services.controller.policies.nd import NdParams, estimate_restart
from antdt.services.controller.view import remaining_samples
from tests.unit.test_policies import JOB, STRAGGLER, health, spec, view

HOSTS = {r: f"h{r}" for r in range(4)}
# 3x straggler of 4 at 128 samples/step: best plan 39 ms/step now, 32 ms after a restart,
# i.e. 7 ms saved per step. Default cost 30 s x ratio 2 needs 8572 steps = 1.097M samples.
LONG, SHORT = 2_000_000, 1_000_000


def persistent(
    rank: int = 3,
    host: str = "h3",
    cls: StragglerClass = StragglerClass.PERSISTENT,
    state: IncidentState = IncidentState.ESCALATED,
) -> Incident:
    return Incident(
        id=f"{JOB}-r{rank}-slow-1",
        job=JOB,
        rank=rank,
        host=host,
        kind=IncidentKind.SLOW,
        straggler_class=cls,
        state=state,
        step=90,
        opened_at=900.0,
        updated_at=950.0,
        ratio=3.0,
        windows=4,
    )


def nd_view(
    *,
    params: dict[str, Any] | None = None,
    incidents: tuple[Incident, ...] | None = None,
    hosts: dict[int, str] | None = None,
    blocklist: frozenset[str] = frozenset(),
    restarts: RestartLedger | None = None,
    remaining: int | None = LONG,
    **overrides: Any,
) -> JobView:
    job_spec = spec(policy_params=params or {}).model_copy(update={"policy": "antdt-nd"})
    base = view(
        job_spec=job_spec,
        incidents=(persistent(),) if incidents is None else incidents,
        **overrides,
    )
    return replace(
        base,
        hosts=HOSTS if hosts is None else hosts,
        blocklist=blocklist,
        restarts=restarts or RestartLedger(),
        remaining_samples=remaining,
    )


def adjusted(**kwargs: Any) -> JobView:
    """The view once lb-bsp's plans for it took effect: batches first, so a restart is
    decided on a job whose batches no plan improves."""
    v = nd_view(**kwargs)
    for version in range(1, 6):  # a move changes a batch by at most max_change
        assert v.health is not None
        planned = LbBspPolicy().decide(v, v.health)
        if not planned:
            return v
        v = nd_view(**{**kwargs, "batch": planned[0].local_batch, "version": version})
        v = replace(v, plan=v.plan.model_copy(update={"created_at": 990.0}))  # after opening
    raise AssertionError(f"lb-bsp still moving after 5 plans: {v.plan.local_batch}")


def decide(v: JobView, event: JobHealth | Incident | None = None) -> list[Any]:
    assert v.health is not None
    return AntDtNdPolicy().decide(v, event or v.health)


def kinds(actions: list[Any]) -> list[str]:
    return ["restart" if isinstance(a, KillRestartAction) else "adjust" for a in actions]


def pending(decided_at: float) -> PendingRestart:
    return PendingRestart(
        action_id=f"{JOB}-restart-1", rank=3, host="h3", checkpoint_step=80, decided_at=decided_at
    )


# ------------------------------------------------------------------------- decisions


def test_registered_as_antdt_nd() -> None:
    policy = load_policy("antdt-nd")
    assert isinstance(policy, AntDtNdPolicy) and policy.name == "antdt-nd"


def test_restart_when_the_saving_beats_the_cost() -> None:
    [action] = decide(nd_view(batch=(39, 38, 38, 13), version=1))  # after ADJUST_BS
    assert isinstance(action, KillRestartAction)
    assert (action.action_id, action.rank, action.host) == (f"{JOB}-restart-1", 3, "h3")
    assert action.incident_id == persistent().id
    assert action.local_batch_after == (32, 32, 32, 32)
    assert action.restart_cost_s == 30.0
    # 15625 steps left x (39 - 32) ms
    assert action.expected_saving_s == pytest.approx(15625 * 0.007, rel=1e-6)
    assert "assumed restart cost 30.0s" in action.reason


@pytest.mark.parametrize(
    ("case", "kwargs", "expected"),
    [
        ("short run: adjust only", {"remaining": SHORT}, ["adjust"]),
        ("unknown length", {"remaining": None}, ["adjust"]),
        (
            "opened, class unknown",
            {"incidents": (persistent(cls=StragglerClass.UNKNOWN),)},
            ["adjust"],
        ),
        ("transient", {"incidents": (persistent(cls=StragglerClass.TRANSIENT),)}, ["adjust"]),
        (
            "deterministic",
            {"incidents": (persistent(cls=StragglerClass.DETERMINISTIC),)},
            ["adjust"],
        ),
        ("no incident", {"incidents": ()}, []),
        ("budget used", {"restarts": RestartLedger(count=2)}, ["adjust"]),
        (
            "budget of 3 left",
            {"restarts": RestartLedger(count=2), "params": {"restart_budget": 3}},
            ["restart"],
        ),
        (
            "restart in flight: nothing at all",
            {"restarts": RestartLedger(count=1, pending=pending(990.0))},
            [],
        ),
        (
            "in-flight restart timed out",
            {"restarts": RestartLedger(count=1, pending=pending(300.0))},
            ["restart"],
        ),
        (
            "restart cooldown",
            {"restarts": RestartLedger(count=1, last_decided_at=970.0)},
            ["adjust"],
        ),
        ("cooldown over", {"restarts": RestartLedger(count=1, last_decided_at=940.0)}, ["restart"]),
        (
            "settling after the restart",
            {"restarts": RestartLedger(count=1, last_decided_at=900.0, last_checkpoint_step=95)},
            [],
        ),
        (
            "settled after the restart",
            {"restarts": RestartLedger(count=1, last_decided_at=900.0, last_checkpoint_step=91)},
            ["restart"],
        ),
        ("measured cost too high", {"restarts": RestartLedger(costs=(60.0, 80.0))}, ["adjust"]),
        (
            "measured cost low: short run pays",
            {"restarts": RestartLedger(costs=(10.0, 20.0)), "remaining": SHORT},
            ["restart"],
        ),
        (
            "lower ratio: short run pays",
            {"params": {"min_saving_ratio": 1.5}, "remaining": SHORT},
            ["restart"],
        ),
        (
            "cheaper default cost",
            {"params": {"restart_cost_s": 5.0}, "remaining": SHORT},
            ["restart"],
        ),
        ("pool exhausted", {"params": {"host_pool": "h0,h1,h2,h3"}}, ["adjust"]),
        ("pool has a spare", {"params": {"host_pool": "h0, h1,h2,h3,h4"}}, ["restart"]),
        (
            "spare blocklisted",
            {"params": {"host_pool": "h0,h1,h2,h3,h4"}, "blocklist": frozenset({"h4"})},
            ["adjust"],
        ),
        ("incident about a host the rank left", {"hosts": {**HOSTS, 3: "h4"}}, ["adjust"]),
        ("straggler stalled: speed unknown", {"states": {3: RankState.STALLED}}, []),
        ("cooling down after any action", {"last_action_at": 999.0}, []),
    ],
)
def test_decision_table(case: str, kwargs: dict[str, Any], expected: list[str]) -> None:
    # Batches first: each case is decided on the job as lb-bsp's plan left it.
    assert kinds(decide(adjusted(**kwargs))) == [k for k in expected if k != "adjust"], case
    # Before it, that plan goes out first wherever the case acts at all.
    assert kinds(decide(nd_view(**kwargs))) == (["adjust"] if expected else []), case


def test_batches_first_then_the_restart_that_pays() -> None:
    [first] = decide(nd_view())
    assert isinstance(first, AdjustBatchAction) and first.local_batch == (39, 38, 38, 13)
    [then] = decide(adjusted())
    assert isinstance(then, KillRestartAction) and then.rank == 3
    # A plan made for this straggler was tried: a further refinement does not hold the
    # restart; a plan older than the incident does.
    v = nd_view(speeds=(1000.0, 1000.0, 1000.0, 250.0), batch=(39, 38, 38, 13), version=1)
    tried = replace(v, plan=v.plan.model_copy(update={"created_at": 950.0}))
    assert kinds(decide(tried)) == ["restart"]
    assert kinds(decide(replace(v, plan=v.plan.model_copy(update={"created_at": 800.0})))) == [
        "adjust"
    ]


def test_no_restart_in_the_last_steps_however_cheap() -> None:
    """A restart that pays on paper over 10 steps left (seen at the end of a CI run of
    transient bursts: "saving 0.3s over 7 steps") is noise: below min_steps_left (16)."""
    cheap = {"restart_cost_s": 0.0}
    ending = nd_view(batch=(39, 38, 38, 13), version=1, params=cheap, remaining=10 * 128)
    assert ending.remaining_steps == 10
    assert not any(isinstance(a, KillRestartAction) for a in decide(ending))
    anyway = nd_view(
        batch=(39, 38, 38, 13), version=1, params={**cheap, "min_steps_left": 0}, remaining=1280
    )
    assert any(isinstance(a, KillRestartAction) for a in decide(anyway))


def test_restart_id_follows_the_history() -> None:
    [action] = decide(adjusted(restarts=RestartLedger(count=1, costs=(12.0,))))
    assert action.action_id == f"{JOB}-restart-2"
    assert "measured restart cost 12.0s" in action.reason


def test_adjust_bs_is_lb_bsp_decision() -> None:
    [action] = decide(nd_view(remaining=SHORT))
    assert isinstance(action, AdjustBatchAction)
    assert action.local_batch == (39, 38, 38, 13)
    assert action.action_id == f"{JOB}-plan-1"
    assert action.reason.startswith("antdt-nd adjust_bs (lb-bsp cpu")


def test_escalation_event_triggers_the_restart() -> None:
    """The incident event itself (not yet in the view) is enough."""
    [action] = decide(nd_view(incidents=()), persistent())
    assert isinstance(action, KillRestartAction)


def test_resolved_event_does_not_restart() -> None:
    event = persistent(state=IncidentState.RESOLVED)
    assert decide(nd_view(incidents=()), event) == []


def test_worst_straggler_first() -> None:
    worse = persistent(rank=2, host="h2").model_copy(update={"ratio": 4.0, "id": "other"})
    speeds = (1000.0, 1000.0, 250.0, 1000.0 / 3)
    [action] = decide(adjusted(speeds=speeds, incidents=(persistent(), worse)))
    assert isinstance(action, KillRestartAction) and action.rank == 2


def test_a_restart_waits_while_a_worse_straggler_is_still_being_classified() -> None:
    # As in a CI run: rank 0, 1.3x slow on a loaded machine, escalated a moment before
    # rank 3, 2.5x slow; the restart went to rank 0 and the cooldown held rank 3's.
    mild = persistent(rank=0, host="h0").model_copy(update={"ratio": 1.3, "id": "mild"})
    worse = persistent(rank=3, cls=StragglerClass.TRANSIENT, state=IncidentState.OPENED)
    worse = worse.model_copy(update={"ratio": 2.5})
    speeds = (1000.0 / 1.3, 1000.0, 1000.0, 400.0)
    cheap = {"restart_cost_s": 1.0}  # restarting rank 0 alone pays too
    assert kinds(decide(nd_view(params=cheap, speeds=speeds, incidents=(worse,)), mild)) == [
        "adjust"
    ]
    # Once rank 3 is found persistent too, it is the one restarted.
    escalated = worse.model_copy(
        update={"straggler_class": StragglerClass.PERSISTENT, "state": IncidentState.ESCALATED}
    )
    [action] = decide(adjusted(params=cheap, speeds=speeds, incidents=(mild,)), escalated)
    assert isinstance(action, KillRestartAction) and action.rank == 3
    # A milder unclassified one, a resolved one, one about a host its rank left, or one
    # of the rank to be restarted itself does not hold the restart.
    for other in (
        worse.model_copy(update={"ratio": 1.2}),
        worse.model_copy(update={"rank": 0, "host": "h0", "id": "own"}),
        worse.model_copy(update={"state": IncidentState.RESOLVED}),
        worse.model_copy(update={"host": "h9"}),
    ):
        [action] = decide(adjusted(params=cheap, speeds=speeds, incidents=(other,)), mild)
        assert isinstance(action, KillRestartAction) and action.rank == 0, other


def test_no_plan_change_after_restart_when_already_equal() -> None:
    v = nd_view(batch=(32, 32, 32, 32), speeds=STRAGGLER)
    estimate = estimate_restart(v, 3, STRAGGLER)
    assert estimate is not None and estimate.plan_after is None


def test_plan_after_restart_takes_ranks_judged_normal_as_equally_fast() -> None:
    # Ranks 0-2 measured 10% apart, but the detector holds none of them deviating: noise.
    # After the restart every rank runs on a healthy host, so the plan is equal shares.
    noisy = (1100.0, 1000.0, 920.0, 330.0)
    [action] = decide(nd_view(speeds=noisy, batch=(42, 38, 35, 13), version=1))
    assert isinstance(action, KillRestartAction)
    assert action.local_batch_after == (32, 32, 32, 32)


def test_plan_after_restart_keeps_a_leader_the_detector_reported() -> None:
    leader = Incident(
        id=f"{JOB}-r0-leader-1",
        job=JOB,
        rank=0,
        host="h0",
        kind=IncidentKind.LEADER,
        straggler_class=StragglerClass.DETERMINISTIC,
        state=IncidentState.OPENED,
        step=90,
        opened_at=900.0,
        updated_at=950.0,
        ratio=0.5,
        windows=4,
    )
    speeds = (2000.0, 1000.0, 1000.0, 330.0)
    [action] = decide(adjusted(speeds=speeds, incidents=(persistent(), leader)))
    assert isinstance(action, KillRestartAction)
    assert action.local_batch_after == (51, 26, 26, 25)


def test_plan_after_restart_respects_memory_caps() -> None:
    [action] = decide(nd_view(caps={0: 30}, batch=(30, 42, 42, 14), version=1))
    assert isinstance(action, KillRestartAction)
    assert action.local_batch_after == (30, 33, 33, 32)


def test_same_view_same_decision() -> None:
    v = nd_view()
    assert decide(v) == decide(v)


@pytest.mark.parametrize(
    "params",
    [
        {"restart_cost_s": -1.0},
        {"min_saving_ratio": -0.5},
        {"min_steps_left": -1},
        {"host_pool": 3},
        {"restart_budget": -1},
        {"restart_timeout_s": 0.0},
        {"restart_cooldown_s": "soon"},
    ],
)
def test_bad_params_are_reported(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        NdParams.from_params(params)


def test_defaults() -> None:
    nd = NdParams.from_params({})
    assert (nd.restart_cost_s, nd.min_saving_ratio, nd.host_pool) == (30.0, 2.0, ())
    assert nd.rails == Guardrails()
    assert (nd.rails.restart_budget, nd.rails.restart_cooldown_s) == (2, 60.0)


def test_remaining_samples_from_spec_and_health() -> None:
    job_spec = spec(global_batch=128)  # 10,000 samples, 1 epoch
    assert remaining_samples(job_spec, None) is None
    assert remaining_samples(job_spec, health(STRAGGLER, step=9)) == 10_000 - 1280
    assert remaining_samples(job_spec, health(STRAGGLER, step=500)) == 0
    v = replace(view(job_spec=job_spec), remaining_samples=129)
    assert v.remaining_steps == 2


# ------------------------------------------------------------------------ properties


@st.composite
def nd_views(draw: st.DrawFn) -> JobView:
    n = draw(st.integers(2, 8))
    min_b = draw(st.integers(0, 4))
    global_batch = draw(st.integers(max(1, n * min_b), n * min_b + 300))
    max_b = draw(st.none() | st.integers(max(1, min_b), 300))
    caps = draw(st.dictionaries(st.integers(0, n - 1), st.integers(1, 300), max_size=n))
    params = {
        "max_change": draw(st.sampled_from([0.1, 0.75, 10.0])),
        "restart_cost_s": draw(st.sampled_from([0.0, 1.0, 30.0])),
        "min_saving_ratio": draw(st.sampled_from([0.0, 1.0, 2.0])),
        "restart_budget": draw(st.sampled_from([0, 2, 3])),
    }
    job_spec = spec(
        n, global_batch, min_local_batch=min_b, max_local_batch=max_b, policy_params=params
    )
    weights = draw(st.lists(st.floats(0.1, 10), min_size=n, max_size=n))
    try:
        batch = proportional_shares(global_batch, weights, min_b, max_b, caps)
    except ValueError:
        assume(False)
    known = st.sampled_from([True, True, True, False])  # a quarter of the speeds unknown
    speeds = [draw(st.floats(1.0, 1e4)) if draw(known) else None for _ in range(n)]
    slow = draw(st.integers(0, n - 1))
    others = [x for r, x in enumerate(speeds) if r != slow and x is not None]
    if others and draw(st.booleans()):  # mostly a real straggler: slower than the others
        speeds[slow] = min(others) / draw(st.floats(1.2, 5.0))
    base = view(
        tuple(speeds),
        batch,
        job_spec=job_spec,
        caps=caps,
        incidents=(persistent(rank=slow, host=f"h{slow}"),),
    )
    return replace(
        base,
        hosts={r: f"h{r}" for r in range(n)},
        restarts=RestartLedger(count=draw(st.integers(0, 2))),
        remaining_samples=draw(st.integers(0, 10**9)),
    )


def _within(v: JobView, plan: tuple[int, ...]) -> None:
    top = v.spec.max_local_batch or v.spec.global_batch
    assert sum(plan) == v.spec.global_batch
    for rank, b in enumerate(plan):
        assert v.spec.min_local_batch <= b <= min(top, v.memory_caps.get(rank, top))


@settings(max_examples=300, deadline=None)
@given(nd_views())
def test_actions_keep_global_batch_bounds_caps_and_budget(v: JobView) -> None:
    actions = decide(v)
    assert len(actions) <= 1
    for action in actions:
        if isinstance(action, AdjustBatchAction):
            _within(v, action.local_batch)
            continue
        assert v.restarts.count < int(v.spec.policy_params["restart_budget"])
        assert 0 <= action.rank < v.spec.world_size and action.host == f"h{action.rank}"
        assert action.expected_saving_s > 0
        ratio = float(v.spec.policy_params["min_saving_ratio"])
        assert action.expected_saving_s >= ratio * action.restart_cost_s
        if action.local_batch_after is not None:
            _within(v, action.local_batch_after)


def test_restart_saving_measured_when_the_straggler_slows_everyones_exchange() -> None:
    # The models see compute only (39 ms -> 32 ms a step); the job measures 200 ms a step
    # now against 50 ms before the onset (a starved rank holds up every allreduce).
    v = nd_view(speeds=STRAGGLER)
    v = replace(v, health=v.health.model_copy(update={"step_s": 0.2}))  # type: ignore[union-attr]
    by_model = estimate_restart(v, 3, STRAGGLER)
    slowed = persistent().model_copy(update={"evidence": {"step_s_before": 0.05}})
    measured = estimate_restart(v, 3, STRAGGLER, slowed)
    assert by_model is not None and measured is not None
    assert (measured.step_now_s, measured.step_after_s) == (0.2, 0.05)
    assert measured.saving_s == pytest.approx(0.15 * measured.steps_left)
    assert measured.plan_after == by_model.plan_after
    # Measured slower than the model says (noise after the batches were re-sized): the
    # model's figures stand.
    calm = persistent().model_copy(update={"evidence": {"step_s_before": 0.199}})
    assert estimate_restart(v, 3, STRAGGLER, calm) == by_model
